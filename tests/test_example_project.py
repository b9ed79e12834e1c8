"""The demo's pieces work: the example project migrates, its traffic produces every
kind of re-add, and a worker runs the workflows."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def manage(tmp_path, *args, timeout=120):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "SQLITE_PATH": str(tmp_path / "demo.sqlite3"),
    }
    env.pop("DATABASE_URL", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )


@pytest.mark.slow
def test_traffic_shows_every_key_feature_and_a_worker_runs_it(tmp_path):
    manage(tmp_path, "migrate", "--noinput", "-v", "0")
    out = manage(tmp_path, "durable_traffic", "--seed", "1").stdout
    for outcome in ("started", "use_existing", "KeyTaken", "run_again", "debounced"):
        assert outcome in out, out
    manage(tmp_path, "durable_worker", "--burst", "--concurrency", "4", timeout=300)
    # --burst stops when nothing is due now: a retry backoff or a debounce period
    # may still be pending, but nothing is left running.
    counts = manage(
        tmp_path,
        "shell",
        "-c",
        (
            "import json; from collections import Counter; from django_durable.models import Run; "
            "print(json.dumps(Counter(Run.objects.values_list('status', flat=True))))"
        ),
    ).stdout
    statuses = json.loads(counts.strip().splitlines()[-1])
    assert statuses.get("completed", 0) >= 10 and "running" not in statuses, counts
