"""Database tables of django-durable.

The rules that keys depend on are enforced here, by the database, with named
constraints: one holder per (workflow, key), one run waiting behind a key,
valid statuses, and keys of 1 to 255 bytes.
"""

import uuid

from django.db import models
from django.db.models import Q
from django.db.models.lookups import GreaterThanOrEqual, LessThanOrEqual
from django.utils.timezone import now

from django_durable.db_functions import OctetLength
from django_durable.flow_models import FlowRateSlot, FlowTurn  # noqa: F401
from django_durable.managers import DurableManager
from django_durable.stream_models import PROGRESS_STREAM, Stream, StreamEntry  # noqa: F401


class Status(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    COMPENSATING = "compensating"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"


ACTIVE_STATUSES = frozenset({Status.PENDING, Status.RUNNING, Status.WAITING, Status.COMPENSATING})
FINISHED_STATUSES = frozenset(
    {
        Status.COMPLETED,
        Status.FAILED,
        Status.CANCELLED,
        Status.COMPENSATED,
        Status.COMPENSATION_FAILED,
    }
)
# Statuses a worker may claim (when the run is due). A compensating run is due
# only while no worker owns it (between compensation attempts, or recovered from
# a dead worker); a claim keeps it compensating.
CLAIMABLE_STATUSES = (Status.PENDING, Status.WAITING, Status.COMPENSATING)
# A run holds a worker while it is running or compensating with a lease: what every
# concurrency limit counts (a dead worker's run counts until its lease runs out).
HELD_STATUSES = (Status.RUNNING, Status.COMPENSATING)
HOLDS_WORKER = Q(status__in=HELD_STATUSES, lease_expires_at__isnull=False)

# The indexes of durable_run for flow control (Run.Meta lists them).
RUN_FLOW_INDEXES = [
    # The claim's flow path (durable_claim_v6): a queue's (flow key, workflow) pairs
    # by a loose index scan from the queue's turn pointer, each pair's due runs in
    # order. The id last: the claim orders by it too, which durable_run_claim cannot
    # give, so even the generic plan of a key holding nearly every run reads this
    # index, never durable_run_claim (where another key's runs sit behind it).
    models.Index(
        fields=["queue", "flow_key", "workflow", "-priority", "due_at", "id"],
        condition=Q(status__in=CLAIMABLE_STATUSES, due_at__isnull=False, flow_key__isnull=False),
        name="durable_run_flow",
    ),
    # The claim's gate: is a flow-keyed run of the queue due? The first entry says,
    # however many flow-keyed runs sleep until later.
    models.Index(
        fields=["queue", "due_at"],
        condition=Q(status__in=CLAIMABLE_STATUSES, due_at__isnull=False, flow_key__isnull=False),
        name="durable_run_flow_due",
    ),
    # The claim's gate: is a run of a workflow with a workflow-wide concurrency due?
    models.Index(
        fields=["workflow", "due_at"],
        condition=Q(status__in=CLAIMABLE_STATUSES, due_at__isnull=False),
        name="durable_run_workflow_due",
    ),
    # The claim's flow path, its runs without a flow key: a queue's due runs
    # without a flow key in claim order. durable_run_claim holds them too, but
    # among the flow-keyed ones: behind a key's backlog of 100,000 due runs,
    # reading it for the first runs without a key would read the backlog.
    models.Index(
        fields=["queue", "-priority", "due_at"],
        condition=Q(status__in=CLAIMABLE_STATUSES, due_at__isnull=False, flow_key__isnull=True),
        name="durable_run_claim_no_flow",
    ),
    # A flow key's begins in the last ``per`` (rate_per_key), newest last: the
    # operator's reads (store/flow_reads.py); the claim reads the rate slots.
    models.Index(
        fields=["workflow", "flow_key", "started_at"],
        condition=Q(flow_key__isnull=False, started_at__isnull=False),
        name="durable_run_flow_begun",
    ),
    # A flow key's running runs (concurrency_per_key), counted by the claim for each
    # key it takes: one index range per key, however many runs other keys hold
    # (durable_run_lease holds them all, without the key).
    models.Index(
        fields=["workflow", "flow_key"],
        condition=Q(
            flow_key__isnull=False,
            status__in=HELD_STATUSES,
            lease_expires_at__isnull=False,
        ),
        name="durable_run_flow_busy",
    ),
]

# The concurrency limits as database rules (docs/flow-control.md): a claimed run of a
# limited scope holds one of the scope's numbered slots (0 to the limit less one),
# and no two runs that hold a worker hold the same slot of a scope. A run that stops
# holding a worker leaves the index by itself: no write frees a slot.
RUN_SLOT_CONSTRAINTS = [
    models.UniqueConstraint(  # concurrency_per_key
        fields=["workflow", "flow_key", "flow_slot"],
        condition=HOLDS_WORKER & Q(flow_slot__isnull=False),
        name="durable_run_flow_slot",
    ),
    models.UniqueConstraint(  # the workflow's concurrency
        fields=["workflow", "workflow_slot"],
        condition=HOLDS_WORKER & Q(workflow_slot__isnull=False),
        name="durable_run_workflow_slot",
    ),
    models.UniqueConstraint(  # a queue's concurrency (DURABLE["QUEUES"])
        fields=["queue", "queue_slot"],
        condition=HOLDS_WORKER & Q(queue_slot__isnull=False),
        name="durable_run_queue_slot",
    ),
]


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workflow = models.CharField(max_length=200)
    queue = models.CharField(max_length=100, default="default")
    status = models.CharField(max_length=20, choices=Status.choices, default=Status.PENDING)
    # Within a queue, due runs with a higher priority are claimed first.
    priority = models.IntegerField(default=0, db_default=0)

    input = models.JSONField(default=dict)
    context = models.JSONField(default=dict)
    result = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)

    # The key the run was started with. It stays after the run stops holding it.
    key = models.CharField(max_length=255, null=True, blank=True)
    holds_key = models.BooleanField(default=False)
    # A run_again run waits behind this run; kept afterwards as history.
    # Indexed only where set (Meta.indexes): most runs have neither, and a start
    # should not pay for index entries of NULLs.
    runs_after = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="children",
        db_index=False,
    )

    # Progress: the next step to run and the attempt of that step.
    step_index = models.PositiveIntegerField(default=0)
    attempt = models.PositiveIntegerField(default=1)

    # When a worker may claim the run. NULL: not due (waits for an event or a holder).
    due_at = models.DateTimeField(null=True, blank=True)
    timeout_at = models.DateTimeField(null=True, blank=True)
    debounce_deadline = models.DateTimeField(null=True, blank=True)
    # What a waiting run waits for: "sleep", "event:<name>", "input:<name>", "children".
    waiting_for = models.CharField(max_length=300, null=True, blank=True)
    # Bookkeeping of waits: the values of the current step's completed waits (a
    # step runs again from its start on resume and its waits return these), the
    # wait it is suspended in, and the event and input received per name.
    state = models.JSONField(default=dict, blank=True)

    # Ownership while running: the worker, its lease, and a fence that grows on
    # every claim so a worker that lost the run cannot record over the new owner.
    worker_id = models.CharField(max_length=200, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    fence = models.PositiveIntegerField(default=0)
    # How often the run's worker was lost while it ran (its lease expired; a database
    # connection dropped mid-step is not counted); past DURABLE["MAX_RECOVERIES"] the
    # run fails.
    # Database defaults too: a process running the previous version inserts runs
    # without these columns during a rolling deploy.
    recoveries = models.PositiveIntegerField(default=0, db_default=0)
    # The names of the workflow's steps when the run started: a run resumes only into
    # the step it was in (durable.DefinitionChanged otherwise). Empty: not recorded.
    step_names = models.JSONField(default=list, db_default=[], blank=True)
    # The OpenTelemetry span context the run was started in (W3C ``traceparent`` and
    # ``tracestate``), so its spans can link to the request that started it. NULL:
    # started outside a trace, or without OpenTelemetry (docs/observability.md).
    trace_context = models.JSONField(null=True, blank=True)

    created_at = models.DateTimeField(default=now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # Replay and repair (docs/replay-and-repair.md). A rerun records the run
    # ``rerun()`` was called with (an id, not a foreign key: it stays after the
    # original is pruned) and the step it began at (NULL: from the first step).
    rerun_of_id = models.UUIDField(null=True, blank=True)
    rerun_from_step = models.CharField(max_length=200, null=True, blank=True)
    # The inputs folded into the run by debounce or run_again, oldest first, the
    # run's own first input among them, at most DURABLE["MAX_FOLDED_INPUTS"] (the
    # newest). NULL: nothing was folded, ``ctx.inputs`` is ``[input]``.
    inputs = models.JSONField(null=True, blank=True)
    # Flow control (docs/flow-control.md): whose work the run is; NULL: none.
    flow_key = models.CharField(max_length=255, null=True, blank=True)
    # The slots the run's claim gave it in its limited scopes (RUN_SLOT_CONSTRAINTS);
    # NULL: that scope has no limit. Set by every claim, meaningful while it runs.
    flow_slot = models.SmallIntegerField(null=True, blank=True)
    workflow_slot = models.SmallIntegerField(null=True, blank=True)
    queue_slot = models.SmallIntegerField(null=True, blank=True)

    objects = DurableManager()

    # Not a column: the log records of the step attempt about to be recorded, set
    # by ``runtime.calling`` after each call and read by the store when it writes
    # the attempt (like ``lease_lost``, which the worker's heartbeat sets).
    attempt_logs: list | None = None

    class Meta:
        db_table = "durable_run"
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["workflow", "key"],
                condition=Q(holds_key=True),
                name="durable_run_one_holder_per_key",
            ),
            models.UniqueConstraint(
                fields=["workflow", "key"],
                condition=Q(runs_after__isnull=False, holds_key=False, status=Status.PENDING),
                name="durable_run_one_waiting_per_key",
            ),
            models.CheckConstraint(
                condition=Q(status__in=Status.values), name="durable_run_status_valid"
            ),
            # 1 to 255 bytes of UTF-8: "" is not "no key", and a long key is an error.
            models.CheckConstraint(
                condition=Q(key__isnull=True)
                | Q(
                    GreaterThanOrEqual(OctetLength("key"), 1),
                    LessThanOrEqual(OctetLength("key"), 255),
                ),
                name="durable_run_key_length",
            ),
            # Only a run with a key can hold one.
            models.CheckConstraint(
                condition=Q(holds_key=False) | Q(key__isnull=False),
                name="durable_run_holder_has_key",
            ),
            models.CheckConstraint(  # a flow key is 1 to 255 bytes, like a key
                condition=Q(flow_key__isnull=True)
                | Q(
                    GreaterThanOrEqual(OctetLength("flow_key"), 1),
                    LessThanOrEqual(OctetLength("flow_key"), 255),
                ),
                name="durable_run_flow_key_length",
            ),
            *RUN_SLOT_CONSTRAINTS,
        ]
        indexes = [
            # The claim: due runs of a queue, highest priority first, then oldest due
            # (a worker of every queue skips through it queue by queue, and the next
            # due time through it priority by priority: store.claims).
            models.Index(
                fields=["queue", "-priority", "due_at"],
                condition=Q(status__in=CLAIMABLE_STATUSES, due_at__isnull=False),
                name="durable_run_claim",
            ),
            models.Index(
                fields=["parent"], condition=Q(parent__isnull=False), name="durable_run_parent"
            ),
            models.Index(
                fields=["runs_after"],
                condition=Q(runs_after__isnull=False),
                name="durable_run_runs_after",
            ),
            # Recovery: running runs whose lease ran out.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status__in=(Status.RUNNING, Status.COMPENSATING)),
                name="durable_run_lease",
            ),
            # Every run started with a key (list_executions, the Key view).
            # pattern ops: also serves key prefix searches (LIKE 'article:%') on PostgreSQL.
            models.Index(
                fields=["key", "workflow"],
                opclasses=["varchar_pattern_ops", "varchar_pattern_ops"],
                name="durable_run_key",
            ),
            models.Index(fields=["workflow", "status"], name="durable_run_workflow_status"),
            # The dashboard's runs list: newest first.
            models.Index(fields=["-created_at"], name="durable_run_created"),
            # The Keys page and list_keys(): keys grouped in (workflow, key) order.
            models.Index(
                fields=["workflow", "key"],
                condition=Q(key__isnull=False),
                name="durable_run_workflow_key",
            ),
            # The Keys page filtered by the holder's status. Its condition names the
            # statuses so that only a query naming a status can use it: the lookup of
            # a key's holder (workflow, key, holds_key) then has only the unique index
            # above. Left a choice, the planner took this one for that lookup when its
            # statistics were from a nearly empty table, and kept it in the prepared
            # statement's plan: a scan of every holder per start.
            models.Index(
                fields=["status", "workflow", "key"],
                condition=Q(holds_key=True, status__in=Status.values),
                name="durable_run_held_status",
            ),
            # Waiting runs, oldest first: the pending inputs page and
            # list_pending_inputs() read a page of them in this order without
            # sorting every waiting run (tens of thousands at a million runs).
            models.Index(
                fields=["created_at", "id"],
                condition=Q(status=Status.WAITING),
                name="durable_run_waiting",
            ),
            # The maintenance sweep of parents waiting for their children, in id order
            # (store.waiting_parents): only they, however many other runs wait.
            models.Index(
                fields=["id"],
                condition=Q(status=Status.WAITING, waiting_for="children"),
                name="durable_run_waiting_parents",
            ),
            # A run's reruns (the run page, ``durable rerun --query`` run twice).
            models.Index(
                fields=["rerun_of_id"],
                condition=Q(rerun_of_id__isnull=False),
                name="durable_run_rerun_of",
            ),
            *RUN_FLOW_INDEXES,  # flow control's (above)
            # Pruning: finished runs by age.
            models.Index(
                fields=["finished_at"],
                condition=Q(status__in=sorted(FINISHED_STATUSES)),  # sorted: one schema
                name="durable_run_finished",
            ),
        ]

    def __str__(self):
        return f"{self.workflow} {self.id} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE_STATUSES

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def progress(self) -> dict | None:
        """The latest ``ctx.progress()`` (``{"done", "total", "message", "at"}``), None
        before the first: kept on the run's ``progress`` stream (stream_models.py), read
        once per instance (a list sets ``_progress`` for its page in one query)."""
        if "_progress" not in self.__dict__:
            self._progress = (
                Stream.objects.filter(run_id=self.id, name=PROGRESS_STREAM)
                .values_list("latest", flat=True)
                .first()
            )
        return self._progress


