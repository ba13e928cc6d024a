"""The run actions of the console: Re-run, Wake up, Re-enqueue, and bulk Re-run / Cancel (docs/operations.md "Console actions").

``RunActionsMixin`` is mixed into ``cells.admin.RunAdmin``. It only renders
and confirms; the operations are ``cells.operator_actions``. The shape of
every action is the one *Cancel run* set:

* a permission of its own (``cells.rerun_run``, ``cells.wake_run``,
  ``cells.reenqueue_run``; bulk actions use the single ones) — without it
  the button and the list action are not shown and the URL answers 403;
* a confirmation page (GET) that says exactly what will be written and
  sent; nothing happens before its POST (``post=yes``);
* one admin log entry (``LogEntry``, change) per run acted on, with the
  result;
* per-run results (ok / skipped why / failed why): on the result page for
  bulk actions, as messages on the run page for a single run.

Bulk actions run on the runs selected on the list — "select all N" takes
every run matching the list's current filters and search — at most
``BULK_MAX_RUNS`` per request (stated on the confirmation page; more is
refused). The confirmation carries a request key, so submitting it twice
re-runs nothing twice (``RunLink``).

The run page shows the re-run links both ways (``run_links``); an expired
original is linked through ``by-id`` (its tombstone page).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models.functions import Length
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from worldcell.admin_site import format_datetime, format_epoch_ms, status_badge

from . import operator_actions as ops
from . import repair
from .models import Run, RunLink
from .models.tombstone import FlowMessageRecord, RunRepair

__all__ = ["BULK_MAX_RUNS", "RunActionsMixin"]

#: Runs one bulk request may touch (a "select all" over a million runs is refused).
BULK_MAX_RUNS = 500
#: Runs listed by name on a bulk confirmation page (the count is always exact).
CONFIRM_LISTED = 100
#: Re-runs of one run listed on its page.
LINKS_SHOWN = 20


@dataclass(frozen=True)
class _Kind:
    """One run action: its permission codename, words, and what the console shows for it."""

    name: str        # URL segment and key: rerun / wake / reenqueue / cancel
    perm: str        # codename in the cells app
    label: str       # button: "Re-run…"
    verb: str        # "re-run" (titles, log entries)
    done: str        # "Re-ran" (result summary)


KINDS = {
    "rerun": _Kind("rerun", "rerun_run", "Re-run…", "re-run", "Re-ran"),
    "wake": _Kind("wake", "wake_run", "Wake up…", "wake up", "Woke up"),
    "reenqueue": _Kind("reenqueue", "reenqueue_run", "Re-enqueue…", "re-enqueue", "Re-enqueued"),
    "cancel": _Kind("cancel", "cancel_run", "Cancel run…", "cancel", "Cancelled"),
}


def _by_id(run_id: str) -> str:
    """The console link of any run id: its page, or its tombstone's once expired (``RunAdmin.by_id_view``)."""
    return reverse("admin:cells_run_by_id", args=[run_id])


