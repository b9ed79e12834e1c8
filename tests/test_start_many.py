"""``durable.start_many``: the answers of ``start()`` item by item (duplicates inside
the batch included), one statement per batch on PostgreSQL, inside the caller's
transaction, and nothing written for a bad item."""

import uuid

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import django_durable as durable
from django_durable.models import Activity, Run
from django_durable.operations import batch
from tests.helpers import holder_in

pytestmark = pytest.mark.django_db

POLICIES = ("use_existing", "error", "cancel_existing", "run_again", ("send_event", "nudge"))
# Pending last: holder_in runs what is due to get a holder to its status.
HOLDERS = ("running", "waiting", "completed", "failed", "cancelled", "compensating", "pending")


def setup(*workflows) -> list[dict[str, uuid.UUID]]:
    """For each workflow, a holder of ``held:<status>`` in every status."""
    holders: list[dict[str, uuid.UUID]] = [{} for _ in workflows]
    for status in HOLDERS:
        for made, workflow in zip(holders, workflows, strict=True):
            made[f"held:{status}"] = holder_in(workflow, status, f"held:{status}")
    return holders


def items() -> list[tuple[dict, str | None]]:
    batch_items = [({"n": 0}, None), ({"n": 1}, "new:1"), ({"n": 2}, "new:1")]
    batch_items += [({"n": 3 + i}, f"held:{status}") for i, status in enumerate(HOLDERS)]
    batch_items += [({"n": 20}, "new:2"), ({"n": 21}, None), ({"n": 22}, "held:completed")]
    return batch_items


def answers(workflow, results, holders) -> list:
    """Each result as a label: the holder's key it answered with, the item whose new
    run it is, or the outcome of a run made for it; plus the runs' inputs."""
    by_id = {run_id: f"holder {key}" for key, run_id in holders.items()}
    labels = []
    for n, result in enumerate(results):
        label = by_id.setdefault(result.run_id, f"run of item {n}")
        labels.append((result.outcome, label))
    runs = sorted(
        (run.key or "", run.status, run.holds_key, run.input.get("n"))
        for run in Run.objects.filter(workflow=workflow.name)
    )
    return [labels, runs]


def one_by_one(workflow, policy):
    results = []
    for payload, key in items():
        try:
            results.append(durable.start_detailed(workflow, payload, key=key, on_duplicate=policy))
        except durable.KeyTaken as exc:
            return results, exc
    return results, None


# run_again with reuse='never' is refused before any start (test_start_validation).
CELLS = [
    (reuse, policy)
    for reuse in ("after_close", "after_failure", "never")
    for policy in POLICIES
    if not (reuse == "never" and policy == "run_again")
]


@pytest.mark.parametrize(
    "reuse, policy", CELLS, ids=[f"{r}-{p if isinstance(p, str) else p[0]}" for r, p in CELLS]
)
def test_the_same_answers_as_start_item_by_item(define, reuse, policy):
    many = define("batched", reuse=reuse)
    single = define("single", reuse=reuse)
    many_holders, single_holders = setup(many, single)

    expected, expected_error = one_by_one(single, policy)
    if expected_error is not None:
        before = Run.objects.filter(workflow=many.name).count(), Activity.objects.count()
        with pytest.raises(durable.KeyTaken) as raised:
            durable.start_many(many, items(), on_duplicate=policy)
        # The call wrote nothing; the same item was refused, by the same holder.
        assert (Run.objects.filter(workflow=many.name).count(), Activity.objects.count()) == (
            before
        )
        holder_key = {v: k for k, v in single_holders.items()}.get(expected_error.holder_id)
        assert many_holders.get(holder_key, raised.value.holder_id) == raised.value.holder_id
        return
    results = durable.start_many(many, items(), on_duplicate=policy)
    assert answers(many, results, many_holders) == answers(single, expected, single_holders)
    kinds = lambda name: sorted(  # noqa: E731
        (a.kind, a.key, a.details.get("outcome")) for a in Activity.objects.filter(workflow=name)
    )
    assert kinds(many.name) == kinds(single.name)


def test_bad_items_raise_before_anything_is_written(define):
    workflow = define("batched")
    for bad, error in [
        ([({}, "ok:1"), ({}, "")], ValidationError),
        ([({}, "ok:1"), ({"when": object()}, "ok:2")], TypeError),
        ([({}, "ok:1"), ({}, 7)], ValidationError),
        ([({}, "ok:1"), "not a pair"], TypeError),
        ([({}, "ok:1"), ({}, "k", "tenant:1", "extra")], TypeError),
        ([({}, "ok:1"), ({}, "k", "")], ValueError),
        ([({}, "ok:1"), ({}, "k", 7)], TypeError),
        ({"not": "pairs"}, TypeError),
    ]:
        with pytest.raises(error):
            durable.start_many(workflow, bad)
    with pytest.raises(ValueError):
        durable.start_many(workflow, [({}, "k")], on_duplicate="sometimes")
    assert Run.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_inside_the_callers_transaction_the_runs_go_with_it(define):
    workflow = define("batched")
    with pytest.raises(RuntimeError), transaction.atomic():
        results = durable.start_many(workflow, [({}, "t:1"), ({}, "t:1"), ({}, None)])
        assert [r.outcome for r in results] == ["started", "use_existing", "started"]
        assert results[0].run_id == results[1].run_id
        raise RuntimeError("roll back")
    assert Run.objects.count() == 0
    with transaction.atomic():
        holder = durable.start(workflow, key="t:2")
        try:
            durable.start_many(workflow, [({}, "t:3"), ({}, "t:2")], on_duplicate="error")
        except durable.KeyTaken as exc:
            assert exc.holder_id == holder
        # The refused call left the transaction usable, and wrote nothing.
        assert list(Run.objects.values_list("key", flat=True)) == ["t:2"]


@pytest.mark.postgres
def test_ten_thousand_items_in_one_statement_per_batch(define):
    workflow = define("batched")
    durable.start(workflow, key="item:5")  # one duplicate the statement answers
    pairs = [({"n": n}, f"item:{n}" if n % 2 else None) for n in range(10_000)]
    with CaptureQueriesContext(connection) as queries:
        results = durable.start_many(workflow, pairs)
    statements = [q["sql"] for q in queries.captured_queries]
    batches = [s for s in statements if "WITH item AS" in s]
    assert len(batches) == 10_000 // batch.BATCH_SIZE
    # The batches, the duplicate's activity row, and the savepoint around the call.
    assert len(statements) == len(batches) + 1 + 2, statements[-3:]
    assert [r.outcome for r in results].count("use_existing") == 1
    assert Run.objects.filter(workflow=workflow.name).count() == 10_000


def test_the_batch_statement_names_every_column():
    from django_durable.store.engines import postgres

    insert = postgres.START_BATCH.split("INSERT INTO durable_run (")[1].split(")")[0]
    named = [name.strip().strip('"') for name in insert.split(",")]
    assert named == [field.column for field in Run._meta.concrete_fields]
