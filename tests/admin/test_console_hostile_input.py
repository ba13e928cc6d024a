"""Hostile input on the console's URLs answers 404 / an empty result, never an HTML 500, and a
finished run's page stops polling (findings of the console's fresh-user review)."""
from __future__ import annotations

import re

import pytest

from cells.models import Run
from queueing.models import DeadLetter

from .support import RUNS, seed_runs

#: one more than the largest 64-bit primary key: the database driver cannot even bind it
TOO_BIG = str(2**63)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("suffix", [
    "change/", "live/", "cancel/", "rerun/", "wake/", "reenqueue/", "step/?id=a", "event/x/",
    "stream/?name=a", "stream/download/?name=a",
])
def test_a_run_number_beyond_64_bits_is_not_found(admin_client, suffix):
    response = admin_client.get(f"{RUNS}{TOO_BIG}/{suffix}")
    assert response.status_code in (302, 404), (suffix, response.status_code)  # change/: the admin's "not found" redirect


@pytest.mark.parametrize("suffix", ["change/", "redrive-url/"])
def test_a_dead_letter_number_beyond_64_bits_is_not_found(admin_client, suffix):
    response = admin_client.get(f"/admin/queueing/deadletter/{TOO_BIG}/{suffix}")
    assert response.status_code in (302, 404), (suffix, response.status_code)
    assert not DeadLetter.objects.exists()


def test_a_search_term_longer_than_any_id_finds_nothing_and_the_list_still_answers(admin_client):
    seed_runs(3, 1)
    for params in ({"q": "x" * 60_000}, {"q": "wrun_" * 12_000, "_fragment": "results"}):
        response = admin_client.get(RUNS, params)
        assert response.status_code == 200
        assert not re.findall(r'<th class="field-run_id">', response.content.decode())
    assert len(re.findall(r'<th class="field-run_id">', admin_client.get(RUNS, {"q": "wrun_seed"}).content.decode())) == 3


def test_a_jump_prefix_longer_than_any_id_goes_back_to_the_list(admin_client):
    seed_runs(2, 1)
    response = admin_client.get(f"{RUNS}jump/", {"prefix": "Z" * 20_000})
    assert response.status_code == 302 and response["Location"] == RUNS
    one = admin_client.get(f"{RUNS}jump/", {"prefix": "wrun_seed000001"})
    assert one.status_code == 302 and one["Location"].endswith(f"/{Run.objects.get(cell__name='wrun_seed000001').pk}/change/")


def test_a_finished_run_page_does_not_poll_and_a_running_one_does(admin_client):
    running, finished = seed_runs(2, 2)
    Run.objects.filter(pk=finished.pk).update(status="completed")
    live = admin_client.get(f"{RUNS}{running.pk}/change/").content.decode()
    done = admin_client.get(f"{RUNS}{finished.pk}/change/").content.decode()
    assert 'id="wc-run-live" hx-get=' in live and "hx-trigger=\"every" in live
    assert 'id="wc-run-live">' in done and "hx-trigger=\"every" not in done
    assert "no longer refreshes" in done
    fragment = admin_client.get(f"{RUNS}{finished.pk}/live/").content.decode()
    assert "hx-trigger" not in fragment  # the last poll of a run that just finished ends the polling


def test_a_completed_steps_error_is_shown_as_an_earlier_attempts(admin_client):
    from cells.models import Step
    from worldcell import codec

    (run,) = seed_runs(1, 2)
    Step.objects.filter(run_id=run.cell_id, step_id="step_0000").update(error=codec.encode({"message": "upstream timeout"}))
    page = admin_client.get(f"{RUNS}{run.pk}/change/").content.decode()
    assert "earlier attempt: " in page and "upstream timeout" in page
    step = admin_client.get(f"{RUNS}{run.pk}/step/", {"id": "step_0000"}).content.decode()
    assert "error of an earlier attempt" in step.lower()
