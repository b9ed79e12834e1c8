"""``durable stream RUN_ID [--name N] [--after OFFSET] [--follow]``: a run's stream, one
JSON line per item (docs/streams.md)."""

from __future__ import annotations

import json

from django.core.serializers.json import DjangoJSONEncoder

import django_durable as durable
from django_durable.cli.base import answering, run_id


def add_parsers(commands) -> None:
    p = commands.add_parser("stream", help="a run's stream, one JSON line per item")
    p.add_argument("run_id", type=run_id, metavar="RUN_ID")
    p.add_argument("--name", default="default", help='the stream (default: "default")')
    p.add_argument("--after", type=int, default=None, metavar="OFFSET")
    p.add_argument("--follow", action="store_true", help="wait for new items until it ends")
    p.set_defaults(handler=stream)


def stream(options, out, err) -> None:
    with answering(options["run_id"]):
        items = durable.read_stream(
            options["run_id"],
            options["name"],
            after=options["after"],
            timeout=None if options["follow"] else 0,
        )
        for item in items:
            line = json.dumps(item._asdict(), cls=DjangoJSONEncoder, sort_keys=True)
            out.write(line)
            out.flush()
