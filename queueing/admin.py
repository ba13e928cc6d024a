"""The operator console for queues: a dashboard per queue cell, messages, dead letters (redrive, purge).

* **Queue cells** — the list is the dashboard of every shard (pending, in
  flight, dead letters, next alarm, age of the oldest due message, with
  links into the messages); a cell's page adds the messages due next, the
  claims in flight and the latest dead letters. Counts come from the queue
  service's own ``stats`` (``QueueCell(name).stats()``).
* **Messages** — live messages with attempts, deliveries, last error and
  status, due time, claim deadline and a body preview; read-only.
* **Dead letters** — with queue, pathname, queue name, attempts, last
  error, failed at, body preview. Actions "Redrive" and "Purge" on the
  selection, "Purge all…" behind a confirmation page; each reports what it
  did and why anything was refused, and is recorded in the admin log.
  They need ``queueing.redrive_deadletter`` / ``queueing.purge_deadletter``.

Where each part lives: the dashboard in ``queueing.admin_dashboard``
(``QueueCellAdmin``), the messages and the mixin both row pages share in
``queueing.admin_messages`` (``MessageAdmin``, ``_StoredMessageAdmin``), the
dead letters and their actions in ``queueing.admin_dead_letters``
(``DeadLetterAdmin``, with ``queueing.admin_redrive_url``). This module only
registers them, once, when the admin autodiscovers it.
"""
from __future__ import annotations

from django.contrib import admin

from .admin_dashboard import QueueCellAdmin
from .admin_dead_letters import DeadLetterAdmin
from .admin_messages import MessageAdmin
from .models import DeadLetter, Message, QueueCell

__all__ = ["DeadLetterAdmin", "MessageAdmin", "QueueCellAdmin"]


admin.site.register(QueueCell, QueueCellAdmin)
admin.site.register(Message, MessageAdmin)
admin.site.register(DeadLetter, DeadLetterAdmin)
