"""Every mistake in a start's arguments, at every way in (issue 32, case 9).

One table of mistakes, one table of entry points (``start``, ``start_detailed``,
``start_many``, ``explain``, their async twins and ``ctx.start``): each mistake
raises the exception its kind documents (docs/keys.md, "Mistakes in a start's
arguments"), before anything is written, and the caller's transaction stays usable.
A synchronous call made from async code raises ``durable.CalledFromAsync``, which
names the async twin to await instead.
"""

from __future__ import annotations

import datetime as dt

import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import SynchronousOnlyOperation, ValidationError
from django.db import transaction

import django_durable as durable
from django_durable import Workflow, step
from django_durable.models import Activity, Run
from django_durable.testing import drain
from tests.testapp.workflows import SendInvoice, SyncAccount

pytestmark = pytest.mark.django_db


class AbstractBase(Workflow):
    abstract = True


# What each kind of mistake raises: every class listed, and never the others.
LOOKUP = (durable.UnknownWorkflow, durable.DurableError, LookupError)
TYPE = (TypeError,)
VALUE = (ValueError,)
KEY = (durable.InvalidKey, durable.DurableError, ValidationError, ValueError)
KEY_TYPE = (*KEY, TypeError)
KINDS = (LookupError, TypeError, ValueError, ValidationError)

# (id, the mistaken arguments, what it raises, a word of its message). "workflow",
# "input" and "key" are the three arguments every entry point takes.
MISTAKES = [
    ("unknown-name", {"workflow": "no_such_workflow"}, LOOKUP, "no_such_workflow"),
    ("abstract-class", {"workflow": AbstractBase}, LOOKUP, "abstract"),
    ("workflow-of-wrong-type", {"workflow": 42}, TYPE, "workflow"),
    ("input-a-list", {"input": [1, 2]}, TYPE, "input must be a dict"),
    ("input-a-str", {"input": "{}"}, TYPE, "input must be a dict"),
    ("input-not-json", {"input": {"at": object()}}, TYPE, "JSON"),
    ("input-with-nul", {"input": {"a": "x\x00y"}}, VALUE, "NUL"),
    # JSON would store {1: "a"} as {"1": "a"}: refused, naming where the key is.
    ("input-an-int-key", {"input": {1: "a"}}, TYPE, "input has a key that is not a str: 1"),
    (
        "input-a-nested-int-key",
        {"input": {"a": [{"b": {2.5: 1}}]}},
        TYPE,
        "input['a'][0]['b'] has a key that is not a str: 2.5",
    ),
    # Over DURABLE["MAX_VALUE_BYTES"] (1 MiB of JSON), as a step result would be.
    ("input-too-big", {"input": {"blob": "x" * 2**20}}, VALUE, "MAX_VALUE_BYTES"),
    ("key-an-int", {"key": 42}, KEY_TYPE, "string"),
    ("key-bytes", {"key": b"k"}, KEY_TYPE, "string"),
    ("key-empty", {"key": ""}, KEY, "empty"),
    ("key-spaces", {"key": "   "}, KEY, "whitespace"),
    ("key-tab-newline", {"key": "\t\n"}, KEY, "whitespace"),
    ("key-unicode-space", {"key": "\u00a0\u2003"}, KEY, "whitespace"),
    ("key-too-long", {"key": "k" * 256}, KEY, "255 bytes"),
    ("key-with-nul", {"key": "a\x00b"}, KEY, "NUL"),
    ("on-duplicate-unknown", {"on_duplicate": "sometimes"}, VALUE, "on_duplicate"),
    ("on-duplicate-bad-event", {"on_duplicate": ("send_event", "")}, VALUE, "on_duplicate"),
    (
        "run-again-under-reuse-never",
        {"workflow": SendInvoice, "on_duplicate": "run_again"},
        VALUE,
        "run_again",
    ),
    ("run-after-naive", {"run_after": dt.datetime(2030, 1, 1)}, TYPE, "naive"),  # noqa: DTZ001
    ("run-after-a-str", {"run_after": "tomorrow"}, TYPE, "run_after"),
    ("priority-a-str", {"priority": "high"}, TYPE, "priority"),
    ("priority-out-of-range", {"priority": 2**40}, VALUE, "priority"),
    ("queue-an-int", {"queue": 5}, TYPE, "queue"),
    ("queue-empty", {"queue": ""}, VALUE, "queue"),
]

