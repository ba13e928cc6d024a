"""The console's own AdminSite: installed through ``AdminConfig.default_site``, "View site" leads to the console."""
from __future__ import annotations

import re

from django.contrib import admin

from cells.models import Run
from queueing.models import DeadLetter, Message, QueueCell
from worldcell.admin_site import ConsoleSite


def test_it_is_the_default_admin_site_with_every_console_model():
    assert isinstance(admin.site, ConsoleSite)
    for model in (Run, QueueCell, Message, DeadLetter):
        assert admin.site.is_registered(model)


def test_it_titles_pages_and_links_view_site_to_the_console_index(admin_client):
    page = admin_client.get("/admin/").content.decode()
    assert "worldcell operator console" in page
    assert "Runs, queues and dead letters" in page
    links = re.findall(r'<a href="([^"]*)">View site</a>', page)
    assert links == ["/admin/"]
    assert admin_client.get(links[0]).status_code == 200


def test_it_keeps_the_whole_width_for_tables(admin_client):
    page = admin_client.get("/admin/cells/run/").content.decode()
    assert 'id="nav-sidebar"' not in page
