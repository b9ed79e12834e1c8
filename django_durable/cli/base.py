"""What every subcommand shares: the exit statuses, argument types, tables and JSON."""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from django.core.exceptions import ObjectDoesNotExist, ValidationError
from django.core.management import CommandError
from django.core.management.base import CommandParser, OutputWrapper
from django.core.serializers.json import DjangoJSONEncoder

import django_durable as durable
from django_durable.models import Run

REFUSED = 1
BAD_USAGE = 2


class UsageParser(CommandParser):
    """Subcommand parser: bad usage exits 2, also under ``call_command()``.

    It also takes Django's own options (``--traceback``, ``--verbosity``...) after
    the subcommand, as people type them (``durable list --traceback``): each is
    absent unless given (``SUPPRESS``), so one given before the subcommand stays."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        django = self.add_argument_group("Django's options (also accepted before COMMAND)")
        django.add_argument(
            "-v", "--verbosity", type=int, choices=[0, 1, 2, 3], default=argparse.SUPPRESS
        )
        for name in ("--settings", "--pythonpath"):
            django.add_argument(name, default=argparse.SUPPRESS)
        for name in ("--traceback", "--no-color", "--force-color", "--skip-checks"):
            django.add_argument(name, action="store_true", default=argparse.SUPPRESS)

    def error(self, message):
        if self.called_from_command_line:
            super().error(message)  # argparse: usage on stderr, exit status 2
        raise CommandError(f"Error: {message}", returncode=BAD_USAGE)


def refused(message: str) -> CommandError:
    return CommandError(message, returncode=REFUSED)


def bad_usage(message: str) -> CommandError:
    return CommandError(message, returncode=BAD_USAGE)


def run_id(value: str) -> uuid.UUID:
    """argparse type of a RUN_ID argument."""
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValueError(f"not a run id: {value!r}") from None


def json_value(value: str) -> Any:
    """argparse type of a JSON argument."""
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ValueError(f"not JSON ({exc}): {value!r}") from None


# argparse names the type in its message ("invalid run id value: 'x'").
run_id.__name__ = "run id"
json_value.__name__ = "JSON"


@contextmanager
def answering(run: uuid.UUID | None = None) -> Iterator[None]:
    """Turn the API's refusals into exit status 1 and its bad-input errors into 2
    (``run``: the run the command names, for "no run <id>")."""
    try:
        yield
    except durable.KeyTaken as exc:
        # Its message names the holder already, as every KeyTaken raised here does.
        holder = "" if str(exc.holder_id) in str(exc) else f" (holder: {exc.holder_id})"
        raise refused(f"{exc}{holder}") from exc
    except ValidationError as exc:  # (InvalidKey too: a DurableError and a ValueError)
        raise bad_usage("; ".join(exc.messages)) from exc
    except (TypeError, ValueError, LookupError) as exc:  # (UnknownWorkflow too)
        raise bad_usage(str(exc)) from exc
    except durable.DurableError as exc:
        raise refused(f"{type(exc).__name__}: {exc}") from exc
    except ObjectDoesNotExist as exc:
        if run is not None and isinstance(exc, Run.DoesNotExist):
            raise refused(f"no run {run}") from exc
        raise refused(f"not found: {exc}") from exc


def emit_json(out: OutputWrapper, value: Any) -> None:
    out.write(json.dumps(value, cls=DjangoJSONEncoder, indent=2, sort_keys=True))


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, dict | list):
        return json.dumps(value, cls=DjangoJSONEncoder)
    return str(value)


def table(out: OutputWrapper, rows: Sequence[dict], columns: Sequence[str]) -> None:
    """Rows as aligned columns, headed by the column names."""
    texts = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(t[i]) for t in texts)]) for i, c in enumerate(columns)]
    out.write("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for text in texts:
        out.write("  ".join(t.ljust(w) for t, w in zip(text, widths, strict=True)).rstrip())


def pairs(out: OutputWrapper, values: dict) -> None:
    """``name: value`` lines, names aligned."""
    width = max(len(name) for name in values)
    for name, value in values.items():
        out.write(f"{name.ljust(width)}  {cell(value)}")
