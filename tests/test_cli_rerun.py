"""``durable rerun``: one run, or every finished run a search matches; safe to run
twice."""

import uuid

import pytest
from django.utils import timezone

import django_durable as durable
from django_durable.models import Run, Status, StepAttempt
from django_durable.testing import drain
from tests.test_cli import durable_cmd
from tests.test_replay import BROKEN, FourSteps, broken  # noqa: F401 (fixture)
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db

MANY = 1000


def _failed_runs(count, *, prefix="order"):
    """``count`` runs of FourSteps that failed at step 3, written in bulk as a worker
    would have left them (attempts of steps 1 to 3, the context of steps 1 and 2 with
    what each changed), each holding its key."""
    at = timezone.now()
    undo = {"0": {"body": [], "tries": []}, "1": {"charged": [], "tries": [[]]}}
    runs = [
        Run(
            id=uuid.uuid4(),
            workflow=FourSteps.name,
            status=Status.FAILED,
            input={"id": n},
            context={"body": f"article {n}", "charged": 10},
            state={"undo": undo},
            error={"type": "RuntimeError", "message": "the deploy broke step 3"},
            key=f"{prefix}:{n}",
            holds_key=True,
            step_index=2,
            step_names=list(FourSteps.step_names()),
            created_at=at,
            started_at=at,
            finished_at=at,
        )
        for n in range(count)
    ]
    Run.objects.bulk_create(runs, batch_size=500)
    attempts = [
        StepAttempt(
            run_id=run.id,
            step=name,
            step_index=index,
            attempt=1,
            status="failed" if index == 2 else "completed",
            started_at=at,
            finished_at=at,
        )
        for run in runs
        for index, name in enumerate(FourSteps.step_names()[:3])
    ]
    StepAttempt.objects.bulk_create(attempts, batch_size=1000)
    return runs


def test_a_search_of_a_thousand_failed_runs_is_rerun_once(broken):  # noqa: F811
    originals = _failed_runs(MANY)
    query = f"workflow:{FourSteps.name} status:failed"
    total = Run.objects.count()

    code, out, _ = durable_cmd("rerun", "--query", query, "--from-step", "publish")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == MANY + 1 and "nothing was done" in lines[-1]
    assert all("would rerun" in line for line in lines[:-1])
    assert Run.objects.count() == total  # without --yes: nothing written

    code, out, _ = durable_cmd("rerun", "--query", query, "--from-step", "publish", "--yes")
    assert code == 0, out
    lines = out.splitlines()
    assert len(lines) == MANY + 1
    assert lines[-1] == f"{MANY} rerun from step 'publish', 0 refused"
    assert Run.objects.count() == total + MANY
    reruns = Run.objects.filter(rerun_of_id__in=[r.id for r in originals])
    assert reruns.count() == MANY
    assert set(reruns.values_list("rerun_from_step", flat=True)) == {"publish"}
    assert set(reruns.values_list("step_index", flat=True)) == {2}
    one = reruns.get(key="order:7")
    assert one.context == {"body": "article 7", "charged": 10} and one.holds_key
    assert not Run.objects.get(id=one.rerun_of_id).holds_key

    # The same command again: every run was rerun from that step already.
    code, out, _ = durable_cmd("rerun", "--query", query, "--from-step", "publish", "--yes")
    assert code == 0
    assert out.splitlines()[-1].startswith("0 rerun from step 'publish', 0 refused, 1000 already")
    assert Run.objects.count() == total + MANY

    # The reruns run from step 3 on (a few of them, to keep the test short).
    BROKEN["charge"] = False
    Run.objects.filter(rerun_of_id__isnull=False).exclude(key__in=["order:1", "order:2"]).update(
        due_at=None
    )
    drain()
    for key in ("order:1", "order:2"):
        run = Run.objects.get(key=key, rerun_of_id__isnull=False)
        assert run.status == Status.COMPLETED
        assert not Execution.objects.filter(run_id=run.id, step__in=["fetch", "charge"]).exists()
        assert run.result["notified"] == f"article {key[-1]}"


def test_refused_runs_make_exit_status_1_and_again_reruns_once_more(broken):  # noqa: F811
    (free,) = _failed_runs(1, prefix="free")
    (taken,) = _failed_runs(1, prefix="taken")
    # Another run holds the key now: the rerun of ``taken`` is refused, naming it.
    Run.objects.filter(id=taken.id).update(holds_key=False)
    holder = durable.start(FourSteps, {"id": 99}, key=taken.key)
    query = f"workflow:{FourSteps.name} status:failed"
    code, out, err = durable_cmd("rerun", "--query", query, "--yes")
    assert code == 1 and "1 of 2 run(s) refused" in err
    assert f"{taken.id} {FourSteps.name}: refused: key held by run {holder}" in out
    assert f"{free.id} {FourSteps.name}: rerun as " in out
    code, out, _ = durable_cmd("rerun", "--query", query, "--yes", "--again")
    assert code == 1
    assert Run.objects.filter(rerun_of_id=free.id).count() == 1  # its rerun holds the key
    assert "refused" in out


def test_one_run_with_a_step_and_an_input(broken):  # noqa: F811
    (run,) = _failed_runs(1, prefix="one")
    code, out, _ = durable_cmd(
        "rerun", str(run.id), "--from-step", "charge", "--input", '{"id": 5, "amount": 3}'
    )
    assert code == 0 and out.startswith("new run ")
    new = Run.objects.get(rerun_of_id=run.id)
    assert new.input == {"id": 5, "amount": 3} and new.rerun_from_step == "charge"
    assert new.context == {"body": "article 0", "tries": []}


def test_bad_usage_and_refusals_of_one_run(broken):  # noqa: F811
    (run,) = _failed_runs(1, prefix="bad")
    assert durable_cmd("rerun")[0] == 2
    assert durable_cmd("rerun", str(run.id), "--query", "status:failed")[0] == 2
    assert durable_cmd("rerun", "--query", "status:failed", "--input", "{}")[0] == 2
    assert durable_cmd("rerun", str(run.id), "--yes")[0] == 2
    code, _, err = durable_cmd("rerun", str(run.id), "--from-step", "nope")
    assert code == 2 and "no step 'nope'" in err
    running = durable.start(FourSteps, {"id": 1}, key="running:1")
    code, _, err = durable_cmd("rerun", str(running), "--from-step", "publish")
    assert code == 1 and "NotFinished" in err