class HeldKey(Run):
    """The Keys view of runs: one row per key that is held, with its holder."""

    objects = DurableManager()

    class Meta:
        proxy = True
        verbose_name = "key"
        verbose_name_plural = "keys"


class StepAttempt(models.Model):
    class Kind(models.TextChoices):
        STEP = "step"
        COMPENSATION = "compensation"

    class Outcome(models.TextChoices):
        RUNNING = "running"
        COMPLETED = "completed"
        FAILED = "failed"
        SUSPENDED = "suspended"
        CANCELLED = "cancelled"
        LOST = "lost"

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    kind = models.CharField(max_length=20, choices=Kind.choices, default=Kind.STEP)
    step = models.CharField(max_length=200)
    step_index = models.PositiveIntegerField()
    attempt = models.PositiveIntegerField()
    status = models.CharField(max_length=20, choices=Outcome.choices, default=Outcome.RUNNING)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    # What the attempt logged (``runtime.steplogs``): a list of records, bounded.
    logs = models.JSONField(null=True, blank=True)
    worker_id = models.CharField(max_length=200, null=True, blank=True)
    started_at = models.DateTimeField(default=now)
    finished_at = models.DateTimeField(null=True, blank=True)
    # On a completed attempt: what its step (or compensation) replaced in the run's
    # context, ``{name: [old value]}`` or ``{name: []}`` for a name it added; null
    # when it changed nothing. Written once with the attempt; a rerun from a step
    # reads it back (``operations.replay``).
    replaced = models.JSONField(null=True, blank=True)

    objects = DurableManager()

    class Meta:
        db_table = "durable_step_attempt"
        ordering = ["run", "id"]
        constraints = [
            # A step's result is recorded once: recording it again is an error,
            # never a silent overwrite.
            models.UniqueConstraint(
                fields=["run", "kind", "step_index"],
                condition=Q(status="completed"),
                name="durable_step_completed_once",
            ),
            models.CheckConstraint(
                condition=Q(
                    status__in=["running", "completed", "failed", "suspended", "cancelled", "lost"]
                ),
                name="durable_step_attempt_status_valid",
            ),
        ]

    def __str__(self):
        return f"{self.step} #{self.attempt} ({self.status})"


