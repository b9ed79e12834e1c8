"""Settings of the django-tasks-db peer: Django's Tasks framework (the ``django-tasks``
backport on Django 5.2) with the database backend, on a database of its own."""

import os

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = ["django_tasks", "django_tasks_db"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("BENCH_DB_NAME", "bench_tasks_db"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        "CONN_MAX_AGE": 0,
    }
}

TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"django_tasks": {"level": "WARNING"}},
}
