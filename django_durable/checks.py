"""System checks for the ``DURABLE`` setting and the databases it uses
(ids ``django_durable.E001``...; warnings ``W001``...).

``django_durable.E017`` (a ``DurableBackend`` in ``TASKS`` without the app in
``INSTALLED_APPS``) is the Tasks backend's own check, ``DurableBackend.check()``: the
framework runs it, and this module, imported only by the app, cannot.

Some warnings depend on how ``durable_worker`` is started, which a system check
cannot know: the check judges the default ``--concurrency`` and the worker logs
the same warning at start for its real one (``worker_start_warnings``).
"""

import json
from datetime import timedelta

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Info, Tags, Warning, register
from django.db import router
from django.urls import NoReverseMatch, reverse

from django_durable import conf
from django_durable.conf import DEFAULTS, WORKER_CONCURRENCY
from django_durable.workflows.definition import registry
from django_durable.workflows.flow import flow_problem
from django_durable.workflows.retention import retention_problem

# psycopg_pool's ConnectionPool: min_size 4, and max_size defaults to min_size.
PSYCOPG_POOL_MIN_SIZE = 4
# Threads of a worker that hold a connection besides its execution threads:
# the dispatcher, the heartbeat, the maintenance thread and the recorder of last
# steps (runtime/recorder.py; none with DURABLE["COMPLETION_BATCH"] = 1).
WORKER_SERVICE_THREADS = 4

DURATIONS = ("LEASE", "HEARTBEAT_INTERVAL", "POLL_INTERVAL", "SHUTDOWN_GRACE")
OPTIONAL_DURATIONS = ("RUN_RETENTION", "ACTIVITY_RETENTION", "PRUNE_INTERVAL")


