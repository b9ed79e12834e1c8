from argparse import ArgumentTypeError
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

import django_durable as durable
from django_durable.workflows.durations import parse_duration


def older_than(text: str) -> timedelta:
    """--older-than: a bad duration is the parser's error (usage, one line, exit 2)."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ArgumentTypeError(str(exc)) from None


class Command(BaseCommand):
    help = "Delete finished runs past retention (freeing their keys) and old activity."

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            type=older_than,
            default=None,
            help="Override DURABLE['RUN_RETENTION'] (e.g. 30d, 12h; 0 prunes every finished run).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )

    def handle(self, *args, older_than=None, dry_run=False, **options):
        try:
            count = durable.prune(older_than, dry_run=dry_run)
        except ValueError as exc:  # an age reaching back before year 1
            raise CommandError(str(exc), returncode=2) from None
        if dry_run:
            self.stdout.write(f"{count} finished runs would be pruned")
            return
        self.stdout.write(f"pruned {count} finished runs")
