"""``manage.py durable <command>``: one test per command, with its refused (1) and
bad-usage (2) exits. Most go through ``call_command``; the real command line's exit
statuses are checked in a subprocess too."""

import json
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

import django_durable as durable
from django_durable.models import Activity, Run, Status
from django_durable.testing import drain
from tests.helpers import manage_py

pytestmark = pytest.mark.django_db


def durable_cmd(*args):
    """Run ``manage.py durable *args``; return (exit status, stdout, stderr)."""
    out, err = StringIO(), StringIO()
    try:
        call_command("durable", *args, stdout=out, stderr=err)
    except CommandError as exc:
        return exc.returncode, out.getvalue(), err.getvalue() + str(exc)
    return 0, out.getvalue(), err.getvalue()


def finished(workflow="sync_account", key="k:1", **input):
    run_id = durable.start(workflow, input, key=key)
    drain()
    return run_id


# --- list and inspect ---------------------------------------------------------------


def test_list_filters_with_the_dashboard_search_and_prints_a_table_or_json():
    wanted = durable.start("process_article", {"id": 42}, key="article:42")
    durable.start("process_article", {"id": 43}, key="article:43")
    durable.start("sync_account", {}, key="account:1")

    code, out, _ = durable_cmd("list", "--query", "key:article:42")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["ID", "WORKFLOW", "STATUS"]
    assert len(lines) == 2 and str(wanted) in lines[1] and "article:42" in lines[1]

    code, out, _ = durable_cmd("list", "--query", "workflow:process_article", "--json")
    rows = json.loads(out)
    assert code == 0 and {row["key"] for row in rows} == {"article:42", "article:43"}
    assert rows[0]["status"] == "pending" and rows[0]["holds_key"] is True

    code, out, err = durable_cmd("list", "--query", "key:nothing")
    assert (code, out) == (0, "") and "no runs match" in err


def test_list_with_an_unknown_status_is_bad_usage():
    code, _, err = durable_cmd("list", "--query", "status:sleepy")
    assert code == 2 and "unknown status 'sleepy'" in err


def test_inspect_shows_a_run_and_its_attempts():
    run_id = finished(key="k:inspect")
    code, out, _ = durable_cmd("inspect", str(run_id))
    assert code == 0 and "completed" in out and "k:inspect" in out and "sync" in out
    code, out, _ = durable_cmd("inspect", str(run_id), "--json")
    shown = json.loads(out)
    assert (shown["id"], shown["status"], shown["result"]) == (str(run_id), "completed", "synced")
    assert [a["step"] for a in shown["attempts"]] == ["sync"]


def test_inspect_of_a_missing_run_is_refused_and_a_bad_id_is_bad_usage():
    code, _, err = durable_cmd("inspect", str(uuid.uuid4()))
    assert code == 1 and "no run " in err
    code, _, err = durable_cmd("inspect", "not-an-id")
    assert code == 2 and "invalid run id value" in err


# --- acting on runs -----------------------------------------------------------------


def test_retry_resumes_a_failed_run_and_refuses_another():
    failed = finished(key="k:retry", fail=True)
    assert durable.get_run(failed).status == Status.FAILED
    assert durable_cmd("retry", str(failed))[:2] == (0, f"run {failed} resumes\n")
    assert durable.get_run(failed).status == Status.PENDING
    code, _, err = durable_cmd("retry", str(failed))
    assert code == 1 and "NotFailed" in err


def test_rerun_starts_a_copy_and_is_refused_with_the_holder():
    sent = finished("send_invoice", key="invoice:1", id=1)  # reuse="never"
    code, _, err = durable_cmd("rerun", str(sent))
    assert code == 1 and f"held by run {sent}" in err
    durable.release_key(sent, by="test")
    code, out, _ = durable_cmd("rerun", str(sent))
    assert code == 0 and out.startswith("new run ")
    assert Run.objects.filter(key="invoice:1").count() == 2


def test_cancel_with_a_reason_and_a_second_cancel_is_refused():
    run_id = durable.start("sync_account", {}, key="k:cancel")
    assert durable_cmd("cancel", str(run_id), "--reason", "duplicate order")[0] == 0
    assert durable.get_run(run_id).error["reason"] == "duplicate order"
    code, _, err = durable_cmd("cancel", str(run_id))
    assert code == 1 and "AlreadyFinished" in err


def test_release_key_needs_by_and_refuses_an_active_run():
    done = finished(key="k:release")
    code, _, err = durable_cmd("release-key", str(done))
    assert code == 2 and "--by" in err
    assert durable_cmd("release-key", str(done), "--by", "ops@example.com")[0] == 0
    released = Activity.objects.get(kind=Activity.Kind.KEY_RELEASED, run_id=done)
    assert released.details["by"] == "ops@example.com"
    active = durable.start("sync_account", {}, key="k:active")
    code, _, err = durable_cmd("release-key", str(active), "--by", "ops")
    assert code == 1 and "NotFinished" in err


