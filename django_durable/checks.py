"""System checks for the ``DURABLE`` setting (ids ``django_durable.E001``...)."""

from datetime import timedelta

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.urls import NoReverseMatch, reverse

from django_durable import conf
from django_durable.conf import DEFAULTS

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
    for name, least in (("MAX_RECOVERIES", 0), ("MAX_VALUE_BYTES", 1)):
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


def sqlite_concurrency_warning(concurrency: int, vendor: str) -> list[Warning]:
    """Warned by the worker: SQLite serialises writes, so threads mostly wait."""
    if vendor == "sqlite" and concurrency > 1:
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


def sqlite_transaction_warnings(databases: dict) -> list[Warning]:
    """On SQLite, a worker and a web process write the same file. Deferred transactions
    that read before they write fail with "database is locked" instead of waiting;
    IMMEDIATE transactions take the write lock up front and wait their turn."""
    warnings = []
    for alias, config in databases.items():
        if config.get("ENGINE") != "django.db.backends.sqlite3":
            continue
        if (config.get("OPTIONS") or {}).get("transaction_mode") != "IMMEDIATE":
            warnings.append(
                Warning(
                    f"SQLite database {alias!r} does not use IMMEDIATE transactions.",
                    hint=(
                        f'Set DATABASES["{alias}"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE" '
                        '(and "timeout": 30) so django-durable\'s short transactions wait '
                        "for each other instead of failing with 'database is locked'."
                    ),
                    id="django_durable.W002",
                )
            )
    return warnings


HTMX_MIDDLEWARE = "django_htmx.middleware.HtmxMiddleware"


@register(Tags.urls)
def check_dashboard(app_configs=None, **kwargs):
    """The dashboard needs its URLs included and django-htmx's middleware: without
    them the admin links lead nowhere, and pages a project adds on top of ours
    (``request.htmx``) fail."""
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
