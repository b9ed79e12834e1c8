"""Settings for the test suite. DURABLE_TEST_DB=postgres (or sqlite, the default)."""

import os
import tempfile

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_filters",
    "django_htmx",
    "django_durable",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

STATIC_URL = "/static/"

if os.environ.get("DURABLE_TEST_DB", "sqlite") == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("PGDATABASE", "test"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "TEST": {"NAME": os.environ.get("DURABLE_TEST_DB_NAME", "test_django_durable")},
        }
    }
else:
    # A file, not :memory:, so that threads and worker processes share the database.
    _path = os.path.join(
        tempfile.gettempdir(), os.environ.get("DURABLE_TEST_DB_NAME", "django_durable_tests")
    )
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _path + ".sqlite3",
            "TEST": {"NAME": _path + "_test.sqlite3"},
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

DURABLE = {}

# A queue limit for worker processes (tests of a deploy that lowers it).
if os.environ.get("DURABLE_TEST_FLOW_QUEUE_LIMIT"):
    DURABLE["QUEUES"] = {"flow": {"concurrency": int(os.environ["DURABLE_TEST_FLOW_QUEUE_LIMIT"])}}

# The worker's alias at another isolation level (tests of the claim's level), by
# psycopg's name: REPEATABLE_READ, SERIALIZABLE.
if os.environ.get("DURABLE_TEST_ISOLATION"):
    from psycopg import IsolationLevel

    DATABASES["default"].setdefault("OPTIONS", {})["isolation_level"] = IsolationLevel[
        os.environ["DURABLE_TEST_ISOLATION"]
    ]

# --- worker tests ------------------------------------------------------------
# Worker subprocesses started by the tests connect to the test database pytest
# created (its name is passed in DURABLE_SUBPROCESS_DB_NAME) and may get short
# leases and intervals, so that recovery and shutdown happen within a test.
from datetime import timedelta  # noqa: E402

if os.environ.get("DURABLE_SUBPROCESS_DB_NAME"):
    DATABASES["default"]["NAME"] = os.environ["DURABLE_SUBPROCESS_DB_NAME"]
for _setting, _variable in [
    ("LEASE", "DURABLE_LEASE_SECONDS"),
    ("HEARTBEAT_INTERVAL", "DURABLE_HEARTBEAT_SECONDS"),
    ("POLL_INTERVAL", "DURABLE_POLL_SECONDS"),
    ("SHUTDOWN_GRACE", "DURABLE_GRACE_SECONDS"),
    ("STREAM_HEARTBEAT", "DURABLE_STREAM_HEARTBEAT_SECONDS"),
]:
    if os.environ.get(_variable):
        DURABLE[_setting] = timedelta(seconds=float(os.environ[_variable]))
if os.environ.get("DURABLE_APPLICATION_NAME"):  # a server the tests run (uvicorn)
    ALLOWED_HOSTS = ["127.0.0.1"]
    # The tests count this process's sessions by this name (PostgreSQL: sqlite3.connect()
    # refuses the keyword, with a TypeError).
    if DATABASES["default"]["ENGINE"].endswith("postgresql"):
        DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = os.environ[
            "DURABLE_APPLICATION_NAME"
        ]
if os.environ.get("DURABLE_MAX_RECOVERIES"):
    DURABLE["MAX_RECOVERIES"] = int(os.environ["DURABLE_MAX_RECOVERIES"])

# The test of an upgrade under traffic (tests/test_upgrade_under_traffic.py) migrates
# with its package: django-durable's migrations and a throwaway next-release one.
if os.environ.get("DURABLE_TEST_MIGRATIONS"):
    MIGRATION_MODULES = {"django_durable": os.environ["DURABLE_TEST_MIGRATIONS"]}

# Django's Tasks framework (django.tasks on Django 6, the django-tasks backport on 5.2).
TASKS = {"default": {"BACKEND": "django_durable.tasks.DurableBackend"}}
# Queue limits for worker subprocesses: DURABLE_QUEUE_LIMITS="limited=2,other=5".
if os.environ.get("DURABLE_QUEUE_LIMITS"):
    DURABLE["QUEUES"] = {
        name: {"concurrency": int(limit)}
        for name, limit in (
            part.split("=") for part in os.environ["DURABLE_QUEUE_LIMITS"].split(",")
        )
    }

# --- deployment variants -------------------------------------------------------
# "replica": the same database under a second alias, as a primary/replica setup has
# it (tests/test_routers.py sends reads there with a router).
DATABASES["replica"] = {
    **DATABASES["default"],
    "OPTIONS": dict(DATABASES["default"].get("OPTIONS", {})),
    "TEST": {"MIRROR": "default"},
}
# "repeatable": the same PostgreSQL database, its sessions at REPEATABLE READ by the
# server's default (not the alias's level): what the claim must detect by itself
# (tests/test_flow_claim_locks.py).
if DATABASES["default"]["ENGINE"].endswith("postgresql"):
    DATABASES["repeatable"] = {
        **DATABASES["default"],
        "OPTIONS": {
            **DATABASES["default"].get("OPTIONS", {}),
            "options": "-c default_transaction_isolation=repeatable\\ read",
        },
        "TEST": {"MIRROR": "default"},
    }
# Processes of tests/test_pgbouncer.py and the pool tests: "default" reaches the
# database through PgBouncer (DURABLE_TEST_PORT), "direct" straight to PostgreSQL,
# and Django's own pool can be sized.
if os.environ.get("DURABLE_TEST_PORT"):
    DATABASES["default"]["PORT"] = os.environ["DURABLE_TEST_PORT"]
if os.environ.get("DURABLE_TEST_DIRECT_PORT"):
    DATABASES["direct"] = {**DATABASES["default"], "PORT": os.environ["DURABLE_TEST_DIRECT_PORT"]}
if os.environ.get("DURABLE_TEST_LISTEN_DATABASE"):
    DURABLE["LISTEN_DATABASE"] = os.environ["DURABLE_TEST_LISTEN_DATABASE"]
# Worker processes of tests/test_terminated_backends.py name their sessions, so that the
# test finds their backends in pg_stat_activity (and never terminates its own).
if os.environ.get("DURABLE_TEST_APPLICATION_NAME"):
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "application_name": os.environ["DURABLE_TEST_APPLICATION_NAME"],
    }
# Processes of the failover tests (tests/standby_pair.py): libpq's connection settings,
# as JSON (target_session_attrs, connect_timeout, keepalives, tcp_user_timeout).
if os.environ.get("DURABLE_TEST_DB_OPTIONS"):
    import json  # noqa: E402

    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        **json.loads(os.environ["DURABLE_TEST_DB_OPTIONS"]),
    }
if os.environ.get("DURABLE_TEST_POOL_MAX_SIZE"):
    DATABASES["default"]["OPTIONS"] = {
        **DATABASES["default"].get("OPTIONS", {}),
        "pool": {"min_size": 1, "max_size": int(os.environ["DURABLE_TEST_POOL_MAX_SIZE"])},
    }
