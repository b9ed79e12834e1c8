"""The manager of every django-durable table (its own module: models.py and
flow_models.py both use it)."""

from django.db import models

from django_durable import conf


class DurableManager(models.Manager):
    """Every query of django-durable's tables goes to ``DURABLE["DATABASE"]``, reads
    and writes alike: a run is read where it was written (a replica that lags
    would not have it yet), whatever the project's ``DATABASE_ROUTERS`` say."""

    def get_queryset(self):
        return super().get_queryset().using(conf.get("DATABASE"))
