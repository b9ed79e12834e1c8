"""Is this deployment healthy? ``checks()`` answers for ``manage.py durable doctor``.

Each check returns a ``Finding``: what it looked at, whether it is a problem, and
the fix. The checks only read (one NOTIFY aside, on a channel payload no worker
acts on), so they are safe to run against production at any time.
"""

from __future__ import annotations

import io
import sys
import uuid
from dataclasses import asdict, dataclass, field
from datetime import timedelta

from django.apps import apps
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError
from django.db.migrations import AddConstraint, AddIndex, CreateModel
from django.db.migrations.loader import MigrationLoader
from django.db.models import Count, Index, Min, Q, UniqueConstraint

from django_durable import conf, store
from django_durable.models import ACTIVE_STATUSES, HELD_STATUSES, Run, Status, WorkerNode

__all__ = ["CLOCK_TOLERANCE", "DUE_TOO_LONG", "WORKERS_KEPT", "Finding", "checks"]

# A host clock further than this from the database's is a problem.
CLOCK_TOLERANCE = timedelta(seconds=2)
# A run due for longer than this with no live worker of its queue is stuck.
DUE_TOO_LONG = timedelta(minutes=5)
# How long a worker's row outlives its last heartbeat (maintenance forgets it then):
# the workers a page can show.
WORKERS_KEPT = store.WORKERS_KEPT
NOTIFY_TIMEOUT = 5.0
# Connections a worker opens besides one per thread: its main thread and its LISTEN.
WORKER_EXTRA_CONNECTIONS = 2


@dataclass
class Finding:
    """One check's answer. ``problem`` findings carry a ``fix``."""

    check: str
    problem: bool
    detail: str
    fix: str = ""
    data: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def checks() -> list[Finding]:
    """Every check, in the order a person on call would want them."""
    findings = [migrations()]
    for check in (functions, indexes, workers, workflows, notify, clock, pool, stuck_runs):
        try:
            findings.extend(check())
        except DatabaseError as exc:
            findings.append(
                Finding(
                    check.__name__,
                    True,
                    f"could not check: {exc}".strip(),
                    "make the database reachable and migrated, then run doctor again",
                )
            )
    return findings


def migrations() -> Finding:
    """Migrations not applied yet, of any app (``migrate --check --plan``)."""
    out = io.StringIO()
    try:
        call_command(
            "migrate",
            database=store.alias(),
            plan=True,
            check_unapplied=True,
            skip_checks=True,
            stdout=out,
        )
    except SystemExit:
        pending = [
            line.strip()
            for line in out.getvalue().splitlines()
            if line and not line.startswith(" ") and "." in line
        ]
        shown = ", ".join(pending[:5]) + (f" and {len(pending) - 5} more" if pending[5:] else "")
        return Finding(
            "migrations",
            True,
            f"{len(pending)} migration(s) not applied: {shown}",
            "run: python manage.py migrate",
            {"pending": pending},
        )
    return Finding("migrations", False, "all migrations are applied")


def functions() -> list[Finding]:
    """The store's PL/pgSQL functions (PostgreSQL): each installed, with this version's
    body. A missing one fails every start and claim."""
    outdated = store.outdated_functions()
    if outdated is None:
        return [Finding("functions", False, "none needed: the database is not PostgreSQL")]
    if not outdated:
        return [Finding("functions", False, "the store's functions are installed and current")]
    listed = ", ".join(f"{name} ({state})" for name, state in sorted(outdated.items()))
    return [
        Finding(
            "functions",
            True,
            f"the store's functions are not as this version defines them: {listed}",
            _migrate_fix(sorted(outdated)),
            {"outdated": outdated},
        )
    ]


def declared_indexes() -> dict[str, str]:
    """The indexes django-durable's models declare by name (``Meta.indexes``, and the
    unique constraints, which are indexes too), each with its table."""
    declared = {}
    for model in apps.get_app_config("django_durable").get_models():
        for index in [*model._meta.indexes, *model._meta.constraints]:
            if isinstance(index, (Index, UniqueConstraint)):
                declared[index.name] = model._meta.db_table
    return declared


def indexes() -> list[Finding]:
    """The indexes the models declare, each in the database by its name: without one,
    a claim or a start reads the whole table, or an invariant goes unchecked."""
    declared = declared_indexes()
    present = store.index_names(sorted(set(declared.values())))
    missing = sorted(name for name in declared if name not in present)
    if not missing:
        return [Finding("indexes", False, f"the {len(declared)} indexes the models declare exist")]
    return [
        Finding(
            "indexes",
            True,
            f"{len(missing)} index(es) the models declare are missing: {', '.join(missing)}",
            _migrate_fix(missing),
            {"missing": missing},
        )
    ]


def _migrate_fix(missing: list[str]) -> str:
    """``migrate``, and which of django-durable's migrations creates each name."""
    made = creators()
    by_migration: dict[str, list[str]] = {}
    for name in missing:
        by_migration.setdefault(made.get(name, "no migration"), []).append(name)
    said = "; ".join(f"{m} creates {', '.join(names)}" for m, names in sorted(by_migration.items()))
    return f"run: python manage.py migrate ({said})"


