"""The command line's rough edges a new user meets in the first hour (issue 32, case 8):
Django's own options after the subcommand, a traceback printed as lines, "no run
<id>", queues found in runs, a hint to release a key before a rerun, and ``explain``
saying which input would be dropped."""

import json
import uuid

import pytest

import django_durable as durable
from django_durable.testing import drain
from tests.test_cli import durable_cmd, manage

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    "option",
    [
        ["--traceback"],
        ["--verbosity", "2"],
        ["-v", "0"],
        ["--no-color"],
        ["--force-color"],
        ["--skip-checks"],
        ["--settings", "tests.settings"],
        ["--pythonpath", "."],
    ],
)
def test_djangos_own_options_are_accepted_after_the_subcommand(option):
    durable.start("sync_account", {}, key="k:options")
    code, out, err = durable_cmd("list", *option)
    assert code == 0, err
    assert "k:options" in out


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_traceback_after_the_subcommand_works_on_the_real_command_line():
    durable.start("sync_account", {}, key="k:real")
    listed = manage("list", "--traceback", "--no-color")
    assert listed.returncode == 0, listed.stderr
    assert "k:real" in listed.stdout
    # --traceback after the subcommand is Django's: a refusal shows where it came from.
    refused = manage("retry", str(uuid.uuid4()), "--traceback")
    assert refused.returncode == 1
    assert "Traceback (most recent call last)" in refused.stderr
    plain = manage("retry", str(uuid.uuid4()))
    assert plain.returncode == 1 and "Traceback" not in plain.stderr


def failed_run():
    run_id = durable.start("sync_account", {"fail": True}, key="k:failed")
    drain()
    assert durable.get_run(run_id).status == "failed"
    return run_id


def test_inspect_prints_the_traceback_as_lines_and_json_stays_json():
    run_id = failed_run()
    code, out, _ = durable_cmd("inspect", str(run_id))
    assert code == 0
    assert "Traceback (most recent call last):" in out.splitlines()
    assert "\\n" not in out  # no escaped newline left anywhere
    assert any(
        line.startswith("error") and "RuntimeError: sync failed" in line
        for line in out.splitlines()
    )
    assert any(line.strip().startswith('File "') for line in out.splitlines())
    code, out, _ = durable_cmd("inspect", str(run_id), "--json")
    shown = json.loads(out)
    assert shown["error"]["type"] == "RuntimeError"
    assert "Traceback" in shown["error"]["traceback"]


@pytest.mark.parametrize(
    "command",
    [
        ["retry"],
        ["rerun"],
        ["cancel"],
        ["inspect"],
        ["release-key", "--by", "ops"],
        ["send-event", "go"],
        ["provide-input", "answer", "1"],
    ],
)
def test_an_unknown_run_id_is_no_run(command):
    missing = uuid.uuid4()
    name, *rest = command
    code, out, err = durable_cmd(name, str(missing), *rest)
    assert code == 1
    assert f"no run {missing}" in err
    assert "matching query" not in err


def test_queues_lists_the_queues_of_finished_runs_too():
    for n in range(3):
        durable.start("sync_account", {}, key=f"k:q{n}")
    drain()
    code, out, err = durable_cmd("queues")
    assert code == 0, err
    assert "no queues yet" not in err
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [row[0] for row in rows if row[0] == "default"] == ["default"]
    code, out, _ = durable_cmd("queues", "--json")
    assert "default" in {row["queue"] for row in json.loads(out)}


def test_a_rerun_of_a_key_holder_says_to_release_the_key_first():
    run_id = durable.start("send_invoice", {"id": 7, "amount": 120}, key="invoice:7")
    drain()
    code, _, err = durable_cmd("rerun", str(run_id))
    assert code == 1
    assert f"durable release-key {run_id} --by" in err
    assert durable_cmd("release-key", str(run_id), "--by", "ops")[0] == 0
    code, out, _ = durable_cmd("rerun", str(run_id))
    assert code == 0 and "new run" in out


def test_explain_says_which_input_would_be_dropped():
    holder = durable.start("sync_account", {"plan": "free"}, key="k:drop")
    args = ["explain", "sync_account", "--key", "k:drop"]
    code, out, _ = durable_cmd(*args, "--input", '{"plan": "pro"}')
    assert code == 0 and "use_existing" in out
    line = next(line for line in out.splitlines() if line.startswith("input"))
    assert "dropped" in line and '{"plan": "pro"}' in line and str(holder) in line
    assert "plan" in line  # the field that differs is named

    code, out, _ = durable_cmd(*args, "--input", '{"plan": "pro"}', "--json")
    shown = json.loads(out)
    assert shown["dropped_input"] == {"plan": "pro"}
    assert shown["holder_input"] == {"plan": "free"}

    code, out, _ = durable_cmd(*args, "--input", '{"plan": "free"}')
    line = next(line for line in out.splitlines() if line.startswith("input"))
    assert "same" in line and "dropped" not in line

    code, out, _ = durable_cmd("explain", "sync_account", "--key", "k:free", "--input", "{}")
    line = next(line for line in out.splitlines() if line.startswith("input"))
    assert "used" in line and "dropped" not in line

    code, out, _ = durable_cmd(*args, "--input", '{"plan": "pro"}', "--on-duplicate", "error")
    line = next(line for line in out.splitlines() if line.startswith("input"))
    assert "KeyTaken" in line and "not used" in line


def test_an_unknown_workflow_or_a_bad_key_is_bad_usage_as_documented():
    code, _, err = durable_cmd("explain", "no_such_workflow")
    assert code == 2 and "no_such_workflow" in err
    code, _, err = durable_cmd("explain", "sync_account", "--key", "   ")
    assert code == 2 and "key" in err.lower()
