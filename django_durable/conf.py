"""The ``DURABLE`` settings dict and its defaults.

Read through ``durable_settings()`` so tests that override settings see the change.
"""

from datetime import timedelta
from typing import Any

from django.conf import settings

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
    # How long a stopping worker lets running steps finish before handing them back.
    "SHUTDOWN_GRACE": timedelta(seconds=30),
    # Rows deleted per statement when pruning.
    "PRUNE_BATCH_SIZE": 1000,
    # How often a worker prunes (None: only when durable_prune runs).
    "PRUNE_INTERVAL": None,
    # The LISTEN/NOTIFY channel (PostgreSQL).
    "NOTIFY_CHANNEL": "django_durable",
    # The DATABASES alias workers LISTEN through, on a dedicated connection (it must
    # reach the same database directly or through a session-mode pooler); None: poll only.
    "LISTEN_DATABASE": "default",
}


def durable_settings() -> dict[str, Any]:
    configured = getattr(settings, "DURABLE", {}) or {}
    return {**DEFAULTS, **configured}


def get(name: str) -> Any:
    configured = getattr(settings, "DURABLE", None) or {}
    return configured[name] if name in configured else DEFAULTS[name]