SCHEDULING = {"run_after", "priority", "queue"}


def _args(mistake: dict) -> dict:
    args = {"workflow": SyncAccount, "input": {"n": 1}, "key": "bad-input:1"}
    return {**args, **mistake}


def via_start(a):
    return durable.start(a.pop("workflow"), a.pop("input"), **a)


def via_start_detailed(a):
    return durable.start_detailed(a.pop("workflow"), a.pop("input"), **a)


def via_astart(a):
    return async_to_sync(durable.astart)(a.pop("workflow"), a.pop("input"), **a)


def via_astart_detailed(a):
    return async_to_sync(durable.astart_detailed)(a.pop("workflow"), a.pop("input"), **a)


def via_explain(a):
    return durable.explain(a.pop("workflow"), a.pop("input"), **a)


def via_aexplain(a):
    return async_to_sync(durable.aexplain)(a.pop("workflow"), a.pop("input"), **a)


def via_start_many(a):
    # A good item first: the bad second item must keep it from being written too.
    items = [({"n": 0}, "bad-input:0"), (a.pop("input"), a.pop("key"))]
    return durable.start_many(a.pop("workflow"), items, **a)


def via_astart_many(a):
    items = [({"n": 0}, "bad-input:0"), (a.pop("input"), a.pop("key"))]
    return async_to_sync(durable.astart_many)(a.pop("workflow"), items, **a)


ENTRY_POINTS = {
    "start": (via_start, True),
    "start_detailed": (via_start_detailed, True),
    "astart": (via_astart, True),
    "astart_detailed": (via_astart_detailed, True),
    "explain": (via_explain, False),
    "aexplain": (via_aexplain, False),
    "start_many": (via_start_many, False),
    "astart_many": (via_astart_many, False),
}

CASES = [
    pytest.param(entry, mistake, raises, words, id=f"{name}-{mistake_id}")
    for name, (entry, scheduling) in ENTRY_POINTS.items()
    for mistake_id, mistake, raises, words in MISTAKES
    if scheduling or not SCHEDULING & set(mistake)
]


def assert_kind(exc: BaseException, raises: tuple, words: str) -> None:
    for cls in raises:
        assert isinstance(exc, cls), f"{type(exc).__name__} is not a {cls.__name__}: {exc}"
    for cls in KINDS:
        if not any(issubclass(r, cls) for r in raises):
            assert not isinstance(exc, cls), f"{type(exc).__name__} is also a {cls.__name__}"
    assert words.lower() in str(exc).lower(), str(exc)


