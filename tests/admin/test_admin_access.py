"""Who may see and do what in the operator console.

Staff login is required for everything under ``/admin/``; any active staff
user may look; cancel, redrive and purge need ``cells.cancel_run``,
``queueing.redrive_deadletter`` and ``queueing.purge_deadletter``; every
form is CSRF-protected.
"""
from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client

from cells.models import Run
from queueing.models import DeadLetter, QueueCell

from .support import RUNS, ClientSequence

pytestmark = pytest.mark.django_db

DEAD = "/admin/queueing/deadletter/"


@pytest.fixture
def run_pk(rpc, frozen_clock) -> int:
    seq = ClientSequence(rpc)
    seq.create_run("wrun_acl")
    seq.apply("wrun_acl", "step_created", "step_1", stepName="s")
    return Run.objects.get(cell__name="wrun_acl").pk


@pytest.fixture
def dead_pk(db) -> int:
    cell = QueueCell.objects.create(name="q:0", queue_shards=1, pinned_at=1)
    dead = DeadLetter.objects.create(
        cell=cell, dlq_key="dlq:0000000000005:msg_acl", message_id="msg_acl", queue_name="__wkf_step_x",
        pathname="step", body='"{}"', target_base_url="http://app", attempt=5, enqueued_at=1,
        last_error="HTTP 500", failed_at=5,
    )
    return dead.pk


def admin_urls(run_pk: int, dead_pk: int) -> list[str]:
    return [
        "/admin/",
        RUNS,
        f"{RUNS}{run_pk}/change/",
        f"{RUNS}{run_pk}/step/?id=step_1",
        f"{RUNS}{run_pk}/event/wevt_z00000000000000000001/",
        f"{RUNS}{run_pk}/cancel/",
        f"{RUNS}by-id/wrun_acl/",
        "/admin/queueing/queuecell/",
        "/admin/queueing/message/",
        DEAD,
        f"{DEAD}{dead_pk}/change/",
        f"{DEAD}purge-all/",
    ]


def test_it_sends_anonymous_visitors_to_the_login_page_from_every_console_page(client, run_pk, dead_pk):
    for url in admin_urls(run_pk, dead_pk):
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith("/admin/login/"), url
    for url in (f"{RUNS}{run_pk}/cancel/", f"{DEAD}{dead_pk}/redrive/", f"{DEAD}purge-all/", RUNS):
        response = client.post(url, {"post": "yes", "action": "cancel_selected_runs", "_selected_action": [run_pk]})
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), url
    assert Run.objects.get(pk=run_pk).status == "pending"
    assert DeadLetter.objects.filter(pk=dead_pk).exists()


def test_it_keeps_out_logged_in_users_who_are_not_staff(run_pk, dead_pk):
    user = User.objects.create_user("visitor", password="pw")
    client = Client()
    client.force_login(user)
    for url in admin_urls(run_pk, dead_pk):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/"), url


def test_it_lets_any_staff_user_view_every_page(make_operator, run_pk, dead_pk):
    viewer = make_operator()
    for url in admin_urls(run_pk, dead_pk):
        if url.endswith(("/cancel/", "/purge-all/")):
            continue
        response = viewer.get(url, follow=True)
        assert response.status_code == 200, url
    home = viewer.get("/admin/").content.decode()
    assert "Runs" in home and "Dead letters" in home and "Queue cells" in home


def test_it_shows_a_view_only_staff_user_no_actions_or_buttons(make_operator, run_pk, dead_pk):
    viewer = make_operator()
    runs = viewer.get(RUNS).content.decode()
    assert "cancel_selected_runs" not in runs and 'name="action"' not in runs
    assert "Cancel run" not in viewer.get(f"{RUNS}{run_pk}/change/").content.decode()
    dead_list = viewer.get(DEAD).content.decode()
    assert "redrive_selected" not in dead_list and "Purge all" not in dead_list
    dead_page = viewer.get(f"{DEAD}{dead_pk}/change/").content.decode()
    assert 'value="Redrive"' not in dead_page and 'value="Purge"' not in dead_page


def test_it_refuses_cancel_redrive_and_purge_to_a_view_only_staff_user(make_operator, run_pk, dead_pk):
    viewer = make_operator()
    assert viewer.get(f"{RUNS}{run_pk}/cancel/").status_code == 403
    assert viewer.post(f"{RUNS}{run_pk}/cancel/", {"post": "yes"}).status_code == 403
    assert viewer.post(f"{DEAD}{dead_pk}/redrive/").status_code == 403
    assert viewer.post(f"{DEAD}{dead_pk}/purge/").status_code == 403
    assert viewer.get(f"{DEAD}purge-all/").status_code == 403
    assert viewer.post(f"{DEAD}purge-all/", {"post": "yes"}).status_code == 403
    # posting the actions by hand: the admin does not know them for this user
    viewer.post(RUNS, {"action": "cancel_selected_runs", "_selected_action": [run_pk], "post": "yes"})
    viewer.post(DEAD, {"action": "purge_selected", "_selected_action": [dead_pk]})
    viewer.post(DEAD, {"action": "redrive_selected", "_selected_action": [dead_pk]})
    assert Run.objects.get(pk=run_pk).status == "pending"
    assert DeadLetter.objects.filter(pk=dead_pk).exists()


def test_it_allows_each_action_with_its_own_permission_only(make_operator, run_pk, dead_pk, settings):
    settings.WORLDCELL_USE_CELERY = False
    canceller = make_operator("cells.cancel_run")
    assert canceller.post(f"{DEAD}{dead_pk}/purge/").status_code == 403
    assert canceller.post(f"{RUNS}{run_pk}/cancel/", {"post": "yes"}).status_code == 302
    assert Run.objects.get(pk=run_pk).status == "cancelled"

    redriver = make_operator("queueing.redrive_deadletter")
    assert redriver.post(f"{DEAD}{dead_pk}/purge/").status_code == 403
    assert "redrive_selected" in redriver.get(DEAD).content.decode()
    assert "purge_selected" not in redriver.get(DEAD).content.decode()

    purger = make_operator("queueing.purge_deadletter")
    assert purger.post(f"{DEAD}{dead_pk}/redrive/").status_code == 403
    assert purger.post(f"{DEAD}{dead_pk}/purge/").status_code == 302
    assert not DeadLetter.objects.filter(pk=dead_pk).exists()


def test_it_rejects_actions_posted_without_a_csrf_token(make_operator, run_pk, dead_pk):
    operator = make_operator("cells.cancel_run", "queueing.purge_deadletter", "queueing.redrive_deadletter")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator.user)
    assert strict.post(f"{RUNS}{run_pk}/cancel/", {"post": "yes"}).status_code == 403
    assert strict.post(f"{DEAD}purge-all/", {"post": "yes"}).status_code == 403
    assert strict.post(f"{DEAD}{dead_pk}/redrive/").status_code == 403
    assert strict.post(RUNS, {"action": "cancel_selected_runs", "_selected_action": [run_pk], "post": "yes"}).status_code == 403
    assert Run.objects.get(pk=run_pk).status == "pending"
    assert DeadLetter.objects.filter(pk=dead_pk).exists()
    # with the token from the confirmation page, the same request goes through
    page = strict.get(f"{RUNS}{run_pk}/cancel/")
    token = page.context["csrf_token"]
    response = strict.post(f"{RUNS}{run_pk}/cancel/", {"post": "yes", "csrfmiddlewaretoken": str(token)})
    assert response.status_code == 302
    assert Run.objects.get(pk=run_pk).status == "cancelled"
