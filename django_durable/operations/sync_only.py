"""Synchronous calls made from async code: Django refuses database work in a thread
that runs an event loop (``SynchronousOnlyOperation``, "You cannot call this from an
async context"), which says nothing of what to call instead. ``@sync_only("astart")``
turns that refusal, raised by the call's first statement before anything is written,
into ``durable.CalledFromAsync``, which names the async twin to await.

The refusal is caught, not predicted: a project that sets
``DJANGO_ALLOW_ASYNC_UNSAFE`` keeps what Django allows it, and the happy path pays
for a ``try`` only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from django.core.exceptions import SynchronousOnlyOperation

from django_durable.exceptions import CalledFromAsync

P = ParamSpec("P")
R = TypeVar("R")

__all__ = ["sync_only"]


def sync_only(twin: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Name ``durable.<twin>`` when the decorated call is refused in async code."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        name = fn.__name__

        @functools.wraps(fn)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(*args, **kwargs)
            except SynchronousOnlyOperation as exc:
                # A call inside another (start() calls start_detailed()): the outer
                # one is what the caller wrote, so its name is the one said.
                cause = exc.__cause__ if isinstance(exc, CalledFromAsync) else exc
                raise CalledFromAsync(
                    f"durable.{name}() was called from async code (an async view, or "
                    "anything running in an event loop), where Django allows no "
                    f"database work: use `await durable.{twin}(...)`, which takes the "
                    "same arguments."
                ) from cause

        return call

    return decorate
