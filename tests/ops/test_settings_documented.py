"""Every environment variable the server code reads is in README.md's configuration table.

The reads are found in the source, not in the running settings, so a variable read by a
management command, the gunicorn config or ``manage.py`` itself counts as much as one in
``worldcell/settings.py``. The forms recognised are those the code uses (each is checked to
find something, so a renamed helper cannot make the test pass by finding nothing):
``env.str("X")``, ``env.bool``, ``env.int``, ``env.float``, ``env.list`` (django-environ),
``_number("X", …)`` (settings.py's checked numbers), ``os.environ.get("X")`` and
``os.environ.setdefault("X", …)``; ``os.getenv("X")``, ``os.environ["X"]`` and
``"X" in os.environ`` are recognised too, for code still to come. The table is README.md's
"## Configuration" section; a variable counts as documented when a row names it in backticks,
in its first column or in its text (``WEB_CONCURRENCY``, ``GUNICORN_THREADS``, … share a row;
the HSTS row mentions its two flags).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.any_database  # runs in the PostgreSQL pass only

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("worldcell", "cells", "queueing", "worldcell_client", "manage.py")

NAME = r"""["']([A-Z][A-Z0-9_]*)["']"""
FORMS = {
    "env.<type>": re.compile(r"\benv\.(?:str|bool|int|float|list|tuple|dict|json|url|path|db|db_url)\(\s*" + NAME),
    "env()": re.compile(r"\benv\(\s*" + NAME),
    "_number": re.compile(r"\b_number\(\s*" + NAME),
    "environ.get": re.compile(r"\benviron\.get\(\s*" + NAME),
    "environ.setdefault": re.compile(r"\benviron\.setdefault\(\s*" + NAME),
    "getenv": re.compile(r"\bgetenv\(\s*" + NAME),
    "environ[]": re.compile(r"\benviron\[\s*" + NAME + r"\s*\](?!\s*=[^=])"),  # not an assignment
    "in environ": re.compile(NAME + r"\s+(?:not\s+)?in\s+(?:os\.)?environ\b"),
}
#: the forms the code uses today; each must find at least one variable
USED_FORMS = ("env.<type>", "_number", "environ.get", "environ.setdefault")

#: read by the code but deliberately not in the table, each with its reason
NOT_DOCUMENTED = {
    "DJANGO_SETTINGS_MODULE": "Django's own selector; every entry point sets it to worldcell.settings itself",
}


def source_files() -> list[Path]:
    files = []
    for name in SOURCES:
        path = ROOT / name
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return files


def reads_by_form() -> dict[str, dict[str, list[str]]]:
    """``{form: {variable: ["path:line", …]}}`` over the server's source."""
    found: dict[str, dict[str, list[str]]] = {form: {} for form in FORMS}
    for path in source_files():
        text = path.read_text(encoding="utf-8")
        for form, pattern in FORMS.items():
            for match in pattern.finditer(text):
                where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
                found[form].setdefault(match.group(1), []).append(where)
    return found


def variables_read() -> dict[str, list[str]]:
    merged: dict[str, list[str]] = {}
    for by_name in reads_by_form().values():
        for name, places in by_name.items():
            merged.setdefault(name, []).extend(places)
    return merged


def configuration_rows(readme: str) -> list[str]:
    """The body rows of the first table under ``## Configuration``."""
    section = readme.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 2 and set(rows[1]) <= set("|-: "), "no markdown table under '## Configuration'"
    return rows[2:]


def documented(rows: list[str]) -> set[str]:
    return {name for row in rows for name in re.findall(r"`\$?([A-Z][A-Z0-9_]*)`", row)}


def test_each_reading_form_finds_variables():
    by_form = reads_by_form()
    empty = [form for form in USED_FORMS if not by_form[form]]
    assert not empty, f"these reading forms found nothing (the regex no longer matches the code): {empty}"
    found = variables_read()
    assert {"DATABASE_URL", "WORLD_SECRET", "QUEUE_MAX_ATTEMPTS", "DJANGO_SECURE_HSTS_SECONDS",
            "WEB_CONCURRENCY", "WORLDCELL_NO_BOOTSTRAP", "WORLDCELL_RUN_RETENTION"} <= set(found)
    assert len(found) >= 40, sorted(found)


def test_the_table_parser_reads_shared_rows_and_mentions():
    rows = ["| `A_B`, `C_D` | `1`, `2` | defaults |", "| `E_F` | `0` | with `G_H` and `$I_J` |"]
    assert documented(rows) == {"A_B", "C_D", "E_F", "G_H", "I_J"}


def test_every_variable_the_code_reads_is_in_the_readme_table():
    names = documented(configuration_rows((ROOT / "README.md").read_text(encoding="utf-8")))
    assert {"DATABASE_URL", "GUNICORN_THREADS", "DJANGO_SECURE_HSTS_PRELOAD"} <= names
    read = variables_read()
    missing = {name: places for name, places in read.items() if name not in names and name not in NOT_DOCUMENTED}
    assert not missing, "read by the code but missing from README.md's configuration table:\n" + "\n".join(
        f"  {name}  ({', '.join(places)})" for name, places in sorted(missing.items()))
    stale = set(NOT_DOCUMENTED) - set(read)
    assert not stale, f"NOT_DOCUMENTED names variables the code no longer reads: {sorted(stale)}"
