"""Settings of the benchmark: PostgreSQL only, its own database (``BENCH_DB_NAME``)."""

import os

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_durable",
    "bench",
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("BENCH_DB_NAME", "bench_durable"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        # Like most deployments: connections are not kept between requests. The
        # worker must keep its own connection regardless.
        "CONN_MAX_AGE": 0,
    }
}

# The same database through Django's documented opt-in for prepared statements
# (docs/production.md, "Prepared statements"), off by default: start_new_key_prepared
# starts runs through it (DURABLE["DATABASE"] set to it for that measurement only).
DATABASES["prepared"] = {
    **DATABASES["default"],
    "OPTIONS": {"server_side_binding": True, "prepare_threshold": 5},
}

DURABLE = {}
# The soak (bench/soak.py) prunes as production does, on a short retention.
if os.environ.get("BENCH_RUN_RETENTION_SECONDS"):
    from datetime import timedelta

    DURABLE["RUN_RETENTION"] = timedelta(seconds=float(os.environ["BENCH_RUN_RETENTION_SECONDS"]))
    DURABLE["ACTIVITY_RETENTION"] = DURABLE["RUN_RETENTION"]
if os.environ.get("BENCH_PRUNE_INTERVAL_SECONDS"):
    from datetime import timedelta

    DURABLE["PRUNE_INTERVAL"] = timedelta(seconds=float(os.environ["BENCH_PRUNE_INTERVAL_SECONDS"]))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"django_durable": {"level": "WARNING"}},
}