@register(Tags.compatibility)
def check_settings(app_configs=None, **kwargs):
    configured = getattr(settings, "DURABLE", {})
    if not isinstance(configured, dict):
        return [Error("DURABLE must be a dict.", id="django_durable.E001")]
    errors = []
    unknown = sorted(set(configured) - set(DEFAULTS))
    if unknown:
        errors.append(
            Error(
                f"Unknown DURABLE settings: {', '.join(unknown)}.",
                hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                id="django_durable.E002",
            )
        )
    values = {**DEFAULTS, **configured}
    for name in DURATIONS:
        if not isinstance(values[name], timedelta) or values[name] <= timedelta(0):
            errors.append(
                Error(f"DURABLE[{name!r}] must be a positive timedelta.", id="django_durable.E003")
            )
    for name in OPTIONAL_DURATIONS:
        value = values[name]
        if value is not None and (not isinstance(value, timedelta) or value <= timedelta(0)):
            errors.append(
                Error(
                    f"DURABLE[{name!r}] must be a positive timedelta or None.",
                    id="django_durable.E004",
                )
            )
    batch = values["PRUNE_BATCH_SIZE"]
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        errors.append(
            Error(
                "DURABLE['PRUNE_BATCH_SIZE'] must be a whole number >= 1.", id="django_durable.E005"
            )
        )
    for name, least in (
        ("MAX_RECOVERIES", 0),
        ("MAX_VALUE_BYTES", 1),
        ("COMPLETION_BATCH", 1),
        ("MAX_FOLDED_INPUTS", 1),
    ):
        value = values[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            errors.append(
                Error(
                    f"DURABLE[{name!r}] must be a whole number >= {least}.",
                    id="django_durable.E015",
                )
            )
    if not errors and values["HEARTBEAT_INTERVAL"] * 2 > values["LEASE"]:
        errors.append(
            Error(
                "DURABLE['HEARTBEAT_INTERVAL'] must be at most half of DURABLE['LEASE'], "
                "or a slow heartbeat lets a live worker's runs be recovered.",
                id="django_durable.E006",
            )
        )
    if not isinstance(values["NOTIFY_CHANNEL"], str) or not values["NOTIFY_CHANNEL"]:
        errors.append(
            Error("DURABLE['NOTIFY_CHANNEL'] must be a non-empty string.", id="django_durable.E007")
        )
    listen = values["LISTEN_DATABASE"]
    if listen is not None and listen not in settings.DATABASES:
        errors.append(
            Error(
                f"DURABLE['LISTEN_DATABASE'] is {listen!r}, which is not in DATABASES.",
                hint="Name a DATABASES alias, or None to poll without LISTEN/NOTIFY.",
                id="django_durable.E008",
            )
        )
    # E009 and E010 named settings of 0.1 that are gone; their ids are not reused.
    if values["DATABASE"] not in settings.DATABASES:
        errors.append(
            Error(
                f"DURABLE['DATABASE'] is {values['DATABASE']!r}, which is not in DATABASES.",
                hint="Name the DATABASES alias that holds django-durable's tables.",
                id="django_durable.E011",
            )
        )
    for name in ("STEP_LOG_RECORDS", "STEP_LOG_BYTES"):
        value = values[name]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            errors.append(
                Error(f"DURABLE[{name!r}] must be a whole number >= 0.", id="django_durable.E014")
            )
    errors.extend(_queue_errors(values.get("QUEUES")))
    return errors


def _queue_errors(queues) -> list[Error]:
    """``DURABLE["QUEUES"]``: a dict of queue name -> options (``concurrency``)."""
    if not isinstance(queues, dict):
        return [Error("DURABLE['QUEUES'] must be a dict.", id="django_durable.E020")]
    problems = (conf.queue_problem(name, options) for name, options in queues.items())
    return [Error(problem, id="django_durable.E020") for problem in problems if problem]


def sqlite_concurrency_warning(concurrency: int, serialises_writers: bool) -> list[Warning]:
    """Warned by the worker: SQLite serialises writes (``serialises_writers``: its
    engine's ``SERIALISES_WRITERS``), so threads mostly wait."""
    if serialises_writers and concurrency > 1:
        return [
            Warning(
                f"durable_worker runs with --concurrency {concurrency} on SQLite: it works, "
                "but SQLite serialises writes, so the threads mostly take turns.",
                hint="Use PostgreSQL for concurrency, or --concurrency 1.",
                id="django_durable.W001",
            )
        ]
    return []


@register(Tags.compatibility)
def check_sqlite_transactions(app_configs=None, **kwargs):
    return sqlite_transaction_warnings(settings.DATABASES)


# What quickstart step 2 adds on SQLite, and what W002 tells a project without it to add.
# IMMEDIATE takes the write lock when a transaction begins, so a start that reads and
# then writes waits for the worker's write instead of failing at once with "database
# is locked" (8 clients x 5 keyed starts with a worker: 20-28 of 40 failed without it,
# 0 with it; tests/test_sqlite_concurrency.py). The timeout is how long a write waits:
# with 32 clients the default 5 s let 4-8 of 160 fail, 20 s none, and 20 s is under
# the 30 s after which common WSGI servers kill a request. WAL lets reads go on while
# the worker writes (the 160 starts were answered about 3x as fast).
SQLITE_OPTIONS = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}


def sqlite_transaction_warnings(databases: dict) -> list[Warning]:
    """On SQLite, a worker and a web process write the same file. Deferred transactions
    that read before they write fail with "database is locked" instead of waiting;
    IMMEDIATE transactions take the write lock up front and wait their turn."""
    warnings = []
    for alias, config in databases.items():
        if config.get("ENGINE") != "django.db.backends.sqlite3":
            continue
        options = config.get("OPTIONS") or {}
        if options.get("transaction_mode") != "IMMEDIATE":
            wanted = ", ".join(
                f"{json.dumps(k)}: {json.dumps(v)}" for k, v in SQLITE_OPTIONS.items()
            )
            merge = " (merged with the OPTIONS it has)" if options else ""
            warnings.append(
                Warning(
                    f"SQLite database {alias!r} does not use IMMEDIATE transactions: while "
                    "a worker runs, requests that start runs fail with 'database is locked'.",
                    hint=f'Add to DATABASES["{alias}"]{merge}: "OPTIONS": {{{wanted}}}',
                    id="django_durable.W002",
                )
            )
    return warnings


