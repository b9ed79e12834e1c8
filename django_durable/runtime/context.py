"""The ``ctx`` a step receives: input, context values, waits and heartbeats.

It lives beside the executor that makes it: it renews the run's lease, starts
child runs (``operations.children``) and reads the clock, which a workflow's
definition (``workflows/``) never does.

A wait (``sleep``, ``wait_for_event``, ``wait_for_any``, ``wait_for_all``,
``wait_for_input``: ``runtime.waits``) suspends the run by raising ``Suspend``;
the executor records it and frees the worker. When the run resumes, the step runs
again from its start and each wait it already passed returns the value recorded
for it, in call order.
"""

from __future__ import annotations

import copy
import uuid
from typing import Any

from django_durable import conf, store
from django_durable.exceptions import Cancelled, RunTimedOut
from django_durable.operations import children, streams
from django_durable.operations.state import Suspend
from django_durable.runtime.async_context import AsyncContextMethods, refuse_in_event_loop
from django_durable.runtime.stream_writer import StreamWriter
from django_durable.runtime.waits import WaitMethods
from django_durable.workflows.definition import OnDuplicate, Workflow
from django_durable.workflows.values import check_json

__all__ = ["Context", "Suspend"]


def _step_name(run, index: int) -> str:
    names = run.step_names or []
    return names[index] if index < len(names) else str(index)


def _name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"context names are strings, got {name!r}")
    return name


