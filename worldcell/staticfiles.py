"""Static files: whitenoise's compressed, content-hashed manifest storage and its middleware (docs/operations.md "Static files")."""
from __future__ import annotations

import logging

from whitenoise.middleware import WhiteNoiseMiddleware
from whitenoise.storage import CompressedManifestStaticFilesStorage

log = logging.getLogger("worldcell.staticfiles")


class StaticStorage(CompressedManifestStaticFilesStorage):
    """``CompressedManifestStaticFilesStorage`` that still renders pages before ``collectstatic``.

    After ``manage.py collectstatic`` every ``{% static %}`` URL is the
    content-hashed name from the manifest (served with a one-year cache).
    Without a manifest entry (no collectstatic yet, e.g. the test client) the
    URL keeps its plain name, which whitenoise serves from the apps' own
    folders (``WHITENOISE_USE_FINDERS``), instead of the page failing with
    ``ValueError: Missing staticfiles manifest entry``.
    """

    manifest_strict = False
    _warned = False

    def stored_name(self, name: str) -> str:
        try:
            return super().stored_name(name)
        except ValueError:
            if not self.hashed_files and not StaticStorage._warned:
                StaticStorage._warned = True
                log.warning("static files are not collected (run manage.py collectstatic); serving them unhashed")
            return name


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """whitenoise's middleware, where collected files (STATIC_ROOT) win over the apps' own copies.

    With ``WHITENOISE_USE_FINDERS`` whitenoise indexes the apps' static folders
    after STATIC_ROOT and lets them replace the collected files of the same
    URL (plain names would then lose their compressed variants). Here the
    finders only fill the gaps: files not collected yet.
    """

    def add_files_from_finders(self) -> None:
        collected = dict(self.files)
        super().add_files_from_finders()
        self.files.update(collected)
