"""What the migrations build is what the models declare, every time, and from every
state a migrated database can be in: the schemas are described and compared object
by object (tests/schema.py), on the test database's server, without git.

- ``migrate`` against ``--nomigrations`` (the models and the functions apps.py
  installs), but for ``ALLOWED``, the differences made on purpose;
- two fresh ``migrate`` runs in processes with other hash seeds (a set's order);
- a database migrated to each draft migration, then upgraded, against a fresh one:
  the check of the release that folds the drafts into one migration."""

from __future__ import annotations

import pytest

from django_durable.store.functions import CURRENT
from tests import schema

pytestmark = pytest.mark.slow

# The release's migration gives the queue tables autovacuum settings (STORAGE in
# migrations/0001_0_3_initial.py): the models have no way to say so.
STORAGE = (
    "autovacuum_vacuum_scale_factor=0.01, autovacuum_vacuum_threshold=1000, "
    "autovacuum_vacuum_insert_scale_factor=0.02, autovacuum_vacuum_insert_threshold=1000, "
    "autovacuum_analyze_scale_factor=0.02, autovacuum_analyze_threshold=1000"
)


def allowed(key: str, migrated: str | None, declared: str | None) -> bool:
    """The differences between a migrated database and one made from the models that
    are there on purpose."""
    kind, name = key.split(" ", 1)
    if kind == "table" and name in ("durable_run", "durable_step_attempt"):
        return (migrated, declared) == (STORAGE, "")
    if kind == "function" and declared is None:
        # The previous release's version an expand migration keeps installed for its
        # processes (a rolling deploy); the functions apps.py installs are the code's.
        previous = set(schema.functions_left_installed()) - set(CURRENT.values())
        return name.split("(", 1)[0] in previous
    if kind == "table" and name == "durable_stream":
        # Half of each page free, so a stream's row rewritten by every write stays HOT
        # (migrations/0009_0_4_expand_streams.py).
        return (migrated, declared) == ("fillfactor=50", "")
    return False


def test_the_migrations_build_the_schema_the_models_declare(tmp_path):
    migrated = schema.migrated(tmp_path)
    declared = schema.without_migrations(tmp_path)
    assert any(key.startswith("index durable_run_finished") for key in migrated)
    found = schema.differences(migrated, declared)
    unexpected = {key: pair for key, pair in found.items() if not allowed(key, *pair)}
    assert unexpected == {}


def test_two_fresh_migrations_build_the_same_schema(tmp_path):
    """A set's order is its process's hash order: 0001 once wrote the finished
    statuses of ``durable_run_finished`` from a frozenset, so two databases differed."""
    first = schema.migrated(tmp_path, environ={"PYTHONHASHSEED": "1"})
    second = schema.migrated(tmp_path, environ={"PYTHONHASHSEED": "2"})
    assert first and schema.differences(first, second) == {}


@pytest.mark.parametrize("start", schema.draft_names()[:-1])
def test_a_database_upgraded_from_a_draft_equals_a_fresh_one(tmp_path, start):
    fresh = schema.migrated(tmp_path)
    assert schema.differences(schema.upgraded(tmp_path, start), fresh) == {}
