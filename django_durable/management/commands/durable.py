"""``python manage.py durable <command>``: parses, then hands over to django_durable.cli."""

from django.core.management.base import BaseCommand

from django_durable.cli import doctor, keys, queues, runs
from django_durable.cli.base import UsageParser


class Command(BaseCommand):
    help = "Look at and act on durable runs, keys and queues (see docs/cli.md)."
    requires_system_checks = []  # doctor must run even when a check would fail

    def add_arguments(self, parser):
        commands = parser.add_subparsers(
            dest="command", metavar="COMMAND", required=True, parser_class=UsageParser
        )
        for group in (runs, keys, queues, doctor):
            group.add_parsers(commands)

    def handle(self, *args, **options):
        options["handler"](options, self.stdout, self.stderr)