def claim_level_notes(databases: dict) -> list[Info]:
    """On PostgreSQL at another isolation level than READ COMMITTED, what the worker
    does about it: its claim counts each limit's running runs after a lock, which
    needs a fresh snapshot, so the store sets READ COMMITTED for the claim's own
    transaction (store/claims.py); the limits themselves hold at any level, by the
    slot indexes (docs/flow-control.md)."""
    notes = []
    for alias, config in databases.items():
        if "postgresql" not in config.get("ENGINE", ""):
            continue
        level = (config.get("OPTIONS") or {}).get("isolation_level")
        name = getattr(level, "name", str(level)).replace("_", " ")
        if level is None or name == "READ COMMITTED":
            continue
        notes.append(
            Info(
                f"DATABASES[{alias!r}] runs at {name}: durable_worker sets READ COMMITTED "
                "for its claim's own transaction (SET TRANSACTION), and every other "
                "statement runs at the alias's level. Flow and queue limits hold at any "
                "level: the slot indexes refuse a run past them.",
                id="django_durable.I001",
            )
        )
    return notes


@register(Tags.compatibility)
def check_claim_level(app_configs=None, **kwargs):
    return claim_level_notes(settings.DATABASES)


HTMX_MIDDLEWARE = "django_htmx.middleware.HtmxMiddleware"


@register(Tags.urls)
def check_dashboard(app_configs=None, **kwargs):
    """The dashboard needs its URLs included and django-htmx's middleware: without
    them the admin links lead nowhere, and pages a project adds on top of ours
    (``request.htmx``) fail. A project that serves no admin (a worker-only settings
    module, no ``django.contrib.admin`` or no ``ROOT_URLCONF``) has no dashboard to
    check."""
    if "django.contrib.admin" not in settings.INSTALLED_APPS or not getattr(
        settings, "ROOT_URLCONF", None
    ):
        return []
    errors = []
    if HTMX_MIDDLEWARE not in getattr(settings, "MIDDLEWARE", []):
        errors.append(
            Error(
                f"{HTMX_MIDDLEWARE} is not in MIDDLEWARE.",
                hint=f'Add "{HTMX_MIDDLEWARE}" to MIDDLEWARE (after AuthenticationMiddleware).',
                id="django_durable.E012",
            )
        )
    try:
        reverse("django_durable:overview")
    except NoReverseMatch:
        errors.append(
            Error(
                "The dashboard's URLs are not included.",
                hint='Add path("admin/durable/", include("django_durable.urls")) to your '
                "URLconf, before the admin's own URLs.",
                id="django_durable.E013",
            )
        )
    return errors


@register(Tags.compatibility)
def check_routers(app_configs=None, **kwargs):
    return router_errors(settings.DATABASES)


def router_errors(databases: dict) -> list[Error]:
    """django-durable's statements and managers use ``DURABLE["DATABASE"]``, but Django
    asks ``DATABASE_ROUTERS`` where an instance's ``save()``/``delete()`` writes and
    where ``migrate`` creates the tables. Routers that send its models' writes
    elsewhere split a run's rows across two databases (or a replica refuses them)."""
    alias = conf.get("DATABASE")
    if not isinstance(alias, str) or alias not in databases:
        return []  # check_settings reports it (E011)
    elsewhere: dict[str, list[str]] = {}
    for model in apps.get_app_config("django_durable").get_models():
        target = router.db_for_write(model)
        if target != alias:
            elsewhere.setdefault(target, []).append(model.__name__)
    return [
        Error(
            f"DATABASE_ROUTERS send writes of django-durable's models ({', '.join(names)}) "
            f"to {target!r}, but DURABLE['DATABASE'] is {alias!r}.",
            hint=(
                'Put "django_durable.routers.DurableRouter" first in DATABASE_ROUTERS: '
                "it sends django-durable's reads, writes and migrations to "
                "DURABLE['DATABASE'] and leaves every other model to your routers."
            ),
            id="django_durable.E016",
        )
        for target, names in sorted(elsewhere.items())
    ]


