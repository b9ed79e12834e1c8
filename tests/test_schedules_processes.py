"""Each tick fires exactly once while three processes fire schedules at once:
three real ``durable_worker`` processes, and three processes calling
``fire_due()`` in a tight loop."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime

import pytest
from django.db import connection

import django_durable as durable
from django_durable.models import Run, Schedule
from tests.testapp.workflows_engine import Tick
from tests.worker_processes import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FIRING_LOOP = textwrap.dedent(
    """
    import sys, time
    import django
    django.setup()
    from django_durable.operations.schedules import fire_due
    end = time.monotonic() + float(sys.argv[1])
    fired = 0
    while time.monotonic() < end:
        fired += fire_due()
        time.sleep(0.005)
    print(fired)
    """
)


def fired_ticks():
    runs = list(Run.objects.filter(workflow="tick"))
    return runs, [datetime.fromisoformat(run.context["durable.schedule"]["tick"]) for run in runs]


def test_three_workers_fire_each_tick_exactly_once(workers):
    durable.schedule(Tick, "* * * * * *", name="every-second")  # seconds field last
    procs = [
        workers.start("--worker-id", f"w{i}", heartbeat_seconds=0.1, lease_seconds=5)
        for i in range(3)
    ]
    for proc in procs:
        proc.wait_for_output("started: queues", timeout=60)
    time.sleep(5)
    for proc in procs:
        proc.send(signal.SIGTERM)
    assert [proc.wait(60) for proc in procs] == [0, 0, 0]

    runs, ticks = fired_ticks()
    assert len(ticks) == len(set(ticks)), sorted(ticks)
    assert len(runs) >= 3
    # The workers ran them too; each run knew its tick (ctx.get("durable.schedule")).
    done = [run for run in runs if run.status == "completed"]
    assert done and all(run.result == run.context["durable.schedule"]["tick"] for run in done)
    assert all(tick.microsecond == 0 for tick in ticks)
    assert Schedule.objects.get(name="every-second").failures == 0


def test_three_processes_calling_fire_due_in_a_loop_fire_each_tick_once():
    durable.schedule(Tick, "* * * * * *", name="every-second")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DURABLE_SUBPROCESS_DB_NAME": str(connection.settings_dict["NAME"]),
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FIRING_LOOP, "5"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120) for p in processes]
    for process, (_out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
    fired_per_process = [int(out.strip()) for out, _ in outputs]

    runs, ticks = fired_ticks()
    # Exactly once: no tick started twice, and every fire a process counted is one run.
    assert len(ticks) == len(set(ticks))
    assert sum(fired_per_process) == len(runs)
    assert len(runs) >= 3
    sched = Schedule.objects.get(name="every-second")
    assert sched.failures == 0
    assert sched.last_run_id in {run.id for run in runs}
