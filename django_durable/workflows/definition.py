"""Workflow definitions: the ``Workflow`` base class, ``@step`` and the registry.

A definition is checked when its class is created, so a bad one fails at import
with ``ImproperlyConfigured`` rather than at the first start.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeAlias, overload

from django.core.exceptions import ImproperlyConfigured

from django_durable.exceptions import UnknownWorkflow
from django_durable.workflows.cron import check_cron, check_timezone
from django_durable.workflows.durations import as_timedelta
from django_durable.workflows.flow import Rate, flow_problem
from django_durable.workflows.retention import validated_retention

if TYPE_CHECKING:
    # Only for the annotations: the context module needs the store, this one doesn't.
    from django_durable.runtime.context import Context

# The values a type checker accepts, kept next to the tuples the checks use.
Reuse: TypeAlias = Literal["after_close", "after_failure", "never"]
OnDuplicate: TypeAlias = (
    Literal["use_existing", "error", "cancel_existing", "run_again"]
    | tuple[Literal["send_event"], str]
)
BackoffKind: TypeAlias = Literal["exponential", "linear", "constant"]
# A step: a method taking the run's ``Context``; ``def`` or ``async def``.
StepFunction: TypeAlias = "Callable[[Any, Context], object]"

REUSE_POLICIES = ("after_close", "after_failure", "never")
SIMPLE_ON_DUPLICATE = ("use_existing", "error", "cancel_existing", "run_again")
DEFAULT_MAX_BACKOFF = timedelta(hours=1)
BACKOFF_KINDS = ("exponential", "linear", "constant")


@dataclass(frozen=True)
class Debounce:
    """Collapse a burst of keyed starts into one run with the last input.

    ``period``: how long a keyed start waits before it runs; each start with the
    same key in that time restarts the wait. ``timeout``: the longest wait from
    the first start, however many starts keep coming (``None``: no cap).
    """

    period: timedelta
    timeout: timedelta | None = None

    def __post_init__(self):
        object.__setattr__(self, "period", as_timedelta(self.period, "Debounce period"))
        if self.timeout is not None:
            object.__setattr__(self, "timeout", as_timedelta(self.timeout, "Debounce timeout"))


@dataclass(frozen=True)
class Cron:
    """A schedule declared on a workflow class: ``schedules = [Cron("*/5 * * * *")]``."""

    cron: str
    key: str | None = None
    input: dict | None = None
    name: str | None = None
    timezone: str = "UTC"

    def validate(self) -> None:
        """Raise ``ValueError`` (or ``TypeError``) for a bad expression, timezone or key."""
        check_cron(self.cron)
        check_timezone(self.timezone)
        if self.key is not None and (not isinstance(self.key, str) or not self.key):
            raise ValueError(f"a schedule key is a non-empty string, got {self.key!r}")
        if self.input is not None and not isinstance(self.input, dict):
            raise TypeError(f"a schedule input is a dict, got {type(self.input).__name__}")


class StepDef:
    """One step of a workflow, in definition order, with its failure options:

    - ``retries``: attempts after the first; ``backoff`` the wait before the first
      retry, growing by ``backoff_kind`` (``"exponential"``: doubling,
      ``"linear"``: backoff x n, ``"constant"``), capped at ``max_backoff``;
      ``jitter=True`` waits a random part (50 to 100 %) of it, so retries of many
      runs spread out;
    - ``timeout``: an attempt still running past it is a failed attempt
      (``StepTimeout``); its late result is never recorded;
    - ``give_up_on``: exception classes that fail the step at once, like
      ``NonRetryable``.
    """

    def __init__(
        self,
        fn: Callable,
        *,
        retries: int = 0,
        backoff: timedelta | float = timedelta(seconds=1),
        backoff_kind: BackoffKind = "exponential",
        max_backoff: timedelta | float | None = None,
        jitter: bool = False,
        timeout: timedelta | float | None = None,
        give_up_on: tuple[type[BaseException], ...] | type[BaseException] = (),
        compensate: str | None = None,
        compensate_retries: int | None = None,
    ):
        where = f"step {fn.__name__}"
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ImproperlyConfigured(
                f"{where}: retries must be a whole number >= 0, got {retries!r}"
            )
        if compensate is not None and (not isinstance(compensate, str) or not compensate):
            raise ImproperlyConfigured(
                f"{where}: compensate must name a method, got {compensate!r}"
            )
        if compensate_retries is not None and (
            not isinstance(compensate_retries, int)
            or isinstance(compensate_retries, bool)
            or compensate_retries < 0
        ):
            raise ImproperlyConfigured(
                f"{where}: compensate_retries must be a whole number >= 0, "
                f"got {compensate_retries!r}"
            )
        if backoff_kind not in BACKOFF_KINDS:
            raise ImproperlyConfigured(
                f"{where}: backoff_kind must be one of {', '.join(map(repr, BACKOFF_KINDS))}, "
                f"got {backoff_kind!r}"
            )
        if not isinstance(jitter, bool):
            raise ImproperlyConfigured(f"{where}: jitter must be True or False, got {jitter!r}")
        if isinstance(give_up_on, type):
            give_up_on = (give_up_on,)
        if not isinstance(give_up_on, tuple | list) or not all(
            isinstance(c, type) and issubclass(c, BaseException) for c in give_up_on
        ):
            raise ImproperlyConfigured(
                f"{where}: give_up_on must be a tuple of exception classes, got {give_up_on!r}"
            )
        try:
            self.backoff = as_timedelta(backoff, f"{where}: backoff")
            self.max_backoff = as_timedelta(
                DEFAULT_MAX_BACKOFF if max_backoff is None else max_backoff,
                f"{where}: max_backoff",
            )
            self.timeout = None if timeout is None else as_timedelta(timeout, f"{where}: timeout")
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(str(exc)) from exc
        if self.timeout is not None and self.timeout <= timedelta(0):
            raise ImproperlyConfigured(f"{where}: timeout must be positive, got {timeout!r}")
        self.fn = fn
        self.name = fn.__name__
        self.retries = retries
        self.backoff_kind = backoff_kind
        self.jitter = jitter
        self.give_up_on = tuple(give_up_on)
        self.compensate = compensate
        # A compensation retries like its step unless told otherwise.
        self.compensate_retries = retries if compensate_retries is None else compensate_retries
        self.__doc__ = fn.__doc__

    def delay_before(self, attempt: int) -> timedelta:
        """The wait before ``attempt`` (2, 3, ...), by ``backoff_kind``, capped, jittered."""
        n = max(attempt - 1, 1)  # the n-th retry
        base = self.backoff.total_seconds()
        if self.backoff_kind == "exponential":
            seconds = base * 2.0 ** min(n - 1, 64)
        elif self.backoff_kind == "linear":
            seconds = base * n
        else:
            seconds = base
        seconds = min(seconds, self.max_backoff.total_seconds())
        if self.jitter:
            seconds *= random.uniform(0.5, 1.0)
        return timedelta(seconds=seconds)

    def gives_up_on(self, exc: BaseException) -> bool:
        """True when ``exc`` fails the step at once (``give_up_on``)."""
        return bool(self.give_up_on) and isinstance(exc, self.give_up_on)

    def __call__(self, workflow_self, ctx):
        return self.fn(workflow_self, ctx)

    def __repr__(self):
        return f"<step {self.name}>"


@overload
def step(fn: StepFunction, /) -> StepDef: ...


@overload
def step(
    *,
    retries: int = 0,
    backoff: timedelta | float = ...,
    backoff_kind: BackoffKind = "exponential",
    max_backoff: timedelta | float | None = None,
    jitter: bool = False,
    timeout: timedelta | float | None = None,
    give_up_on: tuple[type[BaseException], ...] | type[BaseException] = (),
    compensate: str | None = None,
    compensate_retries: int | None = None,
) -> Callable[[StepFunction], StepDef]: ...


def step(
    fn: StepFunction | None = None, /, **options: Any
) -> StepDef | Callable[[StepFunction], StepDef]:
    """Mark a method as a step. Use bare (``@step``) or with options
    (``@step(retries=3, backoff=seconds(1), compensate="undo")``); the options are
    those of ``StepDef``. The two forms are overloads, so type checkers know that
    ``@step(...)`` returns a decorator and ``@step`` a step."""
    if fn is not None:
        return StepDef(fn, **options)
    return lambda f: StepDef(f, **options)


def _snake_case(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Registry:
    """Every defined workflow, by name."""

    def __init__(self):
        self._by_name: dict[str, type[Workflow]] = {}
        # Grows at every (un)registration: what reads the definitions as a whole
        # (the flow limits a claim takes) keeps its reading until it changes.
        self.version = 0
        self._finders: list[Callable[[str], object]] = []
        self._found_prefixes: list[str] | None = []

    def add_finder(self, finder: Callable[[str], object], *, prefix: str | None = None) -> None:
        """Call ``finder(name)`` for a name nobody registered yet, so it can import the
        module that defines it (the tasks backend's workflows live with their tasks).
        ``prefix``: the names it finds start with it (None: it may find any name)."""
        if finder not in self._finders:
            self._finders.append(finder)
            if prefix is None or self._found_prefixes is None:
                self._found_prefixes = None
            else:
                self._found_prefixes.append(prefix)

    def served(self) -> tuple[list[str], list[str]] | None:
        """What a worker can run: the registered names and the prefixes of the names
        finders find; None when a finder may find any name."""
        if self._found_prefixes is None:
            return None
        return sorted(self._by_name), list(self._found_prefixes)

    def register(self, workflow: type[Workflow]) -> None:
        existing = self._by_name.get(workflow.name)
        if existing is not None and _qualname(existing) != _qualname(workflow):
            raise ImproperlyConfigured(
                f"two workflows are named {workflow.name!r}: "
                f"{_qualname(existing)} and {_qualname(workflow)}"
            )
        self._by_name[workflow.name] = workflow
        self.version += 1

    def unregister(self, name: str) -> None:
        self._by_name.pop(name, None)
        self.version += 1

    def get(self, name: str) -> type[Workflow]:
        if name not in self._by_name:
            for finder in self._finders:
                finder(name)
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownWorkflow(f"no workflow is named {name!r}") from None

    def resolve(self, workflow: type[Workflow] | str) -> type[Workflow]:
        if isinstance(workflow, str):
            return self.get(workflow)
        if isinstance(workflow, type) and issubclass(workflow, Workflow):
            if getattr(workflow, "_abstract", False):
                raise UnknownWorkflow(f"{workflow.__name__} is abstract and cannot be started")
            return self.get(workflow.name)
        raise TypeError(f"workflow must be a Workflow subclass or its name, got {workflow!r}")

    def all(self) -> list[type[Workflow]]:
        return list(self._by_name.values())


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


registry = Registry()


def validate_on_duplicate(value: Any, where: str) -> str | tuple[str, str]:
    """Return a normalised ``on_duplicate`` or raise ``ValueError``."""
    if isinstance(value, str) and value in SIMPLE_ON_DUPLICATE:
        return value
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and value[0] == "send_event"
        and isinstance(value[1], str)
        and value[1]
    ):
        return ("send_event", value[1])
    raise ValueError(
        f"{where}: on_duplicate must be one of {', '.join(map(repr, SIMPLE_ON_DUPLICATE))} "
        f"or ('send_event', name), got {value!r}"
    )


class Workflow:
    """Base class of a workflow. Subclasses define steps with ``@step``.

    Class attributes: ``name``, ``reuse``, ``on_duplicate``, ``debounce``,
    ``timeout``, ``queue``, ``priority`` (higher is claimed first within the queue),
    ``schedules``, ``retention`` (how long finished runs are kept, per status:
    ``workflows.retention``), and flow control by key (``flow_key``,
    ``concurrency_per_key``, ``rate_per_key``, ``concurrency``: ``workflows.flow``,
    docs/flow-control.md). Set ``abstract = True`` on a base
    class that has no steps of its own.
    """

    name: ClassVar[str]
    reuse: ClassVar[Reuse] = "after_close"
    on_duplicate: ClassVar[OnDuplicate] = "use_existing"
    debounce: ClassVar[Debounce | None] = None
    timeout: ClassVar[timedelta | None] = None
    queue: ClassVar[str] = "default"
    priority: ClassVar[int] = 0
    schedules: ClassVar[list[Cron]] = []
    retention: ClassVar[dict[str, timedelta | None] | None] = None
    # Flow control by key (workflows/flow.py): a function of the input naming whose
    # work a run is, and the limits the claim enforces.
    flow_key: ClassVar[Callable[[dict], str | None] | None] = None
    concurrency_per_key: ClassVar[int | None] = None
    rate_per_key: ClassVar[Rate | None] = None
    concurrency: ClassVar[int | None] = None
    # False where something else logs a failed run's traceback: Django's tasks
    # framework does for a task (its task_finished line), so the worker's line for it
    # says the failure without a second traceback.
    log_failure_traceback: ClassVar[bool] = True
    steps: ClassVar[tuple[StepDef, ...]] = ()
    _step_names: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls._abstract = bool(cls.__dict__.get("abstract", False))
        if "name" not in cls.__dict__:
            cls.name = _snake_case(cls.__name__)
        cls.steps = tuple(_collect_steps(cls))
        cls._step_names = tuple(s.name for s in cls.steps)
        if cls._abstract:
            return
        _check_definition(cls)
        registry.register(cls)

    @classmethod
    def step_names(cls) -> tuple[str, ...]:
        """The names of the steps, in order (what a run records when it starts)."""
        return cls._step_names


def _collect_steps(cls: type) -> list[StepDef]:
    """Steps in definition order, base classes first; a subclass may override one."""
    ordered: dict[str, StepDef] = {}
    for klass in reversed(cls.__mro__):
        for attr, value in vars(klass).items():
            if isinstance(value, StepDef):
                ordered[attr] = value
    return list(ordered.values())


def _check_definition(cls: type[Workflow]) -> None:
    where = f"workflow {cls.__qualname__}"
    if not isinstance(cls.name, str) or not cls.name:
        raise ImproperlyConfigured(f"{where}: name must be a non-empty string")
    if cls.reuse not in REUSE_POLICIES:
        raise ImproperlyConfigured(
            f"{where}: reuse must be one of {', '.join(map(repr, REUSE_POLICIES))}, "
            f"got {cls.reuse!r}"
        )
    try:
        cls.on_duplicate = validate_on_duplicate(cls.on_duplicate, where)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None
    if cls.on_duplicate == "run_again" and cls.reuse == "never":
        raise ImproperlyConfigured(
            f"{where}: on_duplicate='run_again' cannot be used with reuse='never' "
            "(the waiting run could never take the key)"
        )
    if cls.debounce is not None and not isinstance(cls.debounce, Debounce):
        raise ImproperlyConfigured(f"{where}: debounce must be a durable.Debounce or None")
    if cls.timeout is not None:
        try:
            cls.timeout = as_timedelta(cls.timeout, f"{where}: timeout")
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(str(exc)) from None
    if not isinstance(cls.queue, str) or not cls.queue:
        raise ImproperlyConfigured(f"{where}: queue must be a non-empty string")
    try:
        cls.retention = validated_retention(cls.retention, where)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None
    if not isinstance(cls.priority, int) or isinstance(cls.priority, bool):
        raise ImproperlyConfigured(f"{where}: priority must be an int")
    problem = flow_problem(cls)
    if problem:
        raise ImproperlyConfigured(f"{where}: {problem}")
    if not cls.steps:
        raise ImproperlyConfigured(f"{where} has no step; mark methods with @step")
    for s in cls.steps:
        if s.compensate is not None and not callable(getattr(cls, s.compensate, None)):
            raise ImproperlyConfigured(
                f"{where}: step {s.name} compensates with {s.compensate!r}, "
                "which is not a method of the workflow"
            )
    for cron in cls.schedules:
        if not isinstance(cron, Cron):
            raise ImproperlyConfigured(f"{where}: schedules must hold durable.Cron objects")
        try:
            cron.validate()
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"{where}: {exc}") from None
