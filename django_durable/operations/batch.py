"""``start_many()``: many starts of one workflow in one call, with the answers
``start()`` would give item by item.

On PostgreSQL the runs go in one statement per batch of ``BATCH_SIZE`` items
(``store.start_batch``): every first use of a key, and every item without one. An
item whose key the statement found taken is answered from its holder when the
rules say the holder answers (``use_existing``: the duplicates' activity rows go in
with one more statement); one the rules send elsewhere (a hand-off from a finished
holder, ``cancel_existing``, ``run_again``, ``send_event``, a debounced workflow)
and a later item with a key the batch already used are started alone, in order,
through the path of ``start()``. ``on_duplicate="error"`` on a taken key raises
``KeyTaken``, and nothing of the call is written: it runs in one transaction (a
savepoint inside the caller's). On SQLite every item takes the path of ``start()``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django_durable import signals, store, telemetry
from django_durable.exceptions import InvalidKey, KeyTaken
from django_durable.operations import inputs, keys
from django_durable.operations.calls import public_call
from django_durable.operations.keys import Action
from django_durable.operations.start import StartResult, checked, start_run
from django_durable.workflows.definition import OnDuplicate, Workflow
from django_durable.workflows.flow import flow_key_of

__all__ = ["BATCH_SIZE", "start_many"]

BATCH_SIZE = 1000


def _items(definition, items: Iterable[Any]) -> list[tuple[dict, str | None, str | None]]:
    """Every item checked, before anything is written: (input, key) pairs and
    (input, key, flow_key) triples, mixed; each with its flow key (given, or from the
    workflow's ``flow_key`` function)."""
    if isinstance(items, dict | str | bytes):
        raise TypeError("items must be an iterable of (input, key) pairs")
    checked_items = []
    for n, item in enumerate(items):
        if not isinstance(item, tuple | list) or len(item) not in (2, 3):
            raise TypeError(
                f"item {n} must be an (input, key) pair or an (input, key, flow_key) "
                f"triple, got {item!r}"
            )
        payload, key, flow_key = item if len(item) == 3 else (*item, None)
        try:
            payload = inputs.validate_input(payload)
            checked_items.append(
                (payload, keys.validate_key(key), flow_key_of(definition, payload, flow_key))
            )
        except InvalidKey as exc:  # the same class (and code), saying which item
            raise type(exc)(f"item {n}: {exc}", code=exc.code, params=exc.params) from None
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"item {n}: {exc}") from None
    return checked_items


@public_call("astart_many")
def start_many(
    workflow: type[Workflow] | str,
    items: Iterable[
        tuple[dict[str, Any] | None, str | None]
        | tuple[dict[str, Any] | None, str | None, str | None]
    ],
    *,
    on_duplicate: OnDuplicate | None = None,
) -> list[StartResult]:
    """Start ``workflow`` once per ``(input, key)`` item (or ``(input, key, flow_key)``
    triple: the two may be mixed), in order, following the rules
    of ``start()`` (a later item with a key an earlier one used is its duplicate);
    return a ``StartResult`` per item, in the same order.

    Bad items raise (``TypeError``, ``ValueError``, ``InvalidKey``) before anything is
    written;
    ``KeyTaken`` (``on_duplicate="error"``) leaves nothing of the call written.
    """
    definition, _, _, policy = checked(workflow, None, None, on_duplicate)
    pairs = _items(definition, items)
    results: list[StartResult | None] = [None] * len(pairs)
    with store.atomic():
        if not store.engine().BATCHES:
            for n, (payload, key, flow_key) in enumerate(pairs):
                results[n] = start_run(definition, payload, key, policy, flow_key=flow_key)
            return results  # type: ignore[return-value]
        alone, batched = _split(definition, pairs)
        taken: list[tuple[int, uuid.UUID]] = []  # items whose holder refuses them
        for first in range(0, len(batched), BATCH_SIZE):
            batch = batched[first : first + BATCH_SIZE]
            _start_batch(definition, policy, pairs, batch, results, alone, taken)
        # In order, as start() item by item: the first refused item raises KeyTaken,
        # after the items before it (which may raise first) and before the rest.
        refused = min(taken, default=None)
        for n in sorted(alone):
            if refused is not None and n > refused[0]:
                break
            payload, key, flow_key = pairs[n]
            results[n] = start_run(definition, payload, key, policy, flow_key=flow_key)
        if refused is not None:
            n, holder_id = refused
            raise KeyTaken(
                holder_id, f"key {pairs[n][1]!r} of {definition.name} is held by run {holder_id}"
            )
    return results  # type: ignore[return-value]


def _split(definition, pairs) -> tuple[list[int], list[int]]:
    """The items started alone (a key an earlier item used; any keyed item of a
    debounced workflow) and those the batch statements take."""
    alone, batched, seen = [], [], set()
    debounced = definition.debounce is not None
    for n, (_payload, key, _flow_key) in enumerate(pairs):
        if key is not None and (debounced or key in seen):
            alone.append(n)
            continue
        if key is not None:
            seen.add(key)
        batched.append(n)
    return alone, batched


def _start_batch(definition, policy, pairs, sent, results, alone, taken) -> None:
    """One statement for a batch of items; the answers of the holders it found."""
    at = store.now()
    ids = [uuid.uuid4() for _ in sent]
    answers = store.start_batch(
        workflow=definition.name,
        queue=definition.queue,
        priority=definition.priority,
        due_at=at,
        timeout_at=at + definition.timeout if definition.timeout else None,
        step_names=definition.step_names(),
        items=[(run_id, *pairs[n]) for run_id, n in zip(ids, sent, strict=True)],
        trace_context=telemetry.trace_context(),
    )
    duplicates = []
    for run_id, n, answer in zip(ids, sent, answers, strict=True):
        key = pairs[n][1]
        if answer.inserted:
            results[n] = StartResult(run_id, "started")
            store.send_after_commit(
                signals.run_started, definition, run_id=run_id, workflow=definition.name, key=key
            )
            continue
        if answer.holder_id is None:
            alone.append(n)  # the holder moved on while the statement ran
            continue
        action = keys.decide(
            reuse=definition.reuse,
            on_duplicate=policy,
            holder=keys.Holder(status=answer.holder_status, picked_up=answer.picked_up),
        )
        if action is Action.USE_EXISTING:
            results[n] = StartResult(answer.holder_id, "use_existing")
            duplicates.append((n, answer))
        elif action is Action.RAISE_TAKEN:
            taken.append((n, answer.holder_id))
        else:
            alone.append(n)
    _record_duplicates(definition, pairs, duplicates)


def _record_duplicates(definition, pairs, duplicates) -> None:
    """The duplicates the holders answered: their activity rows in one statement, and
    a signal each after commit."""
    if not duplicates:
        return
    at = store.now()
    rows = []
    for n, answer in duplicates:
        payload, key, _flow_key = pairs[n]
        details = {
            "key": key,
            "workflow": definition.name,
            "outcome": "use_existing",
            "input_changed": answer.input_changed,
            "input": payload,
        }
        rows.append((answer.holder_id, key, details))
        store.send_after_commit(
            signals.key_duplicate,
            definition,
            run_id=answer.holder_id,
            workflow=definition.name,
            key=key,
            outcome="use_existing",
            input_changed=answer.input_changed,
            input=payload,
        )
    store.record_duplicates(definition.name, rows, at=at)
