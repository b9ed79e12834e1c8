"""An upgrade under traffic: the next release's migration adds ``<name>_v2`` beside
each ``<name>_v1`` (expand); processes of the previous release go on calling
``_v1`` while those of the new one call ``_v2``, over the same rows; ``_v1`` is
dropped a release later (contract), when no process calls it any more.

Here the next release's functions are today's text under the ``_v2`` names, as a
new migration would create them, and the new release's code is today's with its
calls renamed: a real worker process of the previous release (unchanged, calling
``_v1``) and this process (calling ``_v2``) start, claim and finish runs of the
same keys side by side."""

from __future__ import annotations

import re

import pytest
from django.db import ProgrammingError, connection, transaction
from django.test.utils import CaptureQueriesContext

import django_durable as durable
from django_durable.models import Run, Status, WorkerNode
from django_durable.store import functions
from django_durable.store.engines import postgres
from django_durable.testing import drain
from tests.testapp.workflows import Noop
from tests.worker_processes import WorkerPool, wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The statements that call a store function, by module (the PostgreSQL engine, which
# the store asks at every call) and name.
CALLS = [
    (postgres, "START"),
    (postgres, "CLAIM"),
    (postgres, "NEXT_DUE_AT"),
    (postgres, "RECORD_STEP"),
]


def next_version(name: str) -> str:
    """``durable_start_v2`` -> ``durable_start_v3``."""
    return re.sub(r"_v(\d+)$", lambda m: f"_v{int(m.group(1)) + 1}", name)


def renamed_to_next(call: str) -> str:
    """A statement's calls of the current functions renamed to their next versions."""
    for name in functions.CURRENT.values():
        call = call.replace(f"{name}(", f"{next_version(name)}(")
    return call


@pytest.fixture
def expanded():
    """The next release's migration: each function's next version created beside the
    current one."""
    with connection.cursor() as cursor:
        for name in functions.CURRENT.values():
            # Named, and calling the functions it calls (the claim's rules), by the
            # next versions.
            cursor.execute(renamed_to_next(functions.definition(name)))
    yield
    with connection.cursor() as cursor:
        for name in functions.CURRENT.values():
            cursor.execute(f"DROP FUNCTION IF EXISTS {next_version(name)}")
            cursor.execute(functions.definition(name))  # back, if the test dropped it


class Release:
    """Which version this process's code calls: the previous release's (today's) or
    the new one's (the next versions), by the statements' text alone."""

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch
        self.v1 = {(module, name): getattr(module, name) for module, name in CALLS}

    def new(self):
        for (module, name), call in self.v1.items():
            renamed = renamed_to_next(call)
            assert renamed != call, name
            self.monkeypatch.setattr(module, name, renamed)

    def previous(self):
        for (module, name), call in self.v1.items():
            self.monkeypatch.setattr(module, name, call)


def sent_calls(fn) -> set[str]:
    """The store functions this process calls while ``fn`` runs."""
    with CaptureQueriesContext(connection) as queries:
        fn()
    return {name for q in queries for name in re.findall(r"\b(durable_\w+_v\d)\(", q["sql"])}


def completed(keys) -> int:
    return Run.objects.filter(key__in=keys, status=Status.COMPLETED).count()


def test_both_releases_start_claim_and_finish_runs_side_by_side(expanded, monkeypatch, tmp_path):
    release = Release(monkeypatch)

    # Before any worker: each release starts runs, and answers the other's duplicates.
    old_keys = [f"old:{n}" for n in range(5)]
    new_keys = [f"new:{n}" for n in range(5)]
    release.previous()
    old_runs = [durable.start(Noop, {}, key=key) for key in old_keys]
    release.new()
    new_runs = [durable.start(Noop, {}, key=key) for key in new_keys]
    again = []
    assert sent_calls(
        lambda: again.extend(durable.start(Noop, {"again": 1}, key=key) for key in old_keys)
    ) == {next_version(functions.CURRENT["durable_start"])}
    assert again == old_runs
    release.previous()
    assert [durable.start(Noop, {"again": 1}, key=key) for key in new_keys] == new_runs

    # The new release's worker (here, in this process) runs them all: the previous
    # release's runs too.
    release.new()
    assert {
        next_version(functions.CURRENT["durable_claim"]),
        next_version(functions.CURRENT["durable_record_step"]),
    } <= sent_calls(drain)
    assert completed(old_keys + new_keys) == 10

    # A worker process of the previous release runs what both start meanwhile.
    pool = WorkerPool(tmp_path)
    try:
        worker = pool.start("--concurrency", "2")
        worker.wait_for_output("worker")
        more_old, more_new = [f"old:{n}" for n in range(5, 15)], [f"new:{n}" for n in range(5, 15)]
        for old_key, new_key in zip(more_old, more_new, strict=True):
            release.previous()
            durable.start(Noop, {}, key=old_key)
            release.new()
            durable.start(Noop, {}, key=new_key)
        wait_until(lambda: completed(more_old + more_new) == 20, 60, "the runs of both releases")
        # ... all of them by the worker of the previous release.
        node = WorkerNode.objects.get(pid=worker.proc.pid)
        ran = Run.objects.filter(key__in=more_old + more_new)
        assert set(ran.values_list("worker_id", flat=True)) == {node.id}
    finally:
        pool.kill_all()
    release.new()

    # Contract (a release later): _v1 dropped, the new release goes on; the previous
    # release's code would now fail, which is why _v1 outlives it by a release.
    with connection.cursor() as cursor:
        for name in functions.CURRENT.values():
            cursor.execute(f"DROP FUNCTION {name}")
    last = durable.start(Noop, {}, key="new:last")
    drain()
    assert Run.objects.get(id=last).status == Status.COMPLETED
    release.previous()
    with (
        pytest.raises(ProgrammingError, match=functions.CURRENT["durable_start"]),
        transaction.atomic(),
    ):
        durable.start(Noop, {}, key="old:last")
