"""The worker behind ``manage.py durable_worker``.

One process: a dispatcher thread claims due runs, a pool of ``concurrency`` threads
executes them (each thread has its own database connection, closed when the thread ends),
a heartbeat thread renews the leases of the runs this worker holds, a maintenance thread
recovers runs of dead workers, and on PostgreSQL a notifier thread wakes the dispatcher on
NOTIFY.

- A claim takes as many runs as there are free threads, in one statement
  (``store.claim``); a thread that finishes a run frees its slot and the dispatcher claims
  again at once. While runs are short (``CLAIM_AHEAD_BELOW``) it also claims runs ahead
  (``RUNS_AHEAD_PER_THREAD``), in batches, so threads never wait for a claim. An idle
  worker waits for a NOTIFY, for the next due time (timers) or for the poll interval,
  whichever comes first.
- Every write the executor makes is fenced by the claim, so a worker that lost a run (its
  lease expired, another worker recovered it) cannot record over the new owner.
- A run whose database connection was lost (a restart, a failover, a terminated
  backend, a session on a standby) is handed back at once, or, while the database is
  out of reach, kept (its lease renewed by the heartbeat) and handed back at the first
  statement that succeeds again: it never waits for its lease, and it is not counted
  as a lost worker (``MAX_RECOVERIES``).
- The first SIGTERM/SIGINT stops claiming; running runs stop after their current step and
  are handed back to ``pending``, never while their step executes (``runtime/stopping.py``:
  after ``DURABLE["SHUTDOWN_GRACE"]``). A second signal exits at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from django.db import DatabaseError, connections

from django_durable import checks, conf, store, telemetry
from django_durable.models import HELD_STATUSES, Run
from django_durable.operations import calls, flow
from django_durable.runtime import executor, leases, maintenance, stopping, telling
from django_durable.runtime.errors import is_connection_fault
from django_durable.runtime.handbacks import HandBacks, hand_back_unknown_claims
from django_durable.runtime.notifier import Notifier
from django_durable.runtime.recorder import Recorder
from django_durable.workflows.definition import registry

logger = logging.getLogger("django_durable.runtime.worker")

# Shortest idle wait when a due run exists that another worker is claiming.
MIN_IDLE_WAIT = 0.05
# Claim runs ahead only while runs take less than this on average (seconds), at most
# this many per thread: a claimed run never waits long behind other runs' steps.
CLAIM_AHEAD_BELOW = 0.05
RUNS_AHEAD_PER_THREAD = 2
# Gives up the GIL a moment, so a thread just woken runs (Unix; elsewhere nothing). Not
# time.sleep(0): it fails in a process whose clock libfaketime fakes (the skew tests).
_yield_gil = getattr(os, "sched_yield", lambda: None)


class WorkerIdInUse(Exception):
    """Another live worker (one that heartbeated within the lease) has this id."""


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def as_seconds(value: timedelta | float) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


@dataclass(eq=False)
class Held:
    """A run this worker claimed. ``fence`` is the claim's: it is what makes writes count."""

    run: Run
    fence: int


