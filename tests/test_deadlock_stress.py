"""26 threads mixing every operation on 2 keys for a bounded time, with a worker thread.

Each thread has its own connection (closed at its end). ``start`` with ``run_again``,
``cancel_existing`` and ``use_existing``, ``cancel``, ``retry``, ``release_key`` and
``send_event`` lock a key's holder and the run waiting behind it in one order
everywhere (docs/architecture.md, "The store"), and a transaction PostgreSQL still
aborts to break a deadlock is run again: no "deadlock detected" may reach a caller,
the worker's executor or its log. The documented refusals (``KeyTaken``,
``NotFailed``, ``AlreadyFinished``, ``KeyContended`` ...) are answers, and counted.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
from collections import Counter

import pytest
from django.db import connection
from django.db.models import Count, Q

import django_durable as durable
from django_durable import step
from django_durable.models import Run, Status, StepAttempt
from django_durable.testing import drain

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

THREADS = 26
KEYS = ["stress:a", "stress:b"]
SECONDS = 15
POLICIES = ["run_again", "cancel_existing", "use_existing"]
OPERATIONS = ["start", "start", "cancel", "retry", "release", "send"]
ACTIVE = [Status.PENDING, Status.RUNNING, Status.WAITING]
FINISHED = [Status.COMPLETED, Status.FAILED, Status.CANCELLED]
# What each operation acts on (its refusals are counted all the same).
TARGETS = {
    "cancel": ACTIVE,
    "retry": [Status.FAILED],
    "release": FINISHED,
    "send": [Status.WAITING, Status.PENDING],
}


def work(self, ctx):
    """Fails when asked (so that retry has runs to act on), or waits for "poke"."""
    if ctx.input.get("fail"):
        raise RuntimeError("asked to fail")
    if ctx.input.get("wait"):
        ctx.wait_for_event("poke")
    return "ok"


def is_deadlock(exc: BaseException) -> bool:
    while exc is not None:
        if "deadlock detected" in str(exc) or type(exc).__name__ == "DeadlockDetected":
            return True
        exc = exc.__cause__ or exc.__context__
    return False


class DeadlockLog(logging.Handler):
    """Every log record of django-durable that mentions a deadlock."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage() + (str(record.exc_info[1]) if record.exc_info else "")
        if "deadlock detected" in text:
            self.records.append(text)


class Mixer(threading.Thread):
    """One caller: random operations on the 2 keys until the deadline."""

    def __init__(self, n: int, workflow, deadline: float):
        super().__init__(daemon=True, name=f"mixer-{n}")
        self.rng = random.Random(n)
        self.workflow, self.deadline = workflow, deadline
        self.answers: Counter[str] = Counter()  # what came back: the op, or its refusal
        self.tried: Counter[str] = Counter()
        self.unexpected: list[BaseException] = []

    def pick(self, statuses) -> object | None:
        """A recent run of the workflow in one of ``statuses`` (a target worth acting on)."""
        recent = list(
            Run.objects.filter(workflow=self.workflow.name, status__in=statuses)
            .order_by("-created_at")
            .values_list("id", flat=True)[:20]
        )
        return self.rng.choice(recent) if recent else None

    def once(self) -> str:
        rng, op = self.rng, self.rng.choice(OPERATIONS)
        target = None
        if op != "start":
            # A run in the state the operation acts on, else any run (then it is refused).
            target = self.pick(TARGETS[op]) or self.pick(ACTIVE + FINISHED)
        if target is None:
            op = "start"
        self.tried[op] += 1
        if op == "start":
            durable.start(
                self.workflow,
                {"fail": rng.random() < 0.25, "wait": rng.random() < 0.5},
                key=rng.choice(KEYS),
                on_duplicate=rng.choice(POLICIES),
            )
        elif op == "cancel":
            durable.cancel(target, reason="stress")
        elif op == "retry":
            durable.retry(target)
        elif op == "release":
            durable.release_key(target, by="stress")
        else:
            durable.send_event(target, "poke", {"from": self.name}, buffer=rng.random() < 0.5)
        return op

    def run(self) -> None:
        try:
            while time.monotonic() < self.deadline:
                try:
                    self.answers[self.once()] += 1
                except durable.DurableError as exc:  # a documented refusal
                    self.answers[type(exc).__name__] += 1
                except Exception as exc:  # deadlocks above all: none may get here
                    self.unexpected.append(exc)
                time.sleep(self.rng.uniform(0, 0.02))  # leave the worker thread a share
        finally:
            connection.close()


class Drainer(threading.Thread):
    """The worker: runs what is due, on its own connection, until told to stop."""

    def __init__(self):
        super().__init__(daemon=True, name="drainer")
        self.stop = threading.Event()
        self.steps = 0
        self.unexpected: list[BaseException] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                try:
                    ran = drain(max_seconds=1)
                except Exception as exc:
                    self.unexpected.append(exc)
                    continue
                self.steps += ran
                if not ran:
                    self.stop.wait(0.02)
        finally:
            connection.close()


def test_26_threads_mixing_every_operation_on_2_keys_meet_no_deadlock(define):
    workflow = define("stress_keyed", work=step(work))
    log = DeadlockLog()
    logging.getLogger("django_durable").addHandler(log)
    deadline = time.monotonic() + SECONDS
    mixers = [Mixer(n, workflow, deadline) for n in range(THREADS)]
    drainer = Drainer()
    try:
        drainer.start()
        for mixer in mixers:
            mixer.start()
        for mixer in mixers:
            mixer.join(SECONDS + 120)
            assert not mixer.is_alive(), f"{mixer.name} is stuck"
    finally:
        drainer.stop.set()
        drainer.join(60)
        logging.getLogger("django_durable").removeHandler(log)
    assert not drainer.is_alive(), "the drainer is stuck"

    unexpected = [exc for m in mixers for exc in m.unexpected] + drainer.unexpected
    deadlocks = [exc for exc in unexpected if is_deadlock(exc)]
    assert deadlocks == [], "".join(traceback.format_exception(deadlocks[0]))
    assert unexpected == [], unexpected[:3]
    assert log.records == [], log.records[:3]
    runs = Run.objects.filter(workflow=workflow.name)
    bad = runs.filter(error__icontains="deadlock detected").first()
    assert bad is None, bad.error
    assert not StepAttempt.objects.filter(error__icontains="deadlock detected").exists()

    answers = sum((m.answers for m in mixers), Counter())
    tried = sum((m.tried for m in mixers), Counter())
    print(f"\n{sum(answers.values())} calls in {SECONDS}s, {drainer.steps} steps: {answers}")
    # The mix exercised what it claims: every operation was called many times, and
    # starts, cancels and events went through.
    assert all(tried[op] > 10 for op in set(OPERATIONS)), tried
    assert all(answers[op] > 0 for op in ("start", "cancel", "send")), answers

    holders = runs.filter(holds_key=True).values("key").annotate(n=Count("id"))
    assert all(row["n"] == 1 for row in holders), list(holders)
    waiting = (
        runs.filter(Q(runs_after__isnull=False), holds_key=False, status=Status.PENDING)
        .values("key")
        .annotate(n=Count("id"))
    )
    assert all(row["n"] <= 1 for row in waiting), list(waiting)
