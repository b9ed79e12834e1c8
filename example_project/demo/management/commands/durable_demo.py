"""Migrate, start a keyed workflow twice, run it, and say what happened."""

from django.core.management import call_command
from django.core.management.base import BaseCommand

import django_durable as durable
from django_durable.testing import drain


class Command(BaseCommand):
    help = "Run the django-durable demo: keyed starts, a duplicate, and the run to its end."

    def handle(self, *args, **options):
        call_command("migrate", verbosity=0)
        first = durable.start_detailed("process_article", {"id": 42}, key="article:42")
        self.stdout.write(f"start(article:42)       -> {first.outcome}, run {first.run_id}")
        again = durable.start_detailed("process_article", {"id": 42}, key="article:42")
        self.stdout.write(f"start(article:42) again -> {again.outcome}, run {again.run_id}")
        steps = drain()
        run = durable.get_run(first.run_id)
        self.stdout.write(f"ran {steps} steps: run {run.id} is {run.status}, result {run.result}")
        try:
            durable.start("send_invoice", {"number": "INV-2208"}, key="invoice:INV-2208")
            durable.start("send_invoice", {"number": "INV-2208"}, key="invoice:INV-2208")
        except durable.KeyTaken as exc:
            self.stdout.write(f"invoice INV-2208 again  -> KeyTaken, held by run {exc.holder_id}")
        drain()
