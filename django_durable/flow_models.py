"""The table of flow control's turns (docs/flow-control.md, "Fairness"): when each
(queue, flow key) was last given a claim, so that the claim takes due runs in turns
across flow keys, the key claimed least recently first, not oldest first.

One row per (queue, flow key) that was ever claimed from (runs without a flow key
share the row of ``""``: they take their turns as one key); the claim writes it
(durable_claim_v2 on PostgreSQL, store/flow.py on SQLite), the worker's pruning
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

    def __str__(self):
        return f"{self.queue} {self.flow_key or '(no flow key)'} at {self.claimed_at}"
