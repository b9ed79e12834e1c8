"""What a new user is told when they get something wrong on the first day (issue 43,
item 10): a mistyped workflow in ``durable stats``, a refused rerun naming its holder
once, ``inspect`` showing where a rerun came from, ``durable prune``, ``explain_run``
on a bad or unknown id and on a run no worker can take, ``durable_task``'s backoff and
the Key view's empty table."""

import json
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse
from django.utils import timezone

import django_durable as durable
from django_durable import store
from django_durable.models import Run, Status, WorkerNode
from django_durable.tasks import durable_task
from django_durable.testing import drain
from tests.factories import RunFactory
from tests.test_cli import durable_cmd, finished, manage

pytestmark = pytest.mark.django_db


# --- durable stats --workflow ----------------------------------------------------------


def test_stats_of_a_workflow_nobody_defined_is_bad_usage_in_one_line():
    code, out, err = durable_cmd("stats", "--workflow", "nope")
    assert (code, out) == (2, "")
    assert err.strip() == "no workflow is named 'nope'"
    # The same answer as ``durable flow``'s for the same typo.
    assert durable_cmd("flow", "nope")[2].strip() == err.strip()


def test_stats_of_a_defined_workflow_without_runs_and_of_a_gone_one_with_runs():
    code, out, _ = durable_cmd("stats", "--workflow", "sync_account")
    assert code == 0 and "keys held" in out
    # A workflow whose definition is gone still has its runs counted.
    RunFactory(workflow="retired_workflow", status=Status.COMPLETED)
    code, out, _ = durable_cmd("stats", "--workflow", "retired_workflow")
    assert code == 0 and "completed" in out


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_stats_of_an_unknown_workflow_exits_2_on_the_real_command_line():
    done = manage("stats", "--workflow", "nope")
    assert done.returncode == 2, done.stderr
    assert "no workflow is named 'nope'" in done.stderr and "Traceback" not in done.stderr


# --- a refused rerun -------------------------------------------------------------------


def test_a_refused_rerun_names_its_holder_once():
    sent = finished("send_invoice", key="invoice:once", id=1)  # reuse="never"
    code, _, err = durable_cmd("rerun", str(sent))
    assert code == 1
    assert err.count(str(sent)) == 2, err  # "held by run X" and the release-key hint
    assert "(holder: " not in err
    assert f"held by run {sent}" in err and f"durable release-key {sent} --by WHO" in err


# --- inspect shows where a rerun came from ---------------------------------------------


def test_inspect_shows_rerun_of_and_rerun_from_step():
    original = durable.start("process_article", {"id": 5})
    drain()
    again = durable.rerun(original, from_step="summarize")
    code, out, _ = durable_cmd("inspect", str(again), "--json")
    shown = json.loads(out)
    assert code == 0
    assert (shown["rerun_of"], shown["rerun_from_step"]) == (str(original), "summarize")
    code, out, _ = durable_cmd("inspect", str(again))
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    assert lines["rerun_of"] == [str(original)]
    assert lines["rerun_from_step"] == ["summarize"]
    # A first run says it is none.
    shown = json.loads(durable_cmd("inspect", str(original), "--json")[1])
    assert (shown["rerun_of"], shown["rerun_from_step"]) == (None, None)


# --- durable prune ---------------------------------------------------------------------


def old_and_new_finished_runs():
    RunFactory(status=Status.COMPLETED, finished_at=timezone.now() - timedelta(days=40))
    RunFactory(status=Status.COMPLETED, finished_at=timezone.now() - timedelta(seconds=5))


def test_durable_prune_is_durable_prunes_command():
    old_and_new_finished_runs()
    code, out, _ = durable_cmd("prune", "--older-than", "30d", "--dry-run")
    assert (code, out) == (0, "1 finished runs would be pruned\n")
    assert Run.objects.count() == 2
    code, out, _ = durable_cmd("prune", "--older-than", "30d")
    assert (code, out) == (0, "pruned 1 finished runs\n")
    assert Run.objects.count() == 1


def test_durable_prune_refuses_a_bad_duration_as_durable_prune_does():
    """The same parsing as ``durable_prune``'s (its ``--older-than``): a bad duration
    is bad usage in one line, and nothing is deleted."""
    old_and_new_finished_runs()
    for text in ("soon", "-1d"):
        code, _, err = durable_cmd("prune", f"--older-than={text}")
        assert code == 2 and "--older-than" in err, err
    assert Run.objects.count() == 2


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_durable_prune_on_the_real_command_line():
    old_and_new_finished_runs()
    listed = manage("--help")
    assert listed.returncode == 0 and "prune" in listed.stdout
    done = manage("prune", "--older-than", "30d")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "pruned 1 finished runs\n"
    bad = manage("prune", "--older-than=7x")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "usage:" in bad.stderr and "not a duration" in bad.stderr
    assert Run.objects.count() == 1


# --- explain_run -----------------------------------------------------------------------


def test_explain_run_of_a_malformed_id_is_a_value_error():
    with pytest.raises(ValueError, match="not a run id: 'not-a-uuid'") as raised:
        durable.explain_run("not-a-uuid")
    assert type(raised.value) is ValueError  # not Django's ValidationError


def test_explain_run_of_an_unknown_id_names_it():
    missing = "00000000-0000-0000-0000-000000000042"
    with pytest.raises(Run.DoesNotExist, match=f"^no run {missing}$"):
        durable.explain_run(missing)


def live_worker(worker_id: str, queues: list[str], workflows: list[str] | None) -> None:
    WorkerNode.objects.create(
        id=worker_id,
        hostname="h",
        pid=1,
        queues=queues,
        workflows=workflows,
        heartbeat_at=store.now(),
    )


def test_explain_run_says_whether_the_queue_or_the_workflow_has_no_worker():
    run_id = durable.start("sync_account", {})
    queue = Run.objects.get(id=run_id).queue
    # No live worker on its queue (one serves another queue).
    live_worker("w-elsewhere", ["elsewhere"], None)
    assert durable.explain_run(run_id) == f"No live worker serves its queue {queue!r}."
    # One on its queue, started for another workflow only.
    live_worker("w-other", [queue], ["process_article"])
    assert durable.explain_run(run_id) == (
        f"No live worker that serves its queue {queue!r} knows its workflow 'sync_account'."
    )
    # One that knows it by a pattern: the run waits for a free thread.
    live_worker("w-sync", [], ["sync_*"])
    assert durable.explain_run(run_id).startswith("Due for ")


# --- durable_task(backoff=...) ---------------------------------------------------------


def test_durable_task_backoff_takes_seconds_and_says_so_when_refused():
    def noop():
        return None

    durable_task(backoff=5)(noop)  # seconds, as docs/tasks.md says
    durable_task(backoff=timedelta(seconds=5))(noop)
    with pytest.raises(
        ImproperlyConfigured, match="backoff must be a timedelta or a number of seconds, got '5s'"
    ):
        durable_task(backoff="5s")(noop)


# --- the Key view ----------------------------------------------------------------------


def test_the_key_view_without_readds_reads_as_english(admin_client):
    run_id = durable.start("sync_account", {}, key="account:quiet")
    response = admin_client.get(reverse("django_durable:run", args=[run_id]))
    html = response.content.decode()
    assert response.status_code == 200 and 'id="key-view"' in html
    assert "No start has found this key taken yet" in html
