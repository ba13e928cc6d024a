"""The committed migrations match the models (so a fresh database gets every table)."""
import io

import pytest
from django.core.management import call_command


@pytest.mark.django_db
def test_it_has_no_model_changes_without_a_migration():
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:  # --check exits 1 when a migration is missing
        pytest.fail(f"models changed without a migration:\n{out.getvalue()}") if exc.code else None