class Event(models.Model):
    """An event or an input sent to a run; kept until the run waits for it."""

    class Kind(models.TextChoices):
        EVENT = "event"
        INPUT = "input"

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.EVENT)
    name = models.CharField(max_length=200)
    payload = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    objects = DurableManager()

    class Meta:
        db_table = "durable_event"
        ordering = ["run", "id"]
        indexes = [models.Index(fields=["run", "kind", "name"], name="durable_event_lookup")]

    def __str__(self):
        return f"{self.kind} {self.name} for {self.run_id}"


class Activity(models.Model):
    """What happened to keys: duplicates, hand-offs, releases, retakes.

    Rows outlive the runs they name (pruning keeps activity for its own
    retention), so the run is referred to by id rather than by a foreign key.
    """

    class Kind(models.TextChoices):
        KEY_DUPLICATE = "key_duplicate"
        KEY_HANDED_OFF = "key_handed_off"
        KEY_RELEASED = "key_released"
        KEY_RETAKEN = "key_retaken"

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=30, choices=Kind.choices)
    run_id = models.UUIDField(null=True, blank=True)
    workflow = models.CharField(max_length=200)
    key = models.CharField(max_length=255, null=True, blank=True)
    details = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=now)

    objects = DurableManager()

    class Meta:
        db_table = "durable_activity"
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "activity"
        indexes = [
            models.Index(fields=["created_at"], name="durable_activity_created"),
            models.Index(fields=["kind", "created_at"], name="durable_activity_kind"),
            models.Index(fields=["run_id"], name="durable_activity_run"),
            models.Index(fields=["workflow", "key"], name="durable_activity_key"),
            # Re-adds of a key in a period (list_keys, the Keys page, stats).
            models.Index(
                fields=["workflow", "key", "created_at"],
                condition=Q(kind="key_duplicate"),
                name="durable_activity_readds",
            ),
        ]

    def __str__(self):
        return f"{self.kind} {self.workflow}:{self.key}"