def creators() -> dict[str, str]:
    """Which of django-durable's migrations creates each index, constraint and store
    function, read from the migrations' operations, in the order they apply: an index
    or constraint of a ``CreateModel``, ``AddIndex`` or ``AddConstraint``; a function
    named in the migration module's ``FUNCTIONS``, which its ``RunPython`` creates."""
    loader = MigrationLoader(None, ignore_no_migrations=True)
    made: dict[str, str] = {}
    for leaf in loader.graph.leaf_nodes("django_durable"):
        for app, name in loader.graph.forwards_plan(leaf):
            if app != "django_durable":
                continue
            migration = loader.graph.nodes[(app, name)]
            for created in _created_by(migration):
                made.setdefault(created, name)
    return made


def _created_by(migration) -> list[str]:
    names = list(getattr(sys.modules[type(migration).__module__], "FUNCTIONS", []))
    for operation in migration.operations:
        if isinstance(operation, CreateModel):
            options = operation.options
            names += [
                i.name for i in [*options.get("indexes", []), *options.get("constraints", [])]
            ]
        elif isinstance(operation, AddIndex):
            names.append(operation.index.name)
        elif isinstance(operation, AddConstraint):
            names.append(operation.constraint.name)
    return names


def live_workers() -> list[WorkerNode]:
    """Workers that heartbeated within a lease and are not stopping."""
    since = store.now() - conf.get("LEASE")
    return list(WorkerNode.objects.filter(heartbeat_at__gte=since, stopping=False))


def _serves(worker: WorkerNode, queue: str) -> bool:
    return not worker.queues or queue in worker.queues


def workers() -> list[Finding]:
    alive = live_workers()
    queues = sorted(
        set(Run.objects.filter(status__in=ACTIVE_STATUSES).values_list("queue", flat=True))
        | {q for w in alive for q in w.queues}
        | {"default"}
    )
    findings = []
    for queue in queues:
        serving = [w.id for w in alive if _serves(w, queue)]
        if serving:
            findings.append(
                Finding(
                    "workers",
                    False,
                    f"queue {queue!r}: {len(serving)} live worker(s)",
                    data={"queue": queue, "workers": serving},
                )
            )
        else:
            findings.append(
                Finding(
                    "workers",
                    True,
                    f"queue {queue!r}: no live worker (none heartbeated within the lease)",
                    f"start one: python manage.py durable_worker --queues {queue}",
                    {"queue": queue, "workers": []},
                )
            )
    return findings


def knows(worker: WorkerNode, workflow: str) -> bool:
    """Whether ``worker`` has the code of ``workflow`` (``None``: it claims any)."""
    if worker.workflows is None:
        return True
    return any(
        workflow.startswith(known[:-1]) if known.endswith("*") else workflow == known
        for known in worker.workflows
    )


def unknown_to_live_workers(workflow: str, queue: str, alive: list[WorkerNode]) -> bool:
    """Whether live workers (of ``alive``) take ``queue`` and none of them knows
    ``workflow``: its runs wait until a worker with its code starts (the dashboard's
    banner; with no live worker of the queue at all, the workers check says so)."""
    serving = [w for w in alive if _serves(w, queue)]
    return bool(serving) and not any(knows(w, workflow) for w in serving)


def workflows() -> list[Finding]:
    """The workflows each live worker serves, and due runs that no live worker of their
    queue knows (a rolling deploy left only workers running older code, say): they wait."""
    alive = live_workers()
    findings = []
    for worker in alive:
        served = worker.workflows
        listed = "any workflow" if served is None else f"{len(served)}: {', '.join(served)}"
        findings.append(
            Finding(
                "workflows",
                False,
                f"worker {worker.id} serves {listed}",
                data={"worker": worker.id, "workflows": served},
            )
        )
    due = (
        Run.objects.filter(status=Status.PENDING, due_at__lte=store.now())
        .values("workflow", "queue")
        .annotate(n=Count("id"))
        .order_by("workflow", "queue")
    )
    for row in due:
        serving = [w for w in alive if _serves(w, row["queue"])]
        if not serving or any(knows(w, row["workflow"]) for w in serving):
            continue  # no worker of the queue at all: the workers check says so
        findings.append(
            Finding(
                "workflows",
                True,
                f"workflow {row['workflow']!r}: {row['n']} due run(s) in queue "
                f"{row['queue']!r} and none of its {len(serving)} live worker(s) knows it",
                f"deploy the code that defines {row['workflow']!r} to the workers of queue "
                f"{row['queue']!r} and restart them (python manage.py durable_worker "
                f"--queues {row['queue']}); its runs wait until then",
                {"workflow": row["workflow"], "queue": row["queue"], "due": row["n"]},
            )
        )
    return findings