def test_send_event_with_a_payload_buffered_or_refused():
    waiting = durable.start("waits_for_event", {})
    drain()
    code, _, err = durable_cmd("send-event", str(waiting), "other")
    assert code == 1 and "NotWaiting" in err
    code, _, err = durable_cmd("send-event", str(waiting), "go", "--payload", "{bad")
    assert code == 2 and "invalid JSON value" in err
    assert durable_cmd("send-event", str(waiting), "go", "--payload", '{"n": 1}')[0] == 0
    drain()
    assert durable.get_run(waiting).result == {"n": 1}

    later = durable.start("waits_for_event", {})
    assert durable_cmd("send-event", str(later), "go", "--buffer", "--payload", "2")[0] == 0
    drain()
    assert durable.get_run(later).result == 2


def test_provide_input_takes_json_and_is_refused_when_nothing_waits():
    asking = durable.start("waits_for_approval", {})
    code, _, err = durable_cmd("provide-input", str(asking), "approval", '{"by": "ann"}')
    assert code == 1 and "NotWaiting" in err  # not run yet: not waiting
    drain()
    code, _, err = durable_cmd("provide-input", str(asking), "approval", "not json")
    assert code == 2
    assert durable_cmd("provide-input", str(asking), "approval", '{"by": "ann"}')[0] == 0
    drain()
    assert durable.get_run(asking).result == {"approved_by": "ann"}


# --- explain, stats, queues ---------------------------------------------------------


def test_explain_says_what_a_start_would_do():
    holder = durable.start("sync_account", {}, key="k:explain")
    code, out, _ = durable_cmd("explain", "sync_account", "--key", "k:explain", "--json")
    assert code == 0 and json.loads(out)["holder_id"] == str(holder)
    code, out, _ = durable_cmd(
        "explain", "sync_account", "--key", "k:explain", "--on-duplicate", "error"
    )
    assert code == 0 and "key_taken" in out
    code, _, _ = durable_cmd("explain", "sync_account", "--on-duplicate", "whatever")
    assert code == 2
    assert Run.objects.count() == 1


def test_explain_bad_input_is_bad_usage():
    code, _, err = durable_cmd("explain", "sync_account", "--input", "[1,")
    assert code == 2 and "invalid JSON value" in err


def test_stats_counts_statuses_and_key_readds():
    durable.start("sync_account", {}, key="k:stats")
    durable.start("sync_account", {}, key="k:stats")
    code, out, _ = durable_cmd("stats", "--workflow", "sync_account", "--json")
    numbers = json.loads(out)
    assert code == 0 and numbers["statuses"] == {"pending": 1}
    assert numbers["keys"]["keys_held"] == 1
    assert numbers["keys"]["readds_by_outcome"] == {"use_existing": 1}
    code, out, _ = durable_cmd("stats")
    assert code == 0 and "keys held" in out and "use_existing" in out


def test_queues_pause_and_resume():
    durable.start("sync_account", {})
    assert durable_cmd("pause", "default")[0] == 0
    code, out, _ = durable_cmd("queues", "--json")
    (default,) = [row for row in json.loads(out) if row["queue"] == "default"]
    assert code == 0 and default["paused"] is True and default["pending"] == 1
    assert durable_cmd("resume", "default")[0] == 0
    code, out, _ = durable_cmd("queues")
    assert code == 0 and "default" in out


# --- usage ------------------------------------------------------------------------


def test_bad_usage_under_call_command_is_exit_2():
    assert durable_cmd("cancel")[0] == 2  # RUN_ID missing
    assert durable_cmd("list", "--limit", "0")[0] == 2
    assert durable_cmd("send-event", str(uuid.uuid4()), "go", "--payload", "{")[0] == 2
    # (An option no subcommand knows is the root parser's: Django's call_command
    # raises CommandError with status 1 for it; the real command line exits 2, below.)


def manage(*args):
    return manage_py("durable", *args)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_real_command_line_exits_0_1_and_2():
    run_id = finished(key="k:cli")
    ok = manage("inspect", str(run_id), "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["status"] == "completed"

    again = manage("cancel", str(run_id))
    assert again.returncode == 1 and "AlreadyFinished" in again.stderr

    for args in ([], ["frobnicate"], ["cancel"], ["inspect", "nope"], ["list", "--json", "x"]):
        usage = manage(*args)
        assert usage.returncode == 2, (args, usage.stderr)
        assert "usage:" in usage.stderr