def pool_max_size(options: dict | None) -> int | None:
    """The most connections Django's pool (``OPTIONS["pool"]``) opens; None without a pool."""
    pool = (options or {}).get("pool")
    if not pool:
        return None
    if pool is True:
        return PSYCOPG_POOL_MIN_SIZE
    if not isinstance(pool, dict):
        return None  # Django itself reports what it cannot use
    size = pool.get("max_size")
    return size if size is not None else pool.get("min_size", PSYCOPG_POOL_MIN_SIZE)


def worker_connections(concurrency: int, *, listen_alias: str | None, alias: str) -> int:
    """Connections of ``alias`` a worker holds at once: one per execution thread, the
    dispatcher, the heartbeat, the maintenance thread, the recorder (unless
    ``COMPLETION_BATCH`` is 1), and the notifier when it LISTENs through the same alias
    (its start-up check NOTIFY borrows one of them too). Pools are PostgreSQL's, where
    the recorder runs."""
    batch = conf.get("COMPLETION_BATCH")
    recorder = isinstance(batch, int) and batch > 1
    service = WORKER_SERVICE_THREADS - (0 if recorder else 1)
    return concurrency + service + (1 if listen_alias == alias else 0)


def pool_size_warnings(
    concurrency: int, databases: dict, *, default_concurrency: bool = False
) -> list[Warning]:
    """A pool smaller than the worker's threads makes the last threads wait for a
    connection for the pool's timeout (30 s) and fail, again and again."""
    alias = conf.get("DATABASE")
    config = databases.get(alias) if isinstance(alias, str) else None
    if not config:
        return []
    size = pool_max_size(config.get("OPTIONS"))
    listen = conf.get("LISTEN_DATABASE")
    needed = worker_connections(concurrency, listen_alias=listen, alias=alias)
    if size is None or size >= needed:
        return []
    started = (
        f"durable_worker at its default --concurrency {concurrency}"
        if default_concurrency
        else f"durable_worker --concurrency {concurrency}"
    )
    return [
        Warning(
            f"{started} needs {needed} connections of DATABASES[{alias!r}], but its "
            f"connection pool (OPTIONS['pool']) opens at most {size}.",
            hint=(
                f'Set DATABASES["{alias}"]["OPTIONS"]["pool"]["max_size"] to at least '
                "--concurrency + 4 (+ 1 when DURABLE['LISTEN_DATABASE'] is the same alias; "
                "- 1 with DURABLE['COMPLETION_BATCH'] = 1) "
                "in the worker's settings, plus what else the process runs."
            ),
            id="django_durable.W003",
        )
    ]


@register(Tags.compatibility)
def check_pool_size(app_configs=None, **kwargs):
    return pool_size_warnings(WORKER_CONCURRENCY, settings.DATABASES, default_concurrency=True)


def worker_start_warnings(concurrency: int, serialises_writers: bool) -> list[Warning]:
    """What ``durable_worker`` logs at start for the concurrency it really runs with."""
    return [
        *sqlite_concurrency_warning(concurrency, serialises_writers),
        *pool_size_warnings(concurrency, settings.DATABASES),
    ]


@register(Tags.compatibility)
def check_workflow_retention(app_configs=None, **kwargs):
    """``Workflow.retention`` of every registered workflow (it is checked when the class
    is defined too; this sees a value set on the class afterwards)."""
    errors = []
    for workflow in registry.all():
        problem = retention_problem(getattr(workflow, "retention", None))
        if problem is not None:
            errors.append(Error(f"workflow {workflow.name}: {problem}", id="django_durable.E030"))
    return errors


@register(Tags.compatibility)
def check_workflow_flow_control(app_configs=None, **kwargs):
    """Flow control of every registered workflow (``flow_key``, ``concurrency_per_key``,
    ``rate_per_key``, ``concurrency``): checked when the class is defined too; this
    sees a value set on the class afterwards. E040."""
    errors = []
    for workflow in registry.all():
        problem = flow_problem(workflow)
        if problem is not None:
            errors.append(Error(f"workflow {workflow.name}: {problem}", id="django_durable.E040"))
    return errors
