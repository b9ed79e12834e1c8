"""A database router that keeps django-durable's models on ``DURABLE["DATABASE"]``.

django-durable's statements and its models' managers always use
``DURABLE["DATABASE"]``, but Django asks the project's routers alone where
``migrate`` creates its tables and where an instance's ``save()`` or ``delete()``
writes when a router answers. A primary/replica router (or any router with an
opinion on every model) then disagrees with django-durable about where its rows
live. Putting this router first in ``DATABASE_ROUTERS`` sends every read, write
and migration of django-durable's models to that one alias; it has no opinion on
any other model, so the project's routers decide those as before.

    DATABASE_ROUTERS = ["django_durable.routers.DurableRouter", "myproject.routers.Replicas"]

System check ``django_durable.E016`` reports a router setup that sends
django-durable's writes elsewhere.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Model

from django_durable import conf

APP_LABEL = "django_durable"


class DurableRouter:
    """Reads, writes and migrations of ``django_durable`` models go to ``DURABLE["DATABASE"]``."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str | None:
        return conf.get("DATABASE") if model._meta.app_label == APP_LABEL else None

    def db_for_write(self, model: type[Model], **hints: Any) -> str | None:
        return conf.get("DATABASE") if model._meta.app_label == APP_LABEL else None

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool | None:
        if obj1._meta.app_label == APP_LABEL and obj2._meta.app_label == APP_LABEL:
            return True
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        if app_label == APP_LABEL:
            return db == conf.get("DATABASE")
        return None
