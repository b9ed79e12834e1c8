"""``python manage.py durable <command>``: parses, then hands over to django_durable.cli."""

from django.core.management.base import BaseCommand

from django_durable.cli import doctor, keys, queues, rerun, runs, streams
from django_durable.cli.base import UsageParser, refused
from django_durable.operations.calls import not_migrated


class Command(BaseCommand):
    help = "Look at and act on durable runs, keys and queues (see docs/cli.md)."
    requires_system_checks = []  # doctor must run even when a check would fail

    def add_arguments(self, parser):
        commands = parser.add_subparsers(
            dest="command", metavar="COMMAND", required=True, parser_class=UsageParser
        )
        for group in (runs, rerun, keys, queues, streams, doctor):
            group.add_parsers(commands)

    def handle(self, *args, **options):
        # doctor reports unapplied migrations itself; every other command needs the tables.
        if options["command"] != "doctor" and (problem := not_migrated()) is not None:
            raise refused(str(problem))
        options["handler"](options, self.stdout, self.stderr)
