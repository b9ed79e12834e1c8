"""The tables of flow control beside durable_run (docs/flow-control.md): its rate
slots (FlowRateSlot) and its turns (FlowTurn): when each (queue, flow key) was last
given a claim, so that the claim takes due runs in turns across flow keys.

One turn row per (queue, flow key) that was ever claimed from (runs without a flow
key share the row of ``""``: they take their turns as one key); the claim writes it
(durable_claim_v6 on PostgreSQL, the engine's TAKE_TURNS on SQLite), the pruning
deletes the rows of keys idle for a day (store/pruning.py). It holds no limit and no
count: a lost row only makes its key's next turn come first.
"""

from django.db import models
from django.utils.timezone import now

from django_durable.managers import DurableManager


class FlowTurn(models.Model):
    id = models.BigAutoField(primary_key=True)
    queue = models.CharField(max_length=100)
    # "" for runs without a flow key (not a flow key: one is 1 to 255 bytes).
    flow_key = models.CharField(max_length=255, blank=True)
    claimed_at = models.DateTimeField(default=now)

    objects = DurableManager()

    class Meta:
        db_table = "durable_flow_turn"
        ordering = ["queue", "flow_key"]
        constraints = [
            models.UniqueConstraint(fields=["queue", "flow_key"], name="durable_flow_turn_key"),
        ]
        indexes = [
            # A queue's pointer on PostgreSQL: the key its last claim took last
            # (durable_claim_v6 reads the newest row).
            models.Index(fields=["queue", "claimed_at"], name="durable_flow_turn_last"),
        ]

    def __str__(self):
        return f"{self.queue} {self.flow_key or '(no flow key)'} at {self.claimed_at}"


class FlowRateSlot(models.Model):
    """One of a flow key's ``rate_per_key`` slots (docs/flow-control.md, "Rates"): a
    workflow with ``Rate(limit, per)`` has ``limit`` slots per flow key, numbered from
    0; a run's first claim (a begin) takes a slot whose last begin is at least ``per``
    old, by one conditional upsert, so no window of ``per`` holds more than ``limit``
    begins, whatever the isolation level (durable_claim_v6). The worker's pruning
    deletes the rows of keys idle for a day."""

    id = models.BigAutoField(primary_key=True)
    workflow = models.CharField(max_length=200)
    flow_key = models.CharField(max_length=255)
    slot = models.SmallIntegerField()
    begun_at = models.DateTimeField()

    objects = DurableManager()

    class Meta:
        db_table = "durable_flow_rate_slot"
        ordering = ["workflow", "flow_key", "slot"]
        constraints = [
            models.UniqueConstraint(
                fields=["workflow", "flow_key", "slot"], name="durable_flow_rate_slot_key"
            ),
        ]
        indexes = [models.Index(fields=["begun_at"], name="durable_flow_rate_slot_begun")]

    def __str__(self):
        return f"{self.workflow} {self.flow_key} slot {self.slot} begun at {self.begun_at}"