class Context(WaitMethods, AsyncContextMethods):
    """What a step sees of its run. One is made for each execution of a step.
    An ``async def`` step awaits ``aheartbeat``, ``acall_workflow``, ``aparallel``."""

    def __init__(
        self,
        run,
        *,
        waits: list[Any],
        starts_runs: bool = True,
        step: str | None = None,
        step_index: int | None = None,
    ):
        self._run = run
        # The step being run (its name and index): what a stream item records.
        self._step_index = run.step_index if step_index is None else step_index
        self._step = step if step is not None else _step_name(run, self._step_index)
        # A transaction open before the step began (a test's, around drain()) holds its
        # stream writes as it holds every other write; one the step opens does not.
        self._joins = not store.in_autocommit()
        # A compensation's ctx starts no run: it cannot wait for a child, and a run it
        # started would outlive an undo that runs again (runtime.compensation).
        self._starts_runs = starts_runs
        self._data: dict[str, Any] = copy.deepcopy(run.context or {})
        self._waits = waits
        self._wait_calls = 0

    # --- the run ---------------------------------------------------------

    @property
    def run_id(self) -> uuid.UUID:
        return self._run.id

    @property
    def input(self) -> dict[str, Any]:
        return self._run.input

    @property
    def inputs(self) -> list[dict[str, Any]]:
        """Every input the run was started with, oldest first: its own first input and
        those of the starts that ``debounce`` or ``on_duplicate="run_again"`` folded
        into it (``input`` is the last). At most ``DURABLE["MAX_FOLDED_INPUTS"]``, the
        newest; ``[input]`` when nothing was folded, and in a rerun."""
        folded = self._run.inputs
        return list(folded) if folded else [self._run.input]

    @property
    def attempt(self) -> int:
        """The attempt of the current step: 1 the first time, 2 at the first retry..."""
        return self._run.attempt

    @property
    def workflow(self) -> str:
        return self._run.workflow

    @property
    def key(self) -> str | None:
        return self._run.key

    # --- context values ----------------------------------------------------

    def get(self, name: str, default: Any = None) -> Any:
        return self._data.get(name, default)

    def put(self, name: str, value: Any) -> None:
        """Store a JSON value under ``name``; saved when the step completes.

        ``TypeError`` at the call for a name that is not a ``str`` or a value that is
        not JSON, ``ValueError`` for one no database can store (``workflows.values``)."""
        self._data[_name(name)] = check_json(copy.deepcopy(value), f"context value {name!r}")

    def delete(self, name: str) -> None:
        """Remove ``name`` from the context (nothing happens if it is not there)."""
        self._data.pop(_name(name), None)

    def append(self, name: str, value: Any) -> None:
        """Append a JSON value to the list under ``name`` (a new list if there is none);
        ``TypeError`` if ``name`` holds something else than a list."""
        current = self._data.get(_name(name), [])
        if not isinstance(current, list):
            raise TypeError(f"context value {name!r} is a {type(current).__name__}, not a list")
        item = check_json(copy.deepcopy(value), f"context value appended to {name!r}")
        self._data[name] = [*current, item]

    def increment(self, name: str, by: int = 1) -> int:
        """Add ``by`` to the integer under ``name`` (0 if there is none); return the sum."""
        if not isinstance(by, int) or isinstance(by, bool):
            raise TypeError(f"increment takes an int, got {type(by).__name__}")
        current = self._data.get(_name(name), 0)
        if not isinstance(current, int) or isinstance(current, bool):
            raise TypeError(f"context value {name!r} is a {type(current).__name__}, not an int")
        self._data[name] = current + by
        return current + by

    def merge(self, mapping: dict[str, Any]) -> None:
        """Put every item of ``mapping``, all or none: each is checked before any is set."""
        if not isinstance(mapping, dict):
            raise TypeError(f"merge takes a dict, got {type(mapping).__name__}")
        checked = {
            _name(name): check_json(copy.deepcopy(value), f"context value {name!r}")
            for name, value in mapping.items()
        }
        self._data.update(checked)

    @property
    def data(self) -> dict[str, Any]:
        return self._data

    # --- liveness ----------------------------------------------------------

    def heartbeat(self) -> None:
        """Renew the run's lease; raise ``Cancelled`` if the run was cancelled, and
        ``RunTimedOut`` (a ``Cancelled``) once the step's or the run's timeout passed.

        Long steps call it now and then: it is how a cancel reaches running code,
        and how a worker keeps a run that outlives the lease without a heartbeat
        thread.
        """
        deadline = getattr(self._run, "deadline", None)
        if deadline is not None and store.now() >= deadline:
            # The step's timeout or the run's passed: stop; the attempt ends failed.
            raise RunTimedOut(f"run {self._run.id}: the step passed its deadline ({deadline})")
        if getattr(self._run, "lease_lost", False):
            # The worker's own heartbeat already saw the cancel (or the loss).
            raise Cancelled(f"run {self._run.id} was cancelled or is no longer owned")
        refuse_in_event_loop("ctx.heartbeat()", "await ctx.aheartbeat()")
        try:
            store.renew_lease(self._run, conf.get("LEASE"))
        except store.LeaseLost:
            raise Cancelled(f"run {self._run.id} was cancelled or is no longer owned") from None

    # --- live progress and streams (docs/streams.md) -------------------------------

    def stream(self, name: str = "default") -> StreamWriter:
        """The writer of the run's stream ``name`` (1 to 100 bytes: ``TypeError`` /
        ``ValueError`` otherwise): ``write(value)``, ``close()`` (``awrite``,
        ``aclose`` in an async step)."""
        name = streams.check_stream_name(name)
        return StreamWriter(self._run, self._step, self._step_index, name, join=self._joins)

    def progress(self, done: float, total: float | None = None, message: str | None = None):
        """Report the run's progress: kept as ``Run.progress`` (the latest) and written
        as an item of its ``"progress"`` stream. ``done``/``total``: numbers >= 0
        (``total`` may be None); ``message``: a str of at most 1,000 characters."""
        refuse_in_event_loop("ctx.progress()", "await ctx.aprogress(...)")
        streams.report_progress(
            self._run, self._step, self._step_index, done, total, message, join=self._joins
        )

    # --- children and parallel branches (operations.children) -------------------

    def call_workflow(
        self,
        workflow: type[Workflow] | str,
        input: dict[str, Any] | None = None,
        *,
        key: str | None = None,
    ) -> Any:
        """Start ``workflow`` as a child run (no key unless ``key=`` is given) and
        return its result; raises ``durable.ChildFailed`` if it doesn't complete.
        The run waits without holding a worker; the same child is found again when
        the step runs again."""
        return children.call_workflow(self._starting(), workflow, input, key=key)

    def parallel(self, branches: list, *, mode: str = "fail_fast") -> list[Any]:
        """Run ``branches`` (workflows or ``(workflow, input)`` pairs) as child runs
        at once and return their results in order. See ``durable.parallel``."""
        return children.parallel(self._starting(), branches, mode=mode)

    def start(
        self,
        workflow: type[Workflow] | str,
        input: dict[str, Any] | None = None,
        *,
        key: str | None = None,
        on_duplicate: OnDuplicate | None = None,
        flow_key: str | None = None,
    ) -> uuid.UUID:
        """Start another run without waiting for it; return its id. The same call in
        a step that runs again (after a wait or a retry) returns the same run and
        starts nothing new (``durable.start()`` inside a step would start again).
        ``flow_key``: as ``durable.start()``'s."""
        return children.start_from_step(
            self._starting(), workflow, input, key=key, on_duplicate=on_duplicate, flow_key=flow_key
        )

    def _starting(self) -> Context:
        if not self._starts_runs:
            raise RuntimeError("child runs are started from a step, not from a compensation")
        return self