class Worker:
    """Claims and executes due runs until stopped (or, with ``burst``, until nothing is due)."""

    def __init__(
        self,
        *,
        queues: Sequence[str] | None = None,
        concurrency: int = 1,
        burst: bool = False,
        worker_id: str | None = None,
        poll_interval: timedelta | float | None = None,
    ):
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {concurrency}")
        settings = conf.durable_settings()
        self.queues = list(queues) if queues else None
        self.concurrency = concurrency
        self.burst = burst
        self.worker_id = worker_id or default_worker_id()
        self.poll_interval = as_seconds(
            settings["POLL_INTERVAL"] if poll_interval is None else poll_interval
        )
        if self.poll_interval <= 0:
            raise ValueError(f"poll interval must be positive, got {poll_interval!r}")
        self.lease: timedelta = settings["LEASE"]
        self.heartbeat_interval = as_seconds(settings["HEARTBEAT_INTERVAL"])
        self.shutdown_grace = as_seconds(settings["SHUTDOWN_GRACE"])
        self.listen_alias = settings["LISTEN_DATABASE"]
        self.channel = settings["NOTIFY_CHANNEL"]
        self.upkeep = maintenance.Maintenance(self)
        self.outage = leases.Outage(self.worker_id)
        # The workflows this process has the code of: it claims only their runs, so a
        # worker running older code leaves a new workflow's runs to one that knows it.
        served = registry.served()
        self.workflows, self.prefixes = served if served else (None, [])
        self.served = served and [*served[0], *(p + "*" for p in served[1])]  # None: any

        self._lock = threading.Lock()
        self._run_ready = threading.Condition(self._lock)  # threads wait for a claimed run
        self._dispatch = threading.Condition(self._lock)  # the dispatcher waits for a reason
        self._ready: deque[Held] = deque()  # claimed, not yet picked up by a thread
        self._executing: set[Held] = set()
        # Given up while the database was out of reach: handed back once it answers.
        self.handbacks = HandBacks()
        # A claim lost its connection: the runs it may have given are looked for first.
        self._claim_in_doubt = False
        self._run_seconds: float | None = None  # how long runs take (moving average)
        self._wake = False
        self._stopping = threading.Event()
        self._stop_asked: float | None = None  # time.monotonic() of the first stop()
        self._finished = threading.Event()
        self._failed = False
        self.notifier: Notifier | None = None
        self.runs_executed = 0
        # Last steps' records in batches (runtime/recorder.py), on PostgreSQL.
        batch = settings["COMPLETION_BATCH"]
        self.recorder = Recorder(batch) if batch > 1 and store.engine().BATCHES else None

    # --- public controls ---------------------------------------------------

    def run(self, *, install_signal_handlers: bool = True) -> int:
        """Work until stopped; return the exit code (0 on a clean stop; 1 when the
        database is not migrated, saying so)."""
        if (problem := calls.not_migrated()) is not None:
            logger.error("worker %s cannot start: %s", self.worker_id, problem)
            return 1
        for warning in checks.worker_start_warnings(
            self.concurrency, store.engine().SERIALISES_WRITERS
        ):
            logger.warning("%s %s [%s]", warning.msg, warning.hint, warning.id)
        self._register()
        if not store.db().in_atomic_block:
            store.db().close()  # this thread only waits from now on; the others have their own
        restore = stopping.install_signal_handlers(self) if install_signal_handlers else None
        slots = [
            threading.Thread(target=self._slot_loop, name=f"durable-slot-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        heartbeat = threading.Thread(target=leases.heartbeat_loop, args=(self, self._finished))
        heartbeat.name, heartbeat.daemon = "durable-heartbeat", True
        threads = [*slots, heartbeat]
        for target, args, name in (
            (self.upkeep.loop, (), "durable-maintenance"),
            (self._dispatch_loop, (), "durable-dispatch"),
        ):
            threads.append(threading.Thread(target=target, args=args, name=name, daemon=True))
        if self.recorder:
            loop = self.recorder.loop
            threads.append(threading.Thread(target=loop, name="durable-recorder", daemon=True))
        if self.listen_alias and store.engine(connections[self.listen_alias]).LISTENS:
            self.notifier = Notifier(
                channel=self.channel,
                queues=self.queues,
                on_wake=self.wake,
                stop=self._stopping,
                alias=self.listen_alias,
            )
            threads.append(self.notifier)
        logger.info(
            "worker %s started: queues %s, concurrency %d, poll every %.2fs%s; %s",
            self.worker_id,
            ",".join(self.queues) if self.queues else "(all)",
            self.concurrency,
            self.poll_interval,
            ", burst" if self.burst else "",
            maintenance.describe_pruning(),
        )
        served = None if self.workflows is None else (self.workflows, self.prefixes)
        logger.info("worker %s %s", self.worker_id, telling.served(served, registry.all()))
        for thread in threads:
            thread.start()
        try:
            # The main thread only waits, so a signal handler never meets a lock it holds.
            while not self._finished.wait(0.5):
                pass
        finally:
            if restore:
                restore()
        # Threads still in a step past the grace period are left behind (daemons), and
        # the heartbeat that renews their leases until the process exits.
        left = self.executing()
        deadline = time.monotonic() + 2
        for thread in threads:
            if not left or (thread is not heartbeat and thread not in slots):
                thread.join(timeout=max(0.0, deadline - time.monotonic()))
        connections.close_all()
        took = time.monotonic() - (self._stop_asked or time.monotonic())
        said = "worker %s stopped (%d runs executed), %.3fs after it began to stop"
        logger.info(said, self.worker_id, self.runs_executed, took)
        return 1 if self._failed else 0

    def stop(self) -> None:
        """Stop claiming; running runs stop after their current step and are handed back."""
        if self._stop_asked is None:
            self._stop_asked = time.monotonic()
        self._stopping.set()
        if self.notifier is not None:
            self.notifier.interrupt()  # not at its LISTEN's next slice
        with self._lock:
            self._run_ready.notify_all()
            self._dispatch.notify_all()

    def wake(self) -> None:
        """Claim now (a NOTIFY arrived, runs were recovered, a schedule fired)."""
        with self._lock:
            self._wake = True
            self._dispatch.notify()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def wait_for_stop(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; True as soon as the worker is stopping."""
        return self._stopping.wait(timeout)

    def claim_batch(self, limit: int) -> list[Run]:
        """Claim up to ``limit`` due runs in one statement."""
        return store.claim(
            worker_id=self.worker_id,
            queues=self.queues,
            limit=limit,
            lease=self.lease,
            workflows=self.workflows,
            prefixes=self.prefixes,
            flow_limits=flow.claim_limits(),
        )

    def executing(self) -> bool:
        """Is a step of this worker executing (or a run between its steps)?"""
        with self._lock:
            return bool(self._executing)

    def held(self) -> list[Held]:
        with self._lock:
            recording = self.recorder.held() if self.recorder else []
            return [*self._executing, *self._ready, *self.handbacks.held(), *recording]

    def return_lost_runs(self) -> None:
        """Hand back the runs given up during an outage (``handbacks``)."""
        if self.handbacks:
            self.handbacks.hand_back_all()

    # --- registration -----------------------------------------------------------

    def _register(self) -> None:
        stale_before = store.now() - self.lease
        if not store.register_worker(
            self.worker_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            queues=self.queues or [],
            concurrency=self.concurrency,
            stale_before=stale_before,
            workflows=self.served,
        ):
            raise WorkerIdInUse(
                f"a live worker already uses the id {self.worker_id!r} "
                "(it heartbeated within the lease); pick another --worker-id"
            )

    # --- dispatcher ----------------------------------------------------------

    def _dispatch_loop(self) -> None:
        try:
            while not self._stopping.is_set():
                with self._lock:
                    while not self._stopping.is_set() and not self._should_claim():
                        self._dispatch.wait()
                    free = self._claimable()
                    self._wake = False
                if self._stopping.is_set():
                    break
                try:
                    self.outage.refresh()
                    self.return_lost_runs()
                    if self._claim_in_doubt:
                        self._hand_back_claims_in_doubt()
                    runs = self.claim_batch(free)
                except DatabaseError as exc:
                    # A claim whose connection was lost may have committed all the same
                    # (a failover at its commit): looked for before the next one.
                    self._claim_in_doubt = self._claim_in_doubt or is_connection_fault(exc)
                    self.outage.failed("claiming", exc)
                    self._wait_for_wake(self.poll_interval)
                    continue
                self.outage.succeeded("claiming")
                if runs:
                    self._hand_out(runs)
                    if len(runs) == free:
                        continue  # likely more due: claim again as soon as a slot frees
                elif self.burst and self._idle():
                    if self._recover_before_burst_exit():
                        continue
                    logger.info("worker %s: %s", self.worker_id, self._burst_left())
                    break
                self._wait_for_wake(self._idle_timeout())
        except BaseException:
            logger.exception("worker %s: the dispatcher failed", self.worker_id)
            self._failed = True
        finally:
            try:
                self._shutdown()
            finally:
                connections.close_all()
                self._finished.set()

    def _hand_back_claims_in_doubt(self) -> None:
        hand_back_unknown_claims(self.worker_id, [held.run.id for held in self.held()])
        self._claim_in_doubt = False

    def _claimable(self) -> int:
        """How many runs a claim may take now (called with the lock held)."""
        quick = self._run_seconds is not None and self._run_seconds < CLAIM_AHEAD_BELOW
        ahead = RUNS_AHEAD_PER_THREAD * self.concurrency if quick else 0
        return self.concurrency + ahead - len(self._ready) - len(self._executing)

    def _should_claim(self) -> bool:
        """A thread is free, or, claiming ahead, half the runs ahead were taken."""
        free = self._claimable()
        if free <= 0:
            return False
        return not self._ready or free >= max(1, self.concurrency // 2)

    def _hand_out(self, runs: list[Run]) -> None:
        with self._lock:
            self._ready.extend(Held(run, run.fence) for run in runs)
            self._run_ready.notify(len(runs))
        _yield_gil()  # a woken thread starts its run now, not after this thread's next claim

    def _idle(self) -> bool:
        with self._lock:
            recording = self.recorder.pending() if self.recorder else 0
            return not self._ready and not self._executing and not recording

    def _recover_before_burst_exit(self) -> bool:
        try:
            return bool(maintenance.recover().ids)
        except DatabaseError:
            store.reset_connection_after_error()
            return False

    def _burst_left(self) -> str:
        try:
            return telling.burst_left(self)
        except DatabaseError:
            store.reset_connection_after_error()
            return "nothing it may claim is due, stopping (burst)"

    def _idle_timeout(self) -> float:
        """Until the next timer is due, but no longer than the poll interval."""
        try:
            due = store.next_due_at(self.queues)
        except DatabaseError:
            store.reset_connection_after_error()
            return self.poll_interval
        if due is None:
            return self.poll_interval
        until = (due - store.now()).total_seconds()
        return min(self.poll_interval, max(until, MIN_IDLE_WAIT))

    def _wait_for_wake(self, timeout: float) -> None:
        with self._lock:
            if not self._wake and not self._stopping.is_set():
                self._dispatch.wait(timeout)

    # --- execution threads ------------------------------------------------------

    def _slot_loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._ready and not self._stopping.is_set():
                        self._run_ready.wait()
                    if self._stopping.is_set():
                        return  # claimed runs not yet started are handed back at shutdown
                    held = self._ready.popleft()
                    self._executing.add(held)
                started = time.monotonic()
                try:
                    self.outage.refresh()
                    self.execute(held)
                finally:
                    took = time.monotonic() - started
                    with self._lock:
                        self._executing.discard(held)
                        self.runs_executed += 1
                        average = self._run_seconds
                        self._run_seconds = took if average is None else 0.8 * average + 0.2 * took
                        self._wake = True
                        self._dispatch.notify_all()
        finally:
            connections.close_all()

    def execute(self, held: Held) -> None:
        """Execute one claimed run and log its start and its outcome."""
        run = held.run
        run.lease_lost = getattr(run, "lease_lost", False)
        logger.info(
            "run %s (%s) started: step %d, attempt %d",
            run.id,
            run.workflow,
            run.step_index,
            run.attempt,
            extra=(fields := telemetry.log_fields(run)),
        )
        started = time.monotonic()
        steps = 0
        handed: list[executor.LastStep] = []
        try:
            if not run.lease_lost:
                steps = executor.execute(
                    run,
                    should_stop=lambda: self._stopping.is_set() or run.lease_lost,
                    completions=self.recorder and self._hand_over(held, started, handed),
                )
        except BaseException as exc:  # even SystemExit from a step must not end this thread
            if isinstance(exc, DatabaseError) and is_connection_fault(exc):
                # Outside a step (its own faults are handed back by the executor): the
                # run is still claimed, and is handed back below or once the database
                # answers. Said once per outage, not once per run.
                self.outage.failed("executing a run", exc)
            else:
                logger.exception(
                    "run %s (%s): executing it failed", run.id, run.workflow, extra=fields
                )
                store.reset_connection_after_error()
        else:
            self.outage.succeeded("executing a run")
        if not handed:  # else the recorder reports the outcome once it is written
            self._outcome(held, steps, started)

    def _hand_over(self, held: Held, started: float, handed: list) -> Callable:
        """The executor's ``completions`` for ``held``: its last step's record goes to
        the recorder, which reports the run's outcome once it is written."""
        first = held.run.step_index

        def recorded() -> None:
            self._outcome(held, held.run.step_index - first, started)
            self.wake()  # its thread may be idle, and its end may have made runs due

        def hand_over(last: executor.LastStep) -> None:
            handed.append(last)
            self.recorder.add(held, last, recorded)

        return hand_over

    def _outcome(self, held: Held, steps: int, started: float) -> None:
        """Log how ``held``'s execution ended; a run still claimed is given up."""
        run = held.run
        outcome = run.status
        if run.status in HELD_STATUSES:
            outcome = self._give_up(held)
        said = telling.outcome(run, outcome, steps, time.monotonic() - started)
        # A failure was said at ERROR, with its traceback, where it was recorded.
        log = logger.debug if getattr(run, "failure_said", None) else logger.info
        log("run %s (%s) %s", run.id, run.workflow, said, extra=telemetry.log_fields(run))

    def _give_up(self, held: Held) -> str:
        """The run is still claimed in memory: hand it back, or say who has it now."""
        return self.handbacks.give_up(held)

    # --- heartbeat ------------------------------------------------------------

    def heartbeat(self) -> set:
        """Renew this worker's leases; the ids of the runs it lost (``leases.renew``)."""
        return leases.renew(self)

    # --- shutdown (runtime/stopping.py) ------------------------------------------

    def take_unstarted(self) -> list[Held]:
        """The runs claimed but not started, and those kept during an outage."""
        with self._lock:
            unstarted = [*self._ready, *self.handbacks.take_all()]
            self._ready.clear()
        return unstarted

    def wait_for_steps(self, seconds: float, among: list[Held] | None = None) -> list[Held]:
        """Wait up to ``seconds`` until no run (of ``among``) executes; those that still do."""
        deadline = time.monotonic() + seconds
        with self._lock:
            while (left := [h for h in among or [*self._executing] if h in self._executing]) and (
                remaining := deadline - time.monotonic()
            ) > 0:
                self._dispatch.wait(remaining)
            return left

    def _shutdown(self) -> None:
        stopping.shut_down(self)
