"""Realistic runs for the console tests and screenshots: steps with retries, sleeps, hooks, streams, failures.

``play_run(seq, advance, run_id, steps=53)`` applies the events a Workflow
DevKit run would record, through ``seq.apply(run_id, eventType, correlationId,
**eventData)`` (``tests.admin.support.ClientSequence`` in-process, or any object
with the same ``apply``), calling ``advance(ms)`` between events to move the
server clock (a ``VirtualClock.advance`` in tests; a no-op against a real
server). Every 7th step fails once and is retried, every 10th step is followed
by a sleep (``wait_created`` / ``wait_completed``), one hook receives two
payloads, and ``outcome`` picks how the run ends.
"""
from __future__ import annotations

from typing import Any, Callable


def play_run(
    seq: Any,
    advance: Callable[[int], Any],
    run_id: str,
    *,
    steps: int = 53,
    workflow: str = "wf-order",
    deployment: str = "dpl_2026_12",
    outcome: str = "completed",
    step_ms: int = 180,
    open_hook: bool = False,
) -> dict[str, Any]:
    """Play one run; returns ``{"retried": [step ids], "waits": [wait ids], "hooks": [hook ids]}``.

    ``outcome``: ``completed`` | ``failed`` (the last step fails for good and the
    run fails with a two-line message) | ``running`` (stops after the steps,
    one sleep still pending).
    """
    seq.create_run(run_id, workflow=workflow, deployment=deployment, input=[{"orderId": run_id[-6:], "items": 3}])
    advance(40)
    seq.start_run(run_id)
    retried, waits, hooks = [], [], []
    hook_id = f"hook_{run_id[-6:]}"
    for n in range(steps):
        sid = f"step_{n:04d}"
        advance(15)
        seq.apply(run_id, "step_created", sid, stepName=f"charge-{n}" if n % 3 == 0 else f"ship-{n}", input=[n])
        advance(5)
        seq.apply(run_id, "step_started", sid)
        if n % 7 == 3:
            advance(step_ms // 2)
            seq.apply(run_id, "step_retrying", sid, error={"message": f"upstream timeout on {sid}"})
            advance(400)
            seq.apply(run_id, "step_started", sid)
            retried.append(sid)
        advance(step_ms + (n * 37) % 300)
        if outcome == "failed" and n == steps - 1:
            seq.apply(run_id, "step_failed", sid, error={"message": "card declined\nat charge (pay.ts:12)"})
            break
        seq.apply(run_id, "step_completed", sid, result={"ok": n, "bytes": bytes(range(n % 9))})
        if n == 1:
            seq.apply(run_id, "hook_created", hook_id, token=f"tok-{run_id}", metadata={"kind": "approval"})
            hooks.append(hook_id)
        if n in (steps // 3, 2 * steps // 3) and hooks:
            seq.apply(run_id, "hook_received", hook_id, payload={"approved": n > steps // 2})
        if n % 10 == 9:
            wid = f"wait_{n:04d}"
            seq.apply(run_id, "wait_created", wid, resumeAt=_iso_after(seq, run_id, 1500))
            waits.append(wid)
            advance(1500)
            seq.apply(run_id, "wait_completed", wid)
    if hooks and not open_hook and outcome != "running":
        seq.apply(run_id, "hook_disposed", hook_id)
    advance(30)
    if outcome == "completed":
        seq.apply(run_id, "run_completed", None, output={"shipped": True, "receipt": b'{"total": 42.5}'})
    elif outcome == "failed":
        seq.apply(run_id, "run_failed", None, error={"message": "card declined\nat charge (pay.ts:12)", "code": "E_CARD"})
    else:
        wid = "wait_final"
        seq.apply(run_id, "wait_created", wid, resumeAt=_iso_after(seq, run_id, 3_600_000))
        waits.append(wid)
    return {"retried": retried, "waits": waits, "hooks": hooks}


def _iso_after(seq: Any, run_id: str, ms: int):
    """A datetime ``ms`` after the server clock's now (a Date on the wire)."""
    from worldcell import clock, codec

    return codec.from_epoch_ms(clock.now_ms() + ms)
