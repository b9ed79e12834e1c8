"""The example project: SQLite by default, DATABASE_URL=postgres://... for PostgreSQL."""

import os
from pathlib import Path
from urllib.parse import urlparse

BASE_DIR = Path(__file__).resolve().parent

SECRET_KEY = os.environ.get("SECRET_KEY", "example-project-not-secret")
DEBUG = os.environ.get("DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "example_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "admin:login"

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
    "example_project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
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
        "DIRS": [],
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


def _database(url: str | None) -> dict:
    if not url:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("SQLITE_PATH", str(BASE_DIR.parent / "demo.sqlite3")),
            # IMMEDIATE transactions and WAL: a worker and the web server share the file.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    parts = urlparse(url)
    # postgres://user:password@db1:5432,db2:5432/name: libpq tries the hosts in order
    # (docs/production.md, "High availability").
    hosts = [host.rpartition(":") for host in parts.netloc.rpartition("@")[2].split(",")]
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": parts.username or "",
        "PASSWORD": parts.password or "",
        "HOST": ",".join(host if sep else port for host, sep, port in hosts),
        "PORT": ",".join(port for _host, sep, port in hosts if sep),
        "OPTIONS": {
            # Only the server that accepts writes (a standby is skipped until promoted).
            "target_session_attrs": "read-write",
            # A host that does not answer is given up after 3 s, then the next is tried.
            "connect_timeout": 3,
            # A silent link is noticed within seconds: keepalives for an idle
            # connection, tcp_user_timeout (ms) for data sent and never acknowledged.
            "keepalives": 1,
            "keepalives_idle": 5,
            "keepalives_interval": 2,
            "keepalives_count": 3,
            "tcp_user_timeout": 10000,
        },
    }


DATABASES = {"default": _database(os.environ.get("DATABASE_URL"))}

DURABLE = {}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_durable": {"handlers": ["console"], "level": "INFO"}},
}
