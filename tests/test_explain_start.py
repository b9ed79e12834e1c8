"""``durable.explain()`` agrees with what ``start()`` then does, on every cell of the
reuse x on_duplicate x holder status table (and with a debounced workflow), and
writes nothing."""

import pytest
from django.core.exceptions import ValidationError

import django_durable as durable
from django_durable.models import Activity, Event, Run
from tests.helpers import ALL_STATUSES, holder_in

pytestmark = pytest.mark.django_db

REUSES = ("after_close", "after_failure", "never")
POLICIES = ("use_existing", "error", "cancel_existing", "run_again", ("send_event", "nudge"))
CELLS = [
    (reuse, policy, status, debounce)
    for reuse in REUSES
    for policy in POLICIES
    for status in ALL_STATUSES
    for debounce in (False, True)
    if not (policy == "run_again" and reuse == "never")
]


def cell_id(cell) -> str:
    reuse, policy, status, debounce = cell
    name = policy if isinstance(policy, str) else "send_event"
    return f"{reuse}-{name}-{status}{'-debounced' if debounce else ''}"


def written() -> tuple[int, int, int]:
    return Run.objects.count(), Activity.objects.count(), Event.objects.count()


@pytest.mark.parametrize("reuse, policy, status, debounce", CELLS, ids=map(cell_id, CELLS))
def test_explain_agrees_with_the_start_that_follows(define, reuse, policy, status, debounce):
    attrs = {"reuse": reuse}
    if debounce:
        attrs["debounce"] = durable.Debounce(period=durable.seconds(0))
    workflow = define("explained", **attrs)
    holder_id = holder_in(workflow, status, "item:1")
    before = written()

    explanation = durable.explain(workflow, {"value": 2}, key="item:1", on_duplicate=policy)

    assert written() == before  # explain writes nothing
    assert isinstance(explanation, durable.Explanation)
    assert explanation.holder_id == holder_id
    assert explanation.reason.endswith(".") and status in explanation.reason
    try:
        result = durable.start_detailed(workflow, {"value": 2}, key="item:1", on_duplicate=policy)
    except durable.KeyTaken as exc:
        assert exc.holder_id == holder_id
        assert explanation.outcome == "key_taken", explanation
    else:
        assert explanation.outcome == result.outcome, explanation


def test_a_free_key_and_no_key_start_a_run(define):
    workflow = define("explained")
    free = durable.explain(workflow, key="nobody:1")
    assert (free.outcome, free.holder_id) == ("started", None)
    assert "nobody:1" in free.reason
    assert durable.explain(workflow).outcome == "started"
    assert Run.objects.count() == 0


def test_explain_refuses_what_start_refuses(define):
    workflow = define("explained", reuse="never")
    with pytest.raises(ValidationError):
        durable.explain(workflow, key="")
    with pytest.raises(TypeError):
        durable.explain(workflow, ["not", "a", "dict"])
    with pytest.raises(ValueError):
        durable.explain(workflow, key="k", on_duplicate="sometimes")
    with pytest.raises(ValueError):
        durable.explain(workflow, key="k", on_duplicate="run_again")
    with pytest.raises(LookupError):
        durable.explain("no_such_workflow")


def test_the_reason_names_the_rule(define):
    workflow = define("explained", reuse="after_failure")
    holder_in(workflow, "completed", "item:9")
    explanation = durable.explain(workflow, key="item:9", on_duplicate="error")
    assert explanation.outcome == "key_taken"
    assert "reuse='after_failure'" in explanation.reason
    assert "completed" in explanation.reason