@pytest.mark.parametrize(("entry", "mistake", "raises", "words"), CASES)
def test_a_mistake_raises_its_kind_writes_nothing_and_leaves_the_transaction_usable(
    entry, mistake, raises, words, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as callbacks, transaction.atomic():
        with pytest.raises(Exception) as raised:
            entry(_args(mistake))
        assert_kind(raised.value, raises, words)
        assert (Run.objects.count(), Activity.objects.count()) == (0, 0)
        # The caller's transaction goes on: a good start in it works.
        good = durable.start(SyncAccount, {"n": 2}, key="bad-input:good")
        assert Run.objects.get().id == good
        transaction.set_rollback(True)
    assert len(callbacks) <= 1  # the good start's run_started signal, nothing of the bad call
    assert Run.objects.count() == 0


CAUGHT: list = []


class StartsBadly(Workflow):
    """Makes the mistake of its input with ``ctx.start`` and notes what it raised."""

    name = "starts_badly"

    @step
    def go(self, ctx):
        mistake_id = ctx.input["mistake"]
        args = _args(next(m for i, m, _r, _w in MISTAKES if i == mistake_id))
        try:
            ctx.start(args.pop("workflow"), args.pop("input"), **args)
        except Exception as exc:  # noqa: BLE001 - noted for the test to judge
            CAUGHT.append(exc)
        # The step goes on: its writes (and this good start) still work.
        return str(ctx.start(SyncAccount, {"n": 3}))


@pytest.mark.parametrize(
    ("mistake_id", "raises", "words"),
    [
        pytest.param(i, r, w, id=f"ctx.start-{i}")
        for i, m, r, w in MISTAKES
        if not SCHEDULING & set(m)
    ],
)
def test_ctx_start_raises_the_same_kinds(mistake_id, raises, words):
    CAUGHT.clear()
    run_id = durable.start(StartsBadly, {"mistake": mistake_id})
    drain()
    run = Run.objects.get(id=run_id)
    assert run.status == "completed", run.error
    (exc,) = CAUGHT
    assert_kind(exc, raises, words)
    # The parent and the good start's run: the bad call started nothing.
    assert Run.objects.count() == 2


def test_none_input_means_an_empty_object_everywhere():
    assert durable.get_run(durable.start(SyncAccount, None)).input == {}
    assert durable.explain(SyncAccount, None).outcome == "started"
    (result,) = durable.start_many(SyncAccount, [(None, None)])
    assert durable.get_run(result.run_id).input == {}


def test_a_key_with_spaces_inside_or_around_text_is_a_key():
    for key in (" a", "a b", "a\t"):
        assert durable.get_run(durable.start(SyncAccount, {}, key=key)).key == key


def test_a_bad_key_still_reads_as_a_validation_error():
    with pytest.raises(ValidationError) as raised:
        durable.start(SyncAccount, {}, key="  ")
    assert raised.value.code == "key_blank"
    assert raised.value.messages == [str(raised.value)]


# --- sync calls from async code ------------------------------------------------------

SYNC_CALLS = [
    ("start", "astart", lambda: durable.start(SyncAccount, {})),
    ("start_detailed", "astart_detailed", lambda: durable.start_detailed(SyncAccount, {})),
    ("start_many", "astart_many", lambda: durable.start_many(SyncAccount, [({}, None)])),
    ("explain", "aexplain", lambda: durable.explain(SyncAccount, {}, key="k")),
    ("retry", "aretry", lambda: durable.retry("00000000-0000-0000-0000-000000000001")),
    ("rerun", "arerun", lambda: durable.rerun("00000000-0000-0000-0000-000000000001")),
    ("cancel", "acancel", lambda: durable.cancel("00000000-0000-0000-0000-000000000001")),
    (
        "release_key",
        "arelease_key",
        lambda: durable.release_key("00000000-0000-0000-0000-000000000001"),
    ),
    (
        "send_event",
        "asend_event",
        lambda: durable.send_event("00000000-0000-0000-0000-000000000001", "go"),
    ),
    (
        "provide_input",
        "aprovide_input",
        lambda: durable.provide_input("00000000-0000-0000-0000-000000000001", "x", 1),
    ),
    ("get_run", "aget_run", lambda: durable.get_run("00000000-0000-0000-0000-000000000001")),
]


@pytest.mark.parametrize(("name", "twin", "call"), SYNC_CALLS, ids=[c[0] for c in SYNC_CALLS])
def test_a_sync_call_in_async_code_names_its_async_twin(name, twin, call):
    async def view():
        with pytest.raises(SynchronousOnlyOperation) as raised:
            call()
        return raised.value

    exc = async_to_sync(view)()
    assert isinstance(exc, durable.CalledFromAsync)
    assert isinstance(exc, durable.DurableError)
    assert f"durable.{name}()" in str(exc)
    assert f"await durable.{twin}(" in str(exc)
    assert Run.objects.count() == 0
