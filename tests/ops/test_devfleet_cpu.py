"""``manage.py devfleet`` pins itself to one core (``--cpu``; docs/operations.md "One core per process")."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e.fleet_processes import PY, ROOT, base_env, dev_fleet
from tests.ops.support import fresh_database
from worldcell.affinity import AffinityError, choose_cpu

pytestmark = [pytest.mark.any_database, pytest.mark.slow]  # slow: starts fleet processes

ALLOWED = set(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(ALLOWED) < 2, reason="this machine lets the tests run on one core only")


def _thread_masks(pid: int) -> set[str]:
    """``Cpus_allowed_list`` of every thread of ``pid`` (e.g. ``{"1"}``)."""
    masks = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except FileNotFoundError:  # that thread has just ended
            continue
        masks.update(line.split(":", 1)[1].strip() for line in status.splitlines() if line.startswith("Cpus_allowed_list:"))
    return masks


def _own_mask() -> str:
    """This test process's ``Cpus_allowed_list``, which a child it starts inherits."""
    return _thread_masks(os.getpid()).pop()


def test_choose_cpu_reads_auto_all_and_a_core_number():
    assert choose_cpu("auto", {0, 1}) == 1
    assert choose_cpu("auto", {2, 5, 7}) == 7
    assert choose_cpu("auto", {3}) is None  # nothing to gain on a single allowed core
    assert choose_cpu("ALL", {0, 1}) is None
    assert choose_cpu(" 0 ", {0, 1}) == 0
    with pytest.raises(AffinityError, match=r"may run on cores \[0, 1\] only"):
        choose_cpu("4", {0, 1})
    with pytest.raises(AffinityError, match="expected auto, all or a core number"):
        choose_cpu("-1", {0, 1})
    with pytest.raises(AffinityError, match="expected auto, all or a core number"):
        choose_cpu("one", {0, 1})


@needs_two_cores
def test_devfleet_runs_every_thread_on_one_core_by_default(tmp_path):
    with fresh_database(tmp_path) as db_url:
        with dev_fleet(db_url, tmp_path, tmp_path / "devfleet.log") as (url, secret, proc):
            # load it a little, so the HTTP and delivery threads exist
            for _ in range(20):
                assert httpx.get(f"{url}/v1/health", timeout=10).status_code == 200
            masks = _thread_masks(proc.pid)
            threads = len(os.listdir(f"/proc/{proc.pid}/task"))
    assert threads > 8, threads  # waitress's and the pump's threads were counted
    assert masks == {str(max(ALLOWED))}, masks
    assert f"cpu: core {max(ALLOWED)}" in (tmp_path / "devfleet.log").read_text()


@needs_two_cores
def test_devfleet_cpu_all_leaves_the_process_free(tmp_path):
    with fresh_database(tmp_path) as db_url:
        with dev_fleet(db_url, tmp_path, tmp_path / "devfleet.log", args=("--cpu", "all")) as (url, _, proc):
            masks = _thread_masks(proc.pid)
    assert masks == {_own_mask()}, masks
    assert "cpu: not pinned" in (tmp_path / "devfleet.log").read_text()


def test_devfleet_refuses_a_core_it_may_not_use(tmp_path):
    env = base_env(f"sqlite:///{tmp_path / 'fleet.sqlite3'}", "s", tmp_path)
    proc = subprocess.run([PY, "manage.py", "devfleet", "--port", "0", "--cpu", str(max(ALLOWED) + 64)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"may run on cores {sorted(ALLOWED)} only" in proc.stderr
    assert not (tmp_path / "fleet.sqlite3").exists() or (tmp_path / "fleet.sqlite3").stat().st_size == 0


@needs_two_cores
def test_a_refused_pin_partway_puts_the_threads_already_pinned_back():
    """The kernel refusing the second thread: the first one gets its old mask back, and the error is raised."""
    code = f"""
import os, threading
from worldcell import affinity
stop = threading.Event()
t = threading.Thread(target=stop.wait); t.start()
before = os.sched_getaffinity(0)
real, calls = os.sched_setaffinity, []
def refuse_second(tid, mask):
    calls.append(tid)
    if len(calls) == 2:
        raise PermissionError("refused")
    return real(tid, mask)
os.sched_setaffinity = refuse_second
try:
    affinity.pin_process({min(ALLOWED)})
except PermissionError:
    print("raised")
os.sched_setaffinity = real
print(sorted(os.sched_getaffinity(calls[0])) == sorted(before), len(calls) >= 2)
stop.set(); t.join()
"""
    out = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == ["raised", "True", "True"], out
