"""The console's "Redrive to another URL…" for one dead letter (docs/operations.md "Console actions").

``RedriveEditedUrlMixin`` is mixed into ``queueing.admin_dead_letters.DeadLetterAdmin``.
It needs ``queueing.redrive_edited_url`` (without it the button is not shown
and the URL answers 403). Three steps, nothing written before the last:

1. GET ``<pk>/redrive-url/`` — a form with the message's current target base URL;
2. POST the new URL — checked (``queueing.operations.check_target_url``:
   absolute ``http``/``https`` with a host); a bad one is shown again with
   the reason; a good one gives the confirmation page, old → new;
3. POST ``post=yes`` — checked again, then the queue machine's redrive with
   the new target (``queueing.operations.redrive_to_url``); the admin log
   entry names both URLs.
"""
from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from worldcell.admin_site import row_pk_or_404

from .models import DeadLetter
from .operations import check_target_url, redrive_to_url

__all__ = ["RedriveEditedUrlMixin"]


class RedriveEditedUrlMixin:
    """Redrive one dead letter to an edited target URL (see the module docstring)."""

    def has_redrive_edited_url_permission(self, request) -> bool:
        """``queueing.redrive_edited_url`` (superusers have it)."""
        return bool(request.user.is_active and request.user.has_perm("queueing.redrive_edited_url"))

    def redrive_url_urls(self) -> list:
        """``<pk>/redrive-url/`` (for ``DeadLetterAdmin.get_urls``)."""
        return [path("<int:object_id>/redrive-url/", self.admin_site.admin_view(self.redrive_url_view),
                     name="queueing_deadletter_redrive_url")]

    def redrive_url_view(self, request, object_id: int):
        """The form (GET), the confirmation old → new (POST ``target``), the redrive (POST ``post=yes``)."""
        if not self.has_redrive_edited_url_permission(request):
            raise PermissionDenied
        dead = get_object_or_404(DeadLetter.objects.select_related("cell"), pk=row_pk_or_404(object_id))
        page = reverse("admin:queueing_deadletter_change", args=[dead.pk])
        entered = request.POST.get("target", dead.target_base_url) if request.method == "POST" else dead.target_base_url
        url, why = (check_target_url(entered) if request.method == "POST" else (None, ""))
        if url is not None and url == dead.target_base_url:
            url, why = None, "that is its current target; use Redrive for that"
        if request.method == "POST" and request.POST.get("post") == "yes" and url is not None:
            old = dead.target_base_url
            result = redrive_to_url(dead, url)
            text = (f"Redriven to an edited target URL: {old} -> {url}; message {dead.message_id} is due again "
                    f"on {dead.cell.name} (attempt 0)" if result.ok
                    else f"Redrive to an edited target URL refused ({old} -> {url}): {result.reason}")
            LogEntry.objects.log_actions(user_id=request.user.pk, queryset=[dead], action_flag=CHANGE,
                                         change_message=text, single_object=True)
            self.message_user(request, text, messages.SUCCESS if result.ok else messages.ERROR)
            return HttpResponseRedirect(reverse("admin:queueing_deadletter_changelist") if result.ok else page)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": f"Redrive {dead.message_id} to another URL",
            "subtitle": None,
            "dead": dead,
            "entered": entered,
            "error": why if request.method == "POST" else "",
            "confirm": url is not None,
            "new_url": url,
            "pathname": dead.pathname,
            "page_url": page,
        }
        return TemplateResponse(request, "admin/queueing/deadletter/redrive_url.html", context)
