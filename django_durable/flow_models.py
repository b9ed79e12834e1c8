"""The table of flow control's turns (docs/flow-control.md, "Fairness"): when each
(queue, flow key) was last given a claim, so that the claim takes due runs in turns
across flow keys, the key claimed least recently first, not oldest first.

One row per (queue, flow key) that was ever claimed from (runs without a flow key
share the row of ``""``: they take their turns as one key); the claim writes it
(durable_claim_v4 on PostgreSQL, store/flow.py on SQLite), the worker's pruning
deletes the rows of keys idle for a day (store/pruning.py). It holds no limit and no
count: a lost row only makes its key's next turn come first.
"""

from django.db import models
from django.db.models import Q
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
            # (durable_claim_v4 reads the newest row).
            models.Index(fields=["queue", "claimed_at"], name="durable_flow_turn_last"),
        ]

    def __str__(self):
        return f"{self.queue} {self.flow_key or '(no flow key)'} at {self.claimed_at}"


# The indexes of durable_run for flow control (models.Run.Meta lists them). The
# claimable statuses as models.CLAIMABLE_STATUSES names them (models imports this
# module, so not from there).
CLAIMABLE = ("pending", "waiting", "compensating")
RUN_FLOW_INDEXES = [
    # The claim with flow keys (durable_claim_v4): a queue's (flow key,
    # workflow) pairs by a loose index scan, each pair's due runs in order. The id
    # last: the claim orders by it too, which durable_run_claim cannot give, so even
    # the generic plan of a key holding nearly every run reads this index, never
    # durable_run_claim (where another key's runs sit behind that backlog).
    models.Index(
        fields=["queue", "flow_key", "workflow", "-priority", "due_at", "id"],
        condition=Q(status__in=CLAIMABLE, due_at__isnull=False, flow_key__isnull=False),
        name="durable_run_flow",
    ),
    # The claim with flow keys (durable_claim_v4), level by level: the (flow key,
    # workflow) pairs with claimable runs of one priority, by a loose index scan from
    # the queue's pointer, and a pair's due runs at that priority in order.
    models.Index(
        fields=["queue", "-priority", "flow_key", "workflow", "due_at", "id"],
        condition=Q(status__in=CLAIMABLE, due_at__isnull=False, flow_key__isnull=False),
        name="durable_run_flow_level",
    ),
    # The claim with flow keys, its runs without one: a queue's due runs
    # without a flow key in claim order. durable_run_claim holds them too, but
    # among the flow-keyed ones: behind a key's backlog of 100,000 due runs,
    # reading it for the first runs without a key would read the backlog.
    models.Index(
        fields=["queue", "-priority", "due_at"],
        condition=Q(status__in=CLAIMABLE, due_at__isnull=False, flow_key__isnull=True),
        name="durable_run_claim_no_flow",
    ),
    # A flow key's begins in the last ``per`` (rate_per_key), newest last.
    models.Index(
        fields=["workflow", "flow_key", "started_at"],
        condition=Q(flow_key__isnull=False, started_at__isnull=False),
        name="durable_run_flow_begun",
    ),
    # A flow key's running runs (concurrency_per_key), counted by the claim for each
    # key it takes (durable_key_running_v1): one index range per key, however many
    # runs other keys hold (durable_run_lease holds them all, without the key).
    models.Index(
        fields=["workflow", "flow_key"],
        condition=Q(
            flow_key__isnull=False,
            status__in=("running", "compensating"),
            lease_expires_at__isnull=False,
        ),
        name="durable_run_flow_busy",
    ),
]
