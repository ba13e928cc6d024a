"""Registers the queue cell service with ``worldcell.dispatch`` (docs/protocol.md §2.5, §4.4)."""
from worldcell.dispatch import register_binding

from .service import QueueCell

register_binding(
    "queue",
    QueueCell,
    {
        "enqueue": "enqueue",
        "stats": "stats",
        "listDeadLetters": "list_dead_letters",
        "redriveDeadLetter": "redrive_dead_letter",
        "purgeDeadLetters": "purge_dead_letters",
        "rearmAlarm": "rearm_alarm",
    },
)
