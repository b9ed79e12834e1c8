"""``python manage.py durable <command>``: parses, then hands over to django_durable.cli."""

from django.core.management import call_command
from django.core.management.base import BaseCommand

from django_durable.cli import doctor, keys, queues, rerun, runs, streams
from django_durable.cli.base import UsageParser, refused
from django_durable.management.commands import durable_prune
from django_durable.operations.calls import not_migrated


def add_prune(commands) -> None:
    """``durable prune``: ``durable_prune`` under the one command, with its very
    options (the same parsing, so the same refusals) and its handling."""
    p = commands.add_parser("prune", help="delete finished runs past retention")
    durable_prune.Command().add_arguments(p)
    p.set_defaults(handler=prune)


def prune(options, out, err) -> None:
    call_command(
        "durable_prune",
        older_than=options["older_than"],
        dry_run=options["dry_run"],
        stdout=out,
        stderr=err,
    )


class Command(BaseCommand):
    help = "Look at and act on durable runs, keys and queues (see docs/cli.md)."
    requires_system_checks = []  # doctor must run even when a check would fail

    def add_arguments(self, parser):
        commands = parser.add_subparsers(
            dest="command", metavar="COMMAND", required=True, parser_class=UsageParser
        )
        for group in (runs, rerun, keys, queues, streams, doctor):
            group.add_parsers(commands)
        add_prune(commands)

    def handle(self, *args, **options):
        # doctor reports unapplied migrations itself; every other command needs the tables.
        if options["command"] != "doctor" and (problem := not_migrated()) is not None:
            raise refused(str(problem))
        options["handler"](options, self.stdout, self.stderr)
