from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError

import django_durable as durable


def parse_duration(text: str) -> timedelta:
    """'30d', '12h', '15m', '90s' or a number of seconds."""
    units = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds"}
    text = text.strip()
    try:
        if text and text[-1] in units:
            return timedelta(**{units[text[-1]]: float(text[:-1])})
        return timedelta(seconds=float(text))
    except ValueError:
        raise CommandError(f"not a duration: {text!r} (use 30d, 12h, 15m, 90s)") from None


class Command(BaseCommand):
    help = "Delete finished runs past retention (freeing their keys) and old activity."

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            type=parse_duration,
            default=None,
            help="Override DURABLE['RUN_RETENTION'] (e.g. 30d, 12h).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
        )

    def handle(self, *args, older_than=None, dry_run=False, **options):
        if dry_run:
            count = durable.prune(older_than, dry_run=True)
            self.stdout.write(f"{count} finished runs would be pruned")
            return
        count = durable.prune(older_than)
        self.stdout.write(f"pruned {count} finished runs")
