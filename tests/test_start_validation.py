"""start() checks the workflow, the input, the key and on_duplicate before it writes."""

import collections
import json
import math
import uuid

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import django_durable as durable
from django_durable import signals
from django_durable.models import Activity, Run
from django_durable.operations import inputs, keys
from tests.testapp.workflows import SyncAccount


@pytest.fixture
def nothing_written(django_capture_on_commit_callbacks):
    """Assert that the test wrote no run or activity and queued no signal."""
    started = []

    def receiver(**kwargs):
        started.append(kwargs)

    signals.run_started.connect(receiver)
    with django_capture_on_commit_callbacks() as callbacks:
        yield
    signals.run_started.disconnect(receiver)
    assert Run.objects.count() == 0
    assert Activity.objects.count() == 0
    assert callbacks == [] and started == []


pytestmark = pytest.mark.django_db


def test_unknown_workflow_name_is_a_lookup_error(nothing_written):
    with pytest.raises(LookupError, match="no workflow is named 'nope'"):
        durable.start("nope", {}, key="k")


def test_a_workflow_that_is_neither_a_class_nor_a_name_is_a_type_error(nothing_written):
    with pytest.raises(TypeError):
        durable.start(42, {})


@pytest.mark.parametrize("bad", [[1, 2], "text", 5, ("a", 1), b"{}"])
def test_input_that_is_not_a_dict_is_a_type_error(bad, nothing_written):
    with pytest.raises(TypeError, match="input must be a dict"):
        durable.start(SyncAccount, bad, key="account:1")


@pytest.mark.parametrize(
    "bad",
    [{"when": object()}, {"ids": {1, 2}}, {"at": uuid.uuid4()}, {"x": math.nan}, {"x": math.inf}],
)
def test_input_that_is_not_json_is_a_type_error(bad, nothing_written):
    with pytest.raises(TypeError, match="JSON-serialisable"):
        durable.start(SyncAccount, bad, key="account:1")


def test_none_input_means_an_empty_object():
    run = durable.get_run(durable.start(SyncAccount, None))
    assert run.input == {}


@pytest.mark.parametrize(
    "bad, code",
    [
        (42, "key_type"),
        (b"account:1", "key_type"),
        (["account:1"], "key_type"),
        ("", "key_empty"),
        ("k" * 256, "key_too_long"),
        ("é" * 128, "key_too_long"),  # 128 characters, 256 bytes
        ("€" * 86, "key_too_long"),  # 86 characters, 258 bytes
        ("🙂" * 64, "key_too_long"),  # 64 characters, 256 bytes
        ("a\x00b", "key_nul"),  # PostgreSQL text can't hold NUL
        ("\ud800", "key_encoding"),  # a lone surrogate is not UTF-8
    ],
)
def test_a_bad_key_is_a_validation_error(bad, code, nothing_written):
    with pytest.raises(ValidationError) as raised:
        durable.start(SyncAccount, {}, key=bad)
    assert raised.value.code == code


@pytest.mark.parametrize(
    "key",
    ["k" * 255, "é" * 127 + "k", "€" * 85, "🙂" * 63 + "abc", "k"],
    ids=["255-ascii", "255-two-byte", "255-three-byte", "255-four-byte", "one-byte"],
)
def test_keys_of_1_to_255_bytes_are_stored_whole(key):
    run = durable.get_run(durable.start(SyncAccount, {}, key=key))
    assert (run.key, run.holds_key) == (key, True)


def test_none_key_means_no_key():
    first = durable.get_run(durable.start(SyncAccount, {}, key=None))
    second = durable.get_run(durable.start(SyncAccount, {}, key=None))
    assert first.id != second.id
    assert (first.key, first.holds_key) == (None, False)


@settings(deadline=None)  # a loaded CI machine must not turn a pause into a failure
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")))
def test_key_validation_follows_the_utf8_byte_length(key):
    size = len(key.encode("utf-8"))
    if 1 <= size <= 255 and not key.isspace():  # a key of whitespace only is refused too
        assert keys.validate_key(key) == key
    else:
        with pytest.raises(ValidationError):
            keys.validate_key(key)


@settings(max_examples=40, deadline=None)
@given(
    st.text(
        alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
        min_size=1,
        max_size=255,
    )
)
def test_the_database_agrees_with_python_on_key_length(key):
    """Every key validation lets through fits the database's byte-length CHECK."""
    assume(not key.isspace())  # refused before the database sees it (test_bad_input.py)
    size = len(key.encode("utf-8"))
    with transaction.atomic():
        if size <= 255:
            run_id = durable.start(SyncAccount, {}, key=key)
            assert Run.objects.get(id=run_id).key == key
        else:
            with pytest.raises(ValidationError):
                durable.start(SyncAccount, {}, key=key)
        transaction.set_rollback(True)


@pytest.mark.parametrize(
    "bad",
    [
        "ignore",
        "USE_EXISTING",
        "",
        object(),
        3,
        ("send_event",),
        ("send_event", ""),
        ("send_event", 5),
        ("error", "x"),
        ["cancel_existing"],
    ],
)
def test_a_bad_on_duplicate_is_a_value_error(bad, nothing_written):
    with pytest.raises(ValueError, match="on_duplicate must be one of"):
        durable.start(SyncAccount, {}, key="account:1", on_duplicate=bad)


def test_run_again_with_reuse_never_is_refused_per_call(nothing_written):
    with pytest.raises(ValueError, match="run_again"):
        durable.start("send_invoice", {}, key="inv:1", on_duplicate="run_again")


@pytest.mark.parametrize(
    "policy",
    [
        "use_existing",
        "error",
        "cancel_existing",
        "run_again",
        ("send_event", "updated"),
        ["send_event", "updated"],
    ],
)
def test_every_documented_on_duplicate_is_accepted(policy):
    result = durable.start_detailed(SyncAccount, {}, key="account:1", on_duplicate=policy)
    assert result.outcome == "started"


def test_reuse_cannot_be_passed_to_start(nothing_written):
    with pytest.raises(TypeError, match="reuse"):
        durable.start(SyncAccount, {}, key="account:1", reuse="never")
    with pytest.raises(TypeError, match="reuse"):
        durable.start_detailed(SyncAccount, {}, key="account:1", reuse="never")


def test_key_is_keyword_only(nothing_written):
    with pytest.raises(TypeError):
        durable.start(SyncAccount, {}, "account:1")


def test_the_input_is_stored_as_json_reads_it_back():
    run_id = durable.start(SyncAccount, {"ids": (1, 2), "n": 1.5}, key="account:1")
    assert durable.get_run(run_id).input == {"ids": [1, 2], "n": 1.5}


@pytest.mark.parametrize(
    "value, plain",
    [
        ({"a": [1, 2.5, True, None, {"b": "c"}]}, True),
        ({}, True),
        ({"ids": (1, 2)}, False),  # reads back as a list
        ({"when": collections.OrderedDict(a=1)}, False),  # a subclass reads back as dict
    ],
)
def test_a_start_keeps_its_input_only_when_it_reads_back_equal(value, plain):
    """A start goes on with what a reader gets back: the caller's input itself when
    its JSON reads back as an equal value, the text read back otherwise."""
    payload, text = inputs.validated_input(value)
    assert (payload is value) is plain
    assert payload == json.loads(text)


_storable_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=4
)
_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _storable_text,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(_storable_text, inner, max_size=3)  # a key not a str: refused
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_storable_text, _json_values, max_size=4))
def test_what_a_start_goes_on_with_is_what_a_reader_gets_back(value):
    payload, text = inputs.validated_input(value)
    assert payload == json.loads(text)
