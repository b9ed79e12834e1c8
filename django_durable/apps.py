from importlib import import_module

from django.apps import AppConfig
from django.conf import settings

TASKS_BACKEND = "django_durable.tasks.DurableBackend"


class DurableConfig(AppConfig):
    name = "django_durable"
    label = "django_durable"
    verbose_name = "Durable workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Only imports: workflows register themselves, checks register with Django.
        from django.utils.module_loading import autodiscover_modules

        from django_durable import checks, telemetry  # noqa: F401

        telemetry.install()  # OpenTelemetry receivers; a no-op without opentelemetry-api

        autodiscover_modules("workflows")

        # With the Tasks backend configured, a worker finds task workflows by name.
        backends = (getattr(settings, "TASKS", None) or {}).values()
        if any(backend.get("BACKEND") == TASKS_BACKEND for backend in backends):
            import_module("django_durable.tasks")

        # Declared schedules (``schedules = [Cron(...)]``) become rows after migrate.
        from django.db.models.signals import post_migrate

        from django_durable.operations.schedules import sync_after_migrate
        from django_durable.store import after_migrate

        # A database made without migrations (pytest-django's --nomigrations) gets
        # the store's functions too (PostgreSQL).
        post_migrate.connect(after_migrate, sender=self, dispatch_uid="durable_functions")
        post_migrate.connect(sync_after_migrate, sender=self, dispatch_uid="durable_schedules")
