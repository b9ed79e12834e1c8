"""Whether django-durable's migrations are applied: asked when something failed or
before a long-lived process starts (a worker, the dashboard, the command line), so
that a project that has not run ``migrate`` hears so instead of "no such table".

Django's own migration executor answers, the way ``runserver`` counts unapplied
migrations; a database found migrated is remembered for the process.
"""

from __future__ import annotations

from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from django_durable.store.base import alias

APP = "django_durable"

__all__ = ["forget", "has_table", "unapplied_migrations"]

# The aliases found with every migration of the app applied.
_migrated: set[str] = set()


def unapplied_migrations(alias: str) -> list[str] | None:
    """The names of the app's migrations not applied on ``alias``, in order ([]: all
    applied); None when the database could not say (it is out of reach)."""
    if alias in _migrated:
        return []
    try:
        executor = MigrationExecutor(connections[alias])
        leaves = [node for node in executor.loader.graph.leaf_nodes() if node[0] == APP]
        plan = executor.migration_plan(leaves)
    except DatabaseError:
        return None
    names = [migration.name for migration, _backwards in plan if migration.app_label == APP]
    if not names:
        _migrated.add(alias)
    return names


def has_table(table: str) -> bool:
    """Whether django-durable's database has ``table`` (after a ``migrate`` backwards,
    it may not)."""
    connection = connections[alias()]
    with connection.cursor() as cursor:
        return table in connection.introspection.table_names(cursor)


def forget() -> None:
    """Ask the database again next time (tests that unapply migrations)."""
    _migrated.clear()
