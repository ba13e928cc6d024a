"""The console's search indexes: pg_trgm GIN indexes on UPPER(run id / workflow name / deployment id).

PostgreSQL only (docs/console.md "Search"): ``TrigramExtension`` and
``PostgresOnlySQL`` do nothing on SQLite, where the search uses the btree
indexes for prefixes and a bounded scan for substrings. The indexes are on
``UPPER(column)`` because Django's ``icontains`` / ``istartswith`` compare
``UPPER(col) LIKE UPPER(%s)``; they are written as SQL, not ``GinIndex(OpClass(
Upper(...)))``, whose generated DDL wraps the operator class inside the
expression's parentheses (a syntax error). They are not model state, so
``makemigrations`` sees nothing. ``CONCURRENTLY`` is not used: on a big
table, build them by hand first (docs/console.md). Reversible; the extension
stays on reverse (other objects may use it).
"""
from django.contrib.postgres.operations import TrigramExtension
from django.db import migrations

INDEXES = (
    ("cells_cell_name_trgm", "cells_runcellstate", "name"),
    ("cells_run_workflow_trgm", "cells_run", "workflow_name"),
    ("cells_run_deployment_trgm", "cells_run", "deployment_id"),
)


class PostgresOnlySQL(migrations.RunSQL):
    """``RunSQL`` that runs on PostgreSQL only (SQLite has no pg_trgm)."""

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            super().database_backwards(app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):

    dependencies = [
        ("cells", "0003_operator_actions"),
    ]

    operations = [
        TrigramExtension(),
        *(
            PostgresOnlySQL(
                sql=f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" USING gin ((UPPER("{column}")) gin_trgm_ops)',
                reverse_sql=f'DROP INDEX IF EXISTS "{name}"',
            )
            for name, table, column in INDEXES
        ),
    ]