class RunActionsMixin:
    """Re-run, Wake up, Re-enqueue and the bulk actions for ``RunAdmin`` (see the module docstring)."""

    # ------------------------------------------------------------------ permissions

    def _may(self, request, kind: str) -> bool:
        return bool(request.user.is_active and request.user.has_perm(f"cells.{KINDS[kind].perm}"))

    def has_rerun_permission(self, request) -> bool:
        """``cells.rerun_run`` (superusers have it)."""
        return self._may(request, "rerun")

    def has_wake_permission(self, request) -> bool:
        """``cells.wake_run``."""
        return self._may(request, "wake")

    def has_reenqueue_permission(self, request) -> bool:
        """``cells.reenqueue_run``."""
        return self._may(request, "reenqueue")

    # ------------------------------------------------------------------ the run page

    def action_urls(self) -> list:
        """``<pk>/rerun/``, ``<pk>/wake/``, ``<pk>/reenqueue/`` (for ``RunAdmin.get_urls``)."""
        wrap = self.admin_site.admin_view
        return [
            path(f"<int:object_id>/{kind}/", wrap(self._single_view(kind)), name=f"cells_run_{kind}")
            for kind in ("rerun", "wake", "reenqueue")
        ]

    def run_page_actions(self, request, run: Run) -> dict[str, Any]:
        """Context for the run page: the action buttons this user may use on ``run``, and its re-run links."""
        terminal = run.status in ops.TERMINAL
        buttons = []
        if self.has_rerun_permission(request) and terminal:
            buttons.append(("rerun", KINDS["rerun"].label))
        if not terminal:
            if self.has_wake_permission(request) and repair.open_waits(run.pk):
                buttons.append(("wake", KINDS["wake"].label))
            if self.has_reenqueue_permission(request):
                buttons.append(("reenqueue", KINDS["reenqueue"].label))
        return {
            "action_buttons": [
                {"url": reverse(f"admin:cells_run_{kind}", args=[run.pk]), "label": label} for kind, label in buttons
            ],
            **self.run_links(run.cell.name),
        }

    @staticmethod
    def run_links(run_id: str) -> dict[str, Any]:
        """``rerun_of`` (the original's id and link, or None) and ``reruns`` (the newest re-runs of ``run_id``)."""
        source = RunLink.objects.filter(run_id=run_id).first()
        reruns = list(RunLink.objects.filter(source_run_id=run_id).order_by("-created_at", "-pk")[: LINKS_SHOWN + 1])
        return {
            "rerun_of": None if source is None else {
                "run_id": source.source_run_id, "url": _by_id(source.source_run_id),
                "when": format_datetime(source.created_at), "by": source.created_by,
            },
            "reruns": [
                {"run_id": link.run_id, "url": _by_id(link.run_id), "when": format_datetime(link.created_at),
                 "by": link.created_by}
                for link in reruns[:LINKS_SHOWN]
            ],
            "more_reruns": len(reruns) > LINKS_SHOWN,
        }

    def _single_view(self, kind: str) -> Callable:
        def view(request, object_id: int):
            return self.single_action_view(request, object_id, kind)

        view.__name__ = f"{kind}_view"
        return view

    def single_action_view(self, request, object_id: int, kind: str):
        """``<pk>/<kind>/``: GET asks for confirmation, POST (``post=yes``) acts, then back to a run page."""
        if not self._may(request, kind):
            raise PermissionDenied
        run = self._run_or_404(request, object_id)
        if request.method == "POST" and request.POST.get("post") == "yes":
            key = request.POST.get("request_key") or ""
            if kind == "rerun" and not _valid_key(key):
                raise PermissionDenied("the confirmation form is incomplete")
            result = self._perform(request, kind, [run], key)[0]
            self.message_user(request, f"Run {run.cell.name}: {result.message}", _LEVEL[result.outcome])
            if result.index_error:
                self.message_user(request, f"the index update after it failed: {result.index_error}", messages.WARNING)
            target = run.pk
            if result.new_run_id and result.ok:
                target = Run.objects.filter(cell__name=result.new_run_id).values_list("pk", flat=True).first() or run.pk
            return HttpResponseRedirect(reverse("admin:cells_run_change", args=[target]))
        return self._confirmation(request, kind, [run], single=True)

    # ------------------------------------------------------------------ bulk (list actions)

    def bulk_selection(self, request, queryset, kind: str, cap: int | None = None) -> list[Run] | None:
        """The selected runs (newest first), or None after a refusal message when more than the cap are selected."""
        cap = BULK_MAX_RUNS if cap is None else cap
        runs = list(queryset.select_related("cell").order_by("-created_at", "-pk")[: cap + 1])
        if len(runs) > cap:
            self.message_user(
                request,
                f"Refused: more than {cap} runs selected (at most {cap} per request). Narrow the list with filters first.",
                messages.ERROR,
            )
            return None
        return runs

    def bulk_action(self, request, queryset, kind: str):
        """A list action: the confirmation page (with the count and the cap), then the result page."""
        runs = self.bulk_selection(request, queryset, kind)
        if runs is None:
            return None
        if request.POST.get("post") != "yes":
            return self._confirmation(request, kind, runs, single=False)
        key = request.POST.get("request_key") or ""
        if kind == "rerun" and not _valid_key(key):
            raise PermissionDenied("the confirmation form is incomplete")
        results = self._perform(request, kind, runs, key)
        return self.results_page(request, kind, runs, results)

    def rerun_selected_runs(self, request, queryset):
        """List action "Re-run selected runs…" (``cells.rerun_run``)."""
        return self.bulk_action(request, queryset, "rerun")

    rerun_selected_runs.allowed_permissions = ("rerun",)
    rerun_selected_runs.short_description = "Re-run selected runs…"

    # ------------------------------------------------------------------ acting, logging

    def _perform(self, request, kind: str, runs: list[Run], key: str) -> list[ops.ActionResult]:
        """Run the action on each run (``operator_actions``) and write one admin log entry per run."""
        user = request.user.get_username()
        action: Callable[[str], ops.ActionResult] = {
            "rerun": lambda run_id: ops.rerun_run(run_id, request_key=key, user=user),
            "wake": ops.wake_run,
            "reenqueue": ops.reenqueue_run,
            "cancel": ops.cancel,
        }[kind]
        results = ops.run_many(action, [r.cell.name for r in runs])
        log_run_actions(request, [(run, f"{KINDS[kind].verb.capitalize()}: {r.outcome}: {r.message}"
                                   + (f"; index update failed: {r.index_error}" if r.index_error else ""))
                                  for run, r in zip(runs, results)])
        return results

    # ------------------------------------------------------------------ pages

    def _confirmation(self, request, kind: str, runs: list[Run], *, single: bool):
        spec = KINDS[kind]
        one = runs[0] if len(runs) == 1 else None
        rows = [{"run": r, "url": reverse("admin:cells_run_change", args=[r.pk]), "status": status_badge(r.status),
                 "note": _predict(kind, r)} for r in runs[:CONFIRM_LISTED]]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": (f"{spec.verb.capitalize()} run {one.cell.name}?" if single and one
                      else f"{spec.verb.capitalize()} {len(runs)} run{'s' if len(runs) != 1 else ''}?"),
            "subtitle": None,
            "kind": kind,
            "spec": spec,
            "single": single,
            "rows": rows,
            "count": len(runs),
            "unlisted": max(0, len(runs) - CONFIRM_LISTED),
            "cap": BULK_MAX_RUNS,
            "filters": [(k, v) for k, vs in request.GET.lists() for v in vs] if not single else [],
            "detail": _detail(kind, one) if one is not None else None,
            "request_key": ops.new_request_key(),
            "pks": [r.pk for r in runs],
            "action_name": f"{kind}_selected_runs",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "back_url": (reverse("admin:cells_run_change", args=[one.pk]) if single and one
                         else reverse("admin:cells_run_changelist") + (f"?{request.GET.urlencode()}" if request.GET else "")),
        }
        return TemplateResponse(request, "admin/cells/actions/confirm.html", context)

    def results_page(self, request, kind: str, runs: list[Run], results: list[ops.ActionResult]):
        """The per-run results of a bulk action (ok / skipped why / failed why), with links to new runs."""
        spec = KINDS[kind]
        counts = {o: sum(r.outcome == o for r in results) for o in ("ok", "skipped", "failed")}
        new_pks = dict(Run.objects.filter(cell__name__in=[r.new_run_id for r in results if r.new_run_id])
                       .values_list("cell__name", "pk"))
        rows = [
            {"run": run, "url": reverse("admin:cells_run_change", args=[run.pk]), "result": result,
             "new_url": (reverse("admin:cells_run_change", args=[new_pks[result.new_run_id]])
                         if result.new_run_id in new_pks else None)}
            for run, result in zip(runs, results)
        ]
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"{spec.verb.capitalize()}: results for {len(results)} run{'s' if len(results) != 1 else ''}",
            "subtitle": None,
            "spec": spec,
            "rows": rows,
            "counts": counts,
            "back_url": reverse("admin:cells_run_changelist") + (f"?{request.GET.urlencode()}" if request.GET else ""),
        }
        return TemplateResponse(request, "admin/cells/actions/results.html", context)


