"""A tiny stand-in for the Workflow DevKit runtime, for end-to-end tests.

It serves ``/.well-known/workflow/v1/flow`` and ``/.well-known/workflow/v1/step``
on 127.0.0.1 and runs one deterministic "order" workflow by replaying the
run's event log on every flow delivery, the way the real runtime does:

    validate (step) -> approval hook -> wait 1 s -> ship (step; its first
    attempt fails with HTTP 500 so the queue retries it) -> run_completed

Every call goes through ``worldcell_client.WorldClient`` over the RPC route,
so the fleet sees exactly the JS client's call sequences.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from worldcell import codec
from worldcell_client import WorldClient, ulid

WORKFLOW = "order"
FLOW_QUEUE = "__wkf_workflow_order"
STEP_QUEUE = "__wkf_step_order"


class OrderRuntime:
    """The app side: receives deliveries and drives runs through the fleet.

    Args:
        fleet_url / secret: where the fleet is.
        shards: the client's ``queueShards`` setting.
    """

    def __init__(self, fleet_url: str, secret: str, shards: int = 2):
        self.world = WorldClient(fleet_url, secret)
        self.shards = shards
        self.deliveries: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()
        runtime = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                record = {
                    "path": self.path,
                    "queue": self.headers.get("x-vqs-queue-name"),
                    "messageId": self.headers.get("x-vqs-message-id"),
                    "attempt": int(self.headers.get("x-vqs-message-attempt") or 0),
                    "body": json.loads(body),
                }
                with runtime.lock:
                    runtime.deliveries.append(record)
                try:
                    status, answer = runtime.handle(record)
                except Exception as exc:  # noqa: BLE001 - reported as a retryable failure
                    with runtime.lock:
                        runtime.errors.append(f"{type(exc).__name__}: {exc}")
                    status, answer = 500, {"error": str(exc)}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "OrderRuntime":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the client side ----------------------------------------------------------------

    def start_order(self, order_id: str) -> str:
        """``start()``: create the run and enqueue its first flow message; returns the run id."""
        run_id = f"wrun_{ulid()}"
        outcome = self.world.apply_event(run_id, {
            "eventType": "run_created",
            "specVersion": 3,
            "eventData": {"deploymentId": "dpl_e2e", "workflowName": WORKFLOW,
                          "input": order_id.encode(), "executionContext": {"orderId": order_id}},
        })
        assert outcome["ok"], outcome
        self.enqueue_flow(run_id)
        return run_id

    def approve(self, token: str, payload: dict) -> None:
        """``resumeHook(token, payload)``: record hook_received and wake the flow."""
        hook = self.world.hook_by_token(token)
        assert hook is not None, f"hook {token} is not published"
        outcome = self.world.apply_event(hook["runId"], {
            "eventType": "hook_received", "correlationId": hook["hookId"],
            "eventData": {"token": token, "payload": json.dumps(payload).encode()},
        })
        assert outcome["ok"], outcome
        self.enqueue_flow(hook["runId"])

    def enqueue_flow(self, run_id: str, delay_seconds: float | None = None) -> None:
        self.world.enqueue(FLOW_QUEUE, {"runId": run_id, "requestedAt": codec.format_iso(codec.from_epoch_ms(int(time.time() * 1000)))},
                           target_base_url=self.url, shards=self.shards, delay_seconds=delay_seconds)

    def enqueue_step(self, run_id: str, step_id: str) -> None:
        self.world.enqueue(STEP_QUEUE, {"workflowName": WORKFLOW, "workflowRunId": run_id, "stepId": step_id},
                           target_base_url=self.url, shards=self.shards, idempotency_key=f"{run_id}/{step_id}")

    # -- the runtime side ---------------------------------------------------------------

    def handle(self, delivery: dict) -> tuple[int, dict]:
        if delivery["path"].endswith("/flow"):
            return self.run_flow(delivery["body"]["runId"])
        return self.run_step(delivery["body"], delivery["attempt"])

    def events(self, run_id: str) -> list[dict]:
        out, cursor = [], None
        while True:
            page = self.world.call("runs", run_id, "listEvents", {"limit": 50, "cursor": cursor})
            out.extend(page["data"])
            if not page["hasMore"]:
                return out
            cursor = page["cursor"]

    def stream_name(self, run_id: str) -> str:
        return f"{run_id}:default"

    def run_flow(self, run_id: str) -> tuple[int, dict]:
        started = self.world.apply_event(run_id, {"eventType": "run_started"})
        if not started["ok"]:
            return 200, {"ok": True}  # terminal run: nothing to do (e.g. a duplicate delivery)
        log = self.events(run_id)
        seen = {(e["eventType"], e.get("correlationId")) for e in log}
        stream = self.stream_name(run_id)

        def has(event_type: str, corr: str) -> bool:
            return (event_type, corr) in seen

        if not has("step_created", "step_validate"):
            self.world.apply_event(run_id, {"eventType": "step_created", "correlationId": "step_validate",
                                            "eventData": {"stepName": "validate", "input": b"\x00\x01"}})
            self.enqueue_step(run_id, "step_validate")
            return 200, {"ok": True}
        if not has("step_completed", "step_validate"):
            return 200, {"ok": True}
        token = f"approve-{run_id}"
        if not has("hook_created", "hook_approval"):
            out = self.world.apply_event(run_id, {"eventType": "hook_created", "correlationId": "hook_approval",
                                                  "eventData": {"token": token, "metadata": {"kind": "approval"}}})
            assert out["ok"] and out["event"]["eventType"] == "hook_created", out
            self.world.write_stream(run_id, stream, f"awaiting approval: POST /approvals/{token}\n")
            return 200, {"ok": True}
        if not has("hook_received", "hook_approval"):
            return 200, {"ok": True}
        if not has("wait_created", "wait_ship"):
            resume_at = codec.from_epoch_ms(int(time.time() * 1000) + 1000)
            self.world.apply_event(run_id, {"eventType": "wait_created", "correlationId": "wait_ship",
                                            "eventData": {"resumeAt": resume_at}})
            self.world.write_stream(run_id, stream, "approved, shipping in 1s\n")
            self.enqueue_flow(run_id, delay_seconds=1)
            return 200, {"ok": True}
        if not has("wait_completed", "wait_ship"):
            wait = next(e for e in log if e["eventType"] == "wait_created")
            remaining_ms = codec.epoch_ms(wait["eventData"]["resumeAt"]) - int(time.time() * 1000)
            if remaining_ms > 0:
                return 503, {"timeoutSeconds": remaining_ms / 1000}
            self.world.apply_event(run_id, {"eventType": "wait_completed", "correlationId": "wait_ship"})
            self.world.apply_event(run_id, {"eventType": "step_created", "correlationId": "step_ship",
                                            "eventData": {"stepName": "ship", "input": b"ship"}})
            self.enqueue_step(run_id, "step_ship")
            return 200, {"ok": True}
        if not has("step_completed", "step_ship"):
            return 200, {"ok": True}
        ship = next(e for e in log if e["eventType"] == "step_completed" and e["correlationId"] == "step_ship")
        self.world.write_stream(run_id, stream, f"shipped as {ship['eventData']['result'].decode()}\n")
        self.world.close_stream(run_id, stream)
        done = self.world.apply_event(run_id, {"eventType": "run_completed",
                                               "eventData": {"output": ship["eventData"]["result"]}})
        if not done["ok"] and done["code"] != "ENTITY_CONFLICT":
            raise AssertionError(done)
        return 200, {"ok": True}

    def run_step(self, body: dict, attempt: int) -> tuple[int, dict]:
        run_id, step_id = body["workflowRunId"], body["stepId"]
        started = self.world.apply_event(run_id, {"eventType": "step_started", "correlationId": step_id,
                                                  "eventData": {"attempt": attempt}})
        if not started["ok"]:
            return 200, {"ok": True}  # already completed: a duplicate delivery
        if step_id == "step_ship" and attempt == 1:
            return 500, {"error": "carrier unavailable", "retryAfter": 2}
        stream = self.stream_name(run_id)
        if step_id == "step_validate":
            self.world.write_stream(run_id, stream, "validating\n")
            result = b"valid"
        else:
            result = f"ship_{run_id[-6:]}".encode()
        out = self.world.apply_event(run_id, {"eventType": "step_completed", "correlationId": step_id,
                                              "eventData": {"result": result}})
        assert out["ok"], out
        self.enqueue_flow(run_id)
        return 200, {"ok": True}
