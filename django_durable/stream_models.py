"""The tables of live progress and streams (docs/streams.md).

``durable_stream`` holds one short row per (run, stream name): how many items the
stream holds (its next offset), which claim of which step wrote last (so the write
statement itself decides when a new execution of the step starts with a ``reset``
item: the decision survives a worker's crash), the latest value where it is kept
(the ``progress`` stream: ``Run.progress``), and when it was closed.
``durable_stream_item`` holds the items, numbered per (run, stream) from 0: the
named unique constraint makes a duplicate offset impossible, and the stream row's
count, taken and raised in the same statement as the insert, leaves no gap.

Both live outside ``durable_run``: a step writing ten thousand items updates no run
row and no index of the runs table. Both go with their run (``on_delete=CASCADE``;
pruning deletes them first, store/pruning.py).
"""

from django.db import models
from django.db.models import Q
from django.db.models.lookups import GreaterThanOrEqual, LessThanOrEqual
from django.utils.timezone import now

from django_durable.db_functions import OctetLength
from django_durable.managers import DurableManager

# The stream ``ctx.progress`` writes to, whose latest value is ``Run.progress``.
PROGRESS_STREAM = "progress"


class Stream(models.Model):
    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(
        "django_durable.Run", on_delete=models.CASCADE, related_name="streams", db_index=False
    )
    name = models.CharField(max_length=100)
    # How many items the stream holds: the offset of the next one.
    items = models.PositiveIntegerField(default=0)
    # The step (its index) and the claim (the run's fence) of the last write: a write
    # of the same step under a newer claim begins with a reset item.
    step_index = models.PositiveIntegerField(null=True, blank=True)
    fence = models.PositiveIntegerField(null=True, blank=True)
    # Whether the last write began with a reset item (read back by the write).
    reset = models.BooleanField(default=False)
    # The latest value, where the writer keeps it (the progress stream).
    latest = models.JSONField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=now)

    objects = DurableManager()

    class Meta:
        db_table = "durable_stream"
        ordering = ["run", "name"]
        constraints = [
            models.UniqueConstraint(fields=["run", "name"], name="durable_stream_one_per_name"),
            models.CheckConstraint(
                condition=Q(
                    GreaterThanOrEqual(OctetLength("name"), 1),
                    LessThanOrEqual(OctetLength("name"), 100),
                ),
                name="durable_stream_name_length",
            ),
        ]

    def __str__(self):
        return f"{self.run_id} {self.name} ({self.items} items)"


class StreamEntry(models.Model):
    """One item of a stream (``durable.StreamItem`` is what readers get of it)."""

    class Kind(models.TextChoices):
        VALUE = "value"
        RESET = "reset"

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(
        "django_durable.Run", on_delete=models.CASCADE, related_name="+", db_index=False
    )
    stream = models.CharField(max_length=100)
    offset = models.PositiveIntegerField()
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.VALUE)
    value = models.JSONField(null=True, blank=True)
    step = models.CharField(max_length=200)
    attempt = models.PositiveIntegerField()
    written_at = models.DateTimeField(default=now)

    objects = DurableManager()

    class Meta:
        db_table = "durable_stream_item"
        ordering = ["run", "stream", "offset"]
        constraints = [
            # An offset is written once per (run, stream): a reader resuming after
            # offset N never sees an item twice. Its index serves every read.
            models.UniqueConstraint(
                fields=["run", "stream", "offset"], name="durable_stream_item_once"
            ),
            models.CheckConstraint(
                condition=Q(kind__in=["value", "reset"]), name="durable_stream_item_kind_valid"
            ),
        ]

    def __str__(self):
        return f"{self.stream}[{self.offset}] {self.kind}"