_LEVEL = {"ok": messages.SUCCESS, "skipped": messages.WARNING, "failed": messages.ERROR}


def _valid_key(key: str) -> bool:
    """A request key as ``operator_actions.new_request_key`` makes them (26 Crockford base32 characters)."""
    return len(key) == 26 and all(c in "0123456789ABCDEFGHJKMNPQRSTVWXYZ" for c in key)


def log_run_actions(request, entries: list[tuple[Run, str]]) -> None:
    """One admin log entry (change) per ``(run, text)``: the console's record of every run action."""
    content_type = ContentType.objects.get_for_model(Run)
    LogEntry.objects.bulk_create([
        LogEntry(user_id=request.user.pk, content_type=content_type, object_id=str(run.pk),
                 object_repr=f"run {run.cell.name}"[:200], action_flag=CHANGE, change_message=text[:10_000])
        for run, text in entries
    ])


def _predict(kind: str, run: Run) -> str:
    """What the action will (not) do to ``run``, as far as the list shows it (the action re-checks)."""
    terminal = run.status in ops.TERMINAL
    if kind == "rerun" and not terminal:
        return f"still {run.status}: will be skipped"
    if kind in ("wake", "reenqueue", "cancel") and terminal:
        return f"already {run.status}: will be skipped"
    return ""


def _detail(kind: str, run: Run) -> dict[str, Any]:
    """What exactly the single-run confirmation page spells out for ``run``."""
    from queueing.models import Message
    from queueing.runref import FLOW_QUEUE_PREFIX

    run_id = run.cell.name
    record = FlowMessageRecord.objects.filter(run_id=run_id).first()
    detail: dict[str, Any] = {
        "record": record,
        "queue_name": FLOW_QUEUE_PREFIX + run.workflow_name,
        "spec": ops._number(run.spec_version),
        "queued": Message.objects.filter(run_id=run_id).count(),
        "sequence": run.cell.event_sequence,
    }
    if kind == "rerun":
        # the input's size, never the input itself (it may be megabytes); the context is small
        size, run.execution_context = Run.objects.filter(pk=run.pk).annotate(n=Length("input")).values_list(
            "n", "execution_context").get()
        why, _ = ops._rerun_plan(run, record)
        detail.update(refusal=why, input_size=size)
    elif kind == "wake":
        waits = repair.open_waits(run.pk)
        detail.update(
            waits=[{"id": corr, "resume_at": format_datetime(at) if hasattr(at, "tzinfo") else "—"}
                   for corr, at in waits.items()],
            key=repair.repair_key(run_id, run.cell.event_sequence + len(waits)),
        )
    elif kind == "reenqueue":
        since = repair.stuck_since(run_id)
        detail.update(
            key=repair.repair_key(run_id, run.cell.event_sequence),
            stuck=format_epoch_ms(since) if since else None,
            done=RunRepair.objects.filter(run_id=run_id, event_sequence=run.cell.event_sequence)
            .values_list("message_id", flat=True).first(),
            last_event=format_datetime(run.updated_at),
        )
    return detail
