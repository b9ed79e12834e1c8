"""Each tick fires exactly once while three processes call fire_due() at once."""

import os
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest
from django.db import connection

import django_durable as durable
from django_durable.models import Run, Schedule
from tests.testapp.workflows_engine import Tick

ROOT = Path(__file__).resolve().parent.parent

FIRING_LOOP = textwrap.dedent(
    """
    import sys, time
    import django
    django.setup()
    from django_durable.scheduler import fire_due
    end = time.monotonic() + float(sys.argv[1])
    fired = 0
    while time.monotonic() < end:
        fired += fire_due()
        time.sleep(0.005)
    print(fired)
    """
)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_each_tick_fires_exactly_once_across_three_processes():
    durable.schedule(Tick, "* * * * * *", name="every-second")  # seconds field last
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DURABLE_TEST_DB": "postgres",
        "PGDATABASE": connection.settings_dict["NAME"],
    }
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FIRING_LOOP, "6"],
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

    runs = list(Run.objects.filter(workflow="tick"))
    ticks = [datetime.fromisoformat(run.state["schedule"]["tick"]) for run in runs]
    # Exactly once: no tick started twice, and every fire a process counted is one run.
    assert len(ticks) == len(set(ticks))
    assert sum(fired_per_process) == len(runs)
    assert len(runs) >= 3
    assert all(tick.microsecond == 0 for tick in ticks)
    sched = Schedule.objects.get(name="every-second")
    assert sched.failures == 0
    assert sched.last_run_id in {run.id for run in runs}
