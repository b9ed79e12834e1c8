"""The ``DURABLE`` settings dict and its defaults.

``get()`` reads the dict once and keeps it (a start reads several settings, and
Django's lazy settings object costs a Python call per read); a change of
``DURABLE`` through ``override_settings`` or pytest-django's ``settings`` fixture
(Django's ``setting_changed`` signal) makes it read again.
"""

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

# durable_worker's --concurrency when none is given (the system checks judge it).
WORKER_CONCURRENCY = 1

DEFAULTS: dict[str, Any] = {
    # The DATABASES alias of django-durable's tables: every read and write of them,
    # raw statements and ORM queries alike. A project with a primary/replica router
    # keeps it on the primary (checks.py refuses routers that send them elsewhere: put
    # django_durable.routers.DurableRouter first).
    "DATABASE": "default",
    # Finished runs older than this are deleted by prune(); None keeps them forever.
    "RUN_RETENTION": timedelta(days=30),
    # Activity rows older than this are deleted by prune().
    "ACTIVITY_RETENTION": timedelta(days=7),
    # How long a claimed run belongs to its worker without a heartbeat.
    "LEASE": timedelta(seconds=30),
    # How often a worker renews its leases (must be well under LEASE).
    "HEARTBEAT_INTERVAL": timedelta(seconds=5),
    # How often an idle worker looks for due runs when no NOTIFY arrives.
    "POLL_INTERVAL": timedelta(seconds=1),
    # How often a run's worker may be lost (killed, its lease expired, its database
    # connection dropped mid-step) before the run fails instead of running again.
    "MAX_RECOVERIES": 3,
    # The largest JSON value a step may record (its result, the run's context), in
    # bytes of JSON text; a larger one is a failed attempt of the step.
    "MAX_VALUE_BYTES": 1024 * 1024,
    # How long a stopping worker lets running steps finish before handing them back.
    "SHUTDOWN_GRACE": timedelta(seconds=30),
    # Rows deleted per statement when pruning.
    "PRUNE_BATCH_SIZE": 1000,
    # How often each worker prunes, while RUN_RETENTION or ACTIVITY_RETENTION is set
    # (docs/pruning.md); None: never (only when durable_prune runs).
    "PRUNE_INTERVAL": timedelta(hours=1),
    # The LISTEN/NOTIFY channel (PostgreSQL).
    "NOTIFY_CHANNEL": "django_durable",
    # The DATABASES alias workers LISTEN through, on a dedicated connection (it must
    # reach the same database directly or through a session-mode pooler); None: poll only.
    "LISTEN_DATABASE": "default",
    # What one step attempt keeps of the records it logged (docs/observability.md):
    # at most this many records (0: keep none) and this many bytes of JSON.
    "STEP_LOG_RECORDS": 200,
    "STEP_LOG_BYTES": 64 * 1024,
    # The most completed runs a worker records in one statement (PostgreSQL): a thread
    # that finishes a run's last step hands its record to the worker's recorder and
    # takes its next run (runtime/recorder.py). 1: each thread records its own.
    "COMPLETION_BATCH": 50,
    # Per queue options, e.g. {"emails": {"concurrency": 5}}: at most that many runs of
    # the queue run at once, across all workers (docs/queues.md).
    "QUEUES": {},
    # The most inputs a run keeps of the starts debounce or run_again folded into it
    # (``ctx.inputs``): the newest, the run's own first input counted among them.
    "MAX_FOLDED_INPUTS": 1000,
    # Streams (docs/streams.md): the largest item a step may write, in bytes of JSON
    # text, and the most items one stream of a run holds (a reset item counts).
    "MAX_STREAM_ITEM_BYTES": 65536,
    "MAX_STREAM_ITEMS": 100_000,
    # How long ``stream_response`` stays silent at most: past it, it sends a comment
    # line so proxies keep an idle Server-Sent Events connection open.
    "STREAM_HEARTBEAT": timedelta(seconds=15),
}


# settings.DURABLE itself (not a copy: a change made to the dict in place is seen),
# or None until it is read again.
_configured: dict[str, Any] | None = None


def _durable() -> dict[str, Any]:
    global _configured
    if _configured is None:
        value = getattr(settings, "DURABLE", None)
        _configured = value if value is not None else {}
    return _configured


def _forget(*, setting: str, **kwargs: Any) -> None:
    global _configured
    if setting == "DURABLE":
        _configured = None


setting_changed.connect(_forget, dispatch_uid="django_durable.conf")


def durable_settings() -> dict[str, Any]:
    return {**DEFAULTS, **_durable()}


def get(name: str) -> Any:
    configured = _durable()
    return configured[name] if name in configured else DEFAULTS[name]


def queue_limits() -> dict[str, int]:
    """The queues with a concurrency limit (``DURABLE["QUEUES"][name]["concurrency"]``),
    name -> limit. A bad value raises ``ImproperlyConfigured`` (checks.py reports it
    at startup as django_durable.E020)."""
    limits = {}
    for name, options in (get("QUEUES") or {}).items():
        problem = queue_problem(name, options)
        if problem:
            raise ImproperlyConfigured(problem)
        if options.get("concurrency") is not None:
            limits[name] = options["concurrency"]
    return limits


def queue_problem(name: Any, options: Any) -> str | None:
    """What is wrong with one entry of ``DURABLE["QUEUES"]`` (None: nothing)."""
    if not isinstance(name, str) or not name:
        return f'DURABLE["QUEUES"]: a queue name is a non-empty string, got {name!r}'
    if not isinstance(options, dict):
        return f'DURABLE["QUEUES"][{name!r}] must be a dict, got {type(options).__name__}'
    unknown = set(options) - {"concurrency"}
    if unknown:
        return f'DURABLE["QUEUES"][{name!r}]: unknown options {sorted(unknown)}'
    limit = options.get("concurrency")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        return f'DURABLE["QUEUES"][{name!r}]["concurrency"] must be a whole number >= 1 or None'
    return None
