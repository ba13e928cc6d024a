"""URL map: the admin, the ``/v1`` API, probes and metrics (docs/operations.md), and a JSON 404 for everything else."""
import functools

from django.contrib import admin
from django.urls import path, re_path
from django.views.decorators.csrf import csrf_exempt

from . import health, metrics, rpc
from .api import api


def read_only(view):
    """``view`` for GET and HEAD only: any other method answers 405 JSON (``Allow: GET, HEAD``).

    CSRF-exempt: probes and scrapers send no cookies, and a POST must get the 405 in the
    protocol's error shape (docs/protocol.md §2.9), not Django's HTML CSRF page.
    """
    @csrf_exempt
    @functools.wraps(view)
    def wrapper(request, *args, **kwargs):
        if request.method not in ("GET", "HEAD"):
            response = rpc.error_response(405, "MethodNotAllowed", f"{request.method} is not allowed here: use GET")
            response["Allow"] = "GET, HEAD"
            return response
        return view(request, *args, **kwargs)

    return wrapper


urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz/live", read_only(health.live), name="healthz-live"),
    path("healthz/ready", read_only(health.ready), name="healthz-ready"),
    path("metrics", read_only(metrics.view), name="metrics"),
    path("v1/", api.urls),
    re_path(r"^", csrf_exempt(rpc.handle)),
]