def notify() -> list[Finding]:
    channel, alias = conf.get("NOTIFY_CHANNEL"), conf.get("LISTEN_DATABASE")
    if not store.engine().LISTENS:
        return [Finding("notify", False, "SQLite has no NOTIFY: workers poll (POLL_INTERVAL)")]
    if alias is None:
        return [
            Finding(
                "notify",
                False,
                "DURABLE['LISTEN_DATABASE'] is None: workers poll only (POLL_INTERVAL)",
            )
        ]
    arrived = store.notify_round_trip(channel, f"doctor-{uuid.uuid4()}", alias, NOTIFY_TIMEOUT)
    if not arrived:
        return [
            Finding(
                "notify",
                True,
                f"a NOTIFY on {channel!r} did not arrive within {NOTIFY_TIMEOUT:.0f}s",
                "LISTEN needs a direct or session-mode connection: point "
                "DURABLE['LISTEN_DATABASE'] at one that bypasses a transaction-mode pooler",
            )
        ]
    listening = store.listening_sessions(channel)
    alive = live_workers()
    if alive and listening < len(alive):
        return [
            Finding(
                "notify",
                True,
                f"NOTIFY works, but only {listening} of {len(alive)} live workers listen",
                "check the workers' logs for 'LISTEN failed' and their LISTEN_DATABASE",
                {"listening": listening, "workers": len(alive)},
            )
        ]
    return [
        Finding(
            "notify",
            False,
            f"a NOTIFY on {channel!r} arrived; {listening} session(s) listen",
            data={"listening": listening},
        )
    ]


def clock() -> list[Finding]:
    before = store.now()
    database = store.database_clock()
    after = store.now()
    if database is None:
        return [Finding("clock", False, "SQLite uses this host's clock")]
    offset = database - (before + (after - before) / 2)
    seconds = offset.total_seconds()
    data = {"offset_seconds": round(seconds, 3)}
    if abs(offset) > CLOCK_TOLERANCE:
        return [
            Finding(
                "clock",
                True,
                f"this host's clock is {abs(seconds):.1f}s "
                f"{'behind' if seconds > 0 else 'ahead of'} the database's",
                "synchronise the clocks with NTP (e.g. chrony) on this host and the database",
                data,
            )
        ]
    return [Finding("clock", False, f"clock offset to the database: {seconds:+.3f}s", data=data)]


def pool() -> list[Finding]:
    findings = []
    alive = live_workers()
    options = settings.DATABASES["default"].get("OPTIONS") or {}
    pool_options = options.get("pool")
    if pool_options:
        max_size = pool_options.get("max_size") if isinstance(pool_options, dict) else None
        for worker in alive:
            needed = worker.concurrency + 1
            if max_size is not None and max_size < needed:
                findings.append(
                    Finding(
                        "pool",
                        True,
                        f"worker {worker.id} runs {worker.concurrency} threads but the "
                        f"connection pool holds at most {max_size}",
                        f"set DATABASES['default']['OPTIONS']['pool']['max_size'] >= {needed}",
                    )
                )
    limits = store.connection_limits()
    if limits is not None:
        allowed, in_use = limits
        needed = sum(w.concurrency + WORKER_EXTRA_CONNECTIONS for w in alive)
        data = {"allowed": allowed, "in_use": in_use, "workers_need": needed}
        if needed > allowed or in_use >= allowed:
            findings.append(
                Finding(
                    "pool",
                    True,
                    f"{in_use} of {allowed} connections are open; live workers need {needed}",
                    "raise max_connections, lower --concurrency, or put a pooler "
                    "(PgBouncer) in front of the web processes",
                    data,
                )
            )
        elif not findings:
            findings.append(
                Finding(
                    "pool",
                    False,
                    f"{in_use} of {allowed} connections open; live workers need {needed}",
                    data=data,
                )
            )
    elif not findings:
        findings.append(Finding("pool", False, "SQLite: no connection limit"))
    return findings


def stuck_runs() -> list[Finding]:
    at = store.now()
    findings = []
    expired = Run.objects.filter(status__in=HELD_STATUSES, lease_expires_at__lt=at).aggregate(
        n=Count("id"), oldest=Min("lease_expires_at")
    )
    if expired["n"]:
        findings.append(
            Finding(
                "stuck_runs",
                True,
                f"{expired['n']} running run(s) with an expired lease "
                f"(oldest expired {_ago(at - expired['oldest'])} ago)",
                "a live worker recovers them at its next maintenance pass: keep a worker "
                "running; if one is, see its log for maintenance errors",
                {"expired_leases": expired["n"]},
            )
        )
    alive = live_workers()
    overdue = (
        Run.objects.filter(Q(status=Status.PENDING), due_at__lt=at - DUE_TOO_LONG)
        .values("queue")
        .annotate(n=Count("id"), oldest=Min("due_at"))
        .order_by("queue")
    )
    for row in overdue:
        if any(_serves(w, row["queue"]) for w in alive):
            continue
        findings.append(
            Finding(
                "stuck_runs",
                True,
                f"queue {row['queue']!r}: {row['n']} pending run(s) due for "
                f"{_ago(at - row['oldest'])} and no live worker serves it",
                f"start one: python manage.py durable_worker --queues {row['queue']}",
                {"queue": row["queue"], "overdue": row["n"]},
            )
        )
    if not findings:
        findings.append(Finding("stuck_runs", False, "no stuck runs"))
    return findings


def _ago(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"
