"""The next release's schema change, written as docs/contributing.md says: an expand
migration on the hot table. A nullable column, added under a short ``lock_timeout``
and tried again when the lock is not granted in time (``WithLockTimeout``), and an
index on it built ``CONCURRENTLY``. Not atomic: each operation is its own
transaction, and no lock is held from one to the next.

Throwaway: tests/test_upgrade_under_traffic.py applies it while processes of this
release start and claim runs. It depends on the package's newest migration."""

import importlib
import time
from pathlib import Path

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import OperationalError, migrations, models, transaction
from django.db.migrations.operations.base import Operation

PACKAGE_MIGRATIONS = Path(importlib.import_module(__package__).__path__[0])
NEWEST = max(path.stem for path in PACKAGE_MIGRATIONS.glob("[0-9][0-9][0-9][0-9]_*.py"))


class WithLockTimeout(Operation):
    """``operation`` in a transaction of its own that waits at most ``timeout_ms`` for
    its lock (PostgreSQL's ``lock_timeout``), tried again after ``pause`` seconds up
    to ``tries`` times. A waiting ALTER TABLE queues every start and claim behind it:
    the timeout bounds that wait, the retries find a moment between transactions.
    Not for an operation whose SQL is deferred to the end of the migration (a
    foreign key): that runs outside the timeout."""

    reversible = True

    def __init__(self, operation, timeout_ms=200, tries=100, pause=0.2):
        self.operation = operation
        self.timeout_ms = timeout_ms
        self.tries = tries
        self.pause = pause

    def deconstruct(self):
        return (self.__class__.__name__, [self.operation], {"timeout_ms": self.timeout_ms})

    def state_forwards(self, app_label, state):
        self.operation.state_forwards(app_label, state)

    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        self._tried(
            self.operation.database_forwards, app_label, schema_editor, from_state, to_state
        )

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        self._tried(
            self.operation.database_backwards, app_label, schema_editor, from_state, to_state
        )

    def _tried(self, apply, app_label, schema_editor, from_state, to_state):
        connection = schema_editor.connection
        if connection.vendor != "postgresql":
            apply(app_label, schema_editor, from_state, to_state)
            return
        for attempt in range(1, self.tries + 1):
            try:
                with transaction.atomic(using=connection.alias):
                    schema_editor.execute(f"SET LOCAL lock_timeout = '{int(self.timeout_ms)}ms'")
                    apply(app_label, schema_editor, from_state, to_state)
                return
            except OperationalError as exc:
                # 55P03: lock_not_available, the timeout; anything else is an error.
                if getattr(exc.__cause__, "sqlstate", None) != "55P03" or attempt == self.tries:
                    raise
                time.sleep(self.pause)

    def describe(self):
        return f"{self.operation.describe()} (lock_timeout {self.timeout_ms} ms, retried)"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_durable", NEWEST)]

    operations = [
        WithLockTimeout(
            migrations.AddField(
                model_name="run",
                name="next_release_note",
                field=models.CharField(blank=True, max_length=100, null=True),
            )
        ),
        AddIndexConcurrently(
            model_name="run",
            index=models.Index(fields=["next_release_note"], name="durable_run_next_release"),
        ),
    ]
