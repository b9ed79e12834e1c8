"""A stopping worker never gives back a run whose step it still executes (issue 41:
two steps of one flow key at once under a limit of one), and a frozen worker past
its lease stops its step at the step's first ``ctx.heartbeat()`` after it resumes.

Real ``durable_worker`` processes; what ran when is read from the files the step
bodies wrote (tests.testapp.workflows_stopping), never from the database's counts.
A span whose process died without saying "ended" is taken to last a tick past its
last "alive". Every wait has a deadline."""

import signal
import time
from pathlib import Path

import pytest
from django.db import connection

import django_durable as durable
from django_durable.models import Run, Status
from tests.test_flow_processes import peak_overlap
from tests.testapp.workflows_stopping import TICK, OneAtATimeLong
from tests.worker_processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SHORT = {"lease_seconds": 3, "heartbeat_seconds": 0.5, "poll_seconds": 0.2}


def ready_line() -> str:
    return "listening for NOTIFY" if connection.vendor == "postgresql" else " serves "


def start_worker(workers, name: str, **settings):
    worker = workers.start("--worker-id", name, "--queues", "stopping", **{**SHORT, **settings})
    worker.wait_for_output(ready_line(), timeout=60)
    return worker


def spans(folder: Path, run_id=None) -> list[dict]:
    """Each execution of the step: began, its "alive" times, ended (or None)."""
    found = []
    for path in sorted(folder.glob(f"{run_id or ''}*.span")):
        lines = [line.split() for line in path.read_text().splitlines() if line.strip()]
        times = {"began": None, "alive": [], "ended": None}
        for what, at in lines:
            if what == "alive":
                times["alive"].append(float(at))
            else:
                times[what] = float(at)
        found.append(times)
    return found


def interval(span: dict) -> tuple[float, float]:
    end = span["ended"]
    if end is None:  # its process ended first: it ran at most a tick past its last word
        end = max([span["began"], *span["alive"]]) + TICK
    return span["began"], end


def completed(ids) -> bool:
    return Run.objects.filter(id__in=ids, status=Status.COMPLETED).count() == len(ids)


@pytest.mark.parametrize("heartbeat", [False, True], ids=["plain-step", "heartbeating-step"])
def test_sigterm_never_hands_back_a_run_whose_step_still_executes(workers, tmp_path, heartbeat):
    stopped = start_worker(workers, "stopped", grace_seconds=1)
    held = durable.start(
        OneAtATimeLong, {"tenant": "k", "dir": str(tmp_path), "long": 60, "heartbeat": heartbeat}
    )
    wait_until(lambda: spans(tmp_path, held), 60, "the long step to begin")
    after = durable.start(OneAtATimeLong, {"tenant": "k", "dir": str(tmp_path)})
    start_worker(workers, "other")  # ready to take the key's next run at once

    stopped.send(signal.SIGTERM)
    assert stopped.wait(30) == 0
    wait_until(lambda: completed([held, after]), 60, "both runs of the key to complete")

    executed = spans(tmp_path)
    assert len(executed) == 3  # the held run's interrupted step, its rerun, the next run
    assert peak_overlap([interval(span) for span in executed]) == 1, executed
    run = Run.objects.get(id=held)
    if heartbeat:
        # Asked to stop at the end of the grace, the step raised at its next
        # ctx.heartbeat(); its thread handed the run back: no recovery.
        assert run.recoveries == 0
        assert spans(tmp_path, held)[0]["ended"] is not None
    else:
        # Still executing when the worker exited: left to its lease, never handed back.
        assert run.recoveries == 1
        assert "still in its step after the grace period" in stopped.output()


def test_a_frozen_worker_past_its_lease_stops_its_step_at_its_first_heartbeat(workers, tmp_path):
    frozen = start_worker(workers, "frozen")
    held = durable.start(
        OneAtATimeLong, {"tenant": "f", "dir": str(tmp_path), "long": 120, "heartbeat": True}
    )
    wait_until(lambda: spans(tmp_path, held), 60, "the step to begin")
    start_worker(workers, "rescuer")
    frozen.send(signal.SIGSTOP)  # a VM pause, a swap storm: no heartbeat, no step
    try:
        wait_until(lambda: len(spans(tmp_path, held)) == 2, 60, "another worker to begin it")
    finally:
        resumed = time.time()
        frozen.send(signal.SIGCONT)
    wait_until(lambda: spans(tmp_path, held)[0]["ended"], 30, "the frozen step to stop")
    first = spans(tmp_path, held)[0]
    # Its first ctx.heartbeat() after it resumed raised Cancelled: at most the tick
    # it was in when frozen, and the one after it, were written after the resume.
    assert len([at for at in first["alive"] if at > resumed]) <= 2, first
    print(f"the frozen step stopped {1000 * (first['ended'] - resumed):.1f} ms after SIGCONT")
    wait_until(lambda: completed([held]), 60, "the run to complete on the rescuer")
    assert Run.objects.get(id=held).recoveries == 1
