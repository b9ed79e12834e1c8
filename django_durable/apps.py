from django.apps import AppConfig


class DurableConfig(AppConfig):
    name = "django_durable"
    label = "django_durable"
    verbose_name = "Durable workflows"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        # Only imports: workflows register themselves, checks register with Django.
        from django.utils.module_loading import autodiscover_modules

        from . import checks, telemetry  # noqa: F401

        telemetry.install()  # OpenTelemetry receivers; a no-op without opentelemetry-api

        autodiscover_modules("workflows")