class Schedule(models.Model):
    name = models.CharField(max_length=200, unique=True)
    workflow = models.CharField(max_length=200)
    cron = models.CharField(max_length=200)
    key = models.CharField(max_length=255, null=True, blank=True)
    input = models.JSONField(default=dict)
    timezone = models.CharField(max_length=64, default="UTC")
    enabled = models.BooleanField(default=True)
    next_fire_at = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    last_run_id = models.UUIDField(null=True, blank=True)
    failures = models.PositiveIntegerField(default=0)
    # Declared on a workflow class (``schedules = [Cron(...)]``): kept in sync with
    # the code, and deleted when the declaration goes away.
    declared = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=now)

    objects = DurableManager()

    class Meta:
        db_table = "durable_schedule"
        ordering = ["name"]
        indexes = [
            # The scheduler's claim: enabled schedules by next fire time.
            models.Index(
                fields=["next_fire_at"], condition=Q(enabled=True), name="durable_schedule_due"
            ),
        ]

    def __str__(self):
        return self.name


class QueueState(models.Model):
    """A queue an operator acted on: ``paused`` queues are not claimed from.

    A queue has a row only once it was paused (or resumed); a queue without one
    runs. The concurrency limits live in settings (``DURABLE["QUEUES"]``), not here.
    """

    name = models.CharField(max_length=100, primary_key=True)
    paused = models.BooleanField(default=False)
    changed_at = models.DateTimeField(default=now)

    objects = DurableManager()

    class Meta:
        db_table = "durable_queue"
        ordering = ["name"]
        verbose_name = "queue"

    def __str__(self):
        return f"{self.name} ({'paused' if self.paused else 'running'})"


class WorkerNode(models.Model):
    """A live worker process; its heartbeat keeps the leases of its runs."""

    id = models.CharField(max_length=200, primary_key=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list)
    concurrency = models.PositiveIntegerField(default=1)
    started_at = models.DateTimeField(default=now)
    heartbeat_at = models.DateTimeField()
    stopping = models.BooleanField(default=False)
    # The workflows it has the code of (names, and "prefix*" for names a finder
    # finds); null: any workflow. It claims only their runs; doctor lists them.
    workflows = models.JSONField(null=True, blank=True, default=None)

    objects = DurableManager()

    class Meta:
        db_table = "durable_worker_node"
        ordering = ["id"]

    def __str__(self):
        return self.id
