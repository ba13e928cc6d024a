"""URL map: the admin, the ``/v1`` API, probes and metrics (docs/operations.md), and a JSON 404 for everything else."""
from django.contrib import admin
from django.urls import path, re_path
from django.views.decorators.csrf import csrf_exempt

from . import health, metrics, rpc
from .api import api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("healthz/live", health.live, name="healthz-live"),
    path("healthz/ready", health.ready, name="healthz-ready"),
    path("metrics", metrics.view, name="metrics"),
    path("v1/", api.urls),
    re_path(r"^", csrf_exempt(rpc.handle)),
]
