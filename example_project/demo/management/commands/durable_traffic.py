"""Start workflows the way a busy site would: duplicates, edits, bursts and failures."""

import random
import time

from django.core.management.base import BaseCommand

import django_durable as durable


class Command(BaseCommand):
    help = (
        "Generate traffic for the example project: keyed starts with duplicates, so the "
        "dashboard shows re-adds, dropped inputs, KeyTaken, run_again, debounce and hand-offs."
    )

    def add_arguments(self, parser):
        parser.add_argument("--rounds", type=int, default=1, help="Bursts of traffic (default 1).")
        parser.add_argument(
            "--every", type=float, default=0, help="Seconds between rounds; 0 with --forever: 20."
        )
        parser.add_argument("--forever", action="store_true", help="Keep going until Ctrl-C.")
        parser.add_argument("--seed", type=int, default=None, help="Random seed (repeatable).")

    def handle(self, *args, rounds, every, forever, seed, **options):
        rng = random.Random(seed)
        done = 0
        try:
            while forever or done < rounds:
                self.round(rng, done)
                done += 1
                if forever or done < rounds:
                    time.sleep(every or 20)
        except KeyboardInterrupt:
            pass
        self.stdout.write(f"traffic: {done} round(s)")

    def start(self, workflow, payload, key, **kwargs):
        try:
            result = durable.start_detailed(workflow, payload, key=key, **kwargs)
        except durable.KeyTaken as exc:
            self.stdout.write(f"  {workflow:<16} {key:<24} KeyTaken (held by {exc.holder_id})")
            return None
        self.stdout.write(f"  {workflow:<16} {key:<24} {result.outcome}")
        return result

    def round(self, rng, number):
        self.stdout.write(f"round {number + 1}")
        base = number * 10
        # Articles: saved, then saved again with an edited title (the edit is dropped:
        # the run already holds the key). One article fails to summarise.
        for n in range(base + 1, base + 7):
            self.start("process_article", {"id": n, "title": f"Draft {n}"}, f"article:{n}")
        for n in rng.sample(range(base + 1, base + 7), 3):
            self.start("process_article", {"id": n, "title": f"Final {n}"}, f"article:{n}")
        self.start("process_article", {"id": base + 9, "fail": True}, f"article:{base + 9}")
        # A failed article comes back: after_failure hands the key to a new run.
        if number:
            self.start("process_article", {"id": base - 1, "title": "Fixed"}, f"article:{base - 1}")

        # Invoices: sent once; a second send with another amount is refused.
        for n in range(base + 1000, base + 1003):
            payload = {"number": f"INV-{n}", "amount": rng.randint(10, 500)}
            self.start("send_invoice", payload, f"invoice:INV-{n}")
        again = f"INV-{base + 1000}"
        self.start("send_invoice", {"number": again, "amount": 1}, f"invoice:{again}")

        # Accounts: a change during a sync leaves one more sync waiting behind it.
        for account in ("acme", "globex"):
            for change in range(3):
                self.start(
                    "sync_account", {"account": account, "change": change}, f"account:{account}"
                )

        # An article edited five times in a row is indexed once, with the last revision.
        for revision in range(1, 6):
            self.start(
                "index_article", {"id": base + 3, "revision": revision}, f"article-index:{base + 3}"
            )

        # The cleanup, started as its schedule does (key "cleanup"): the second start
        # finds the key taken and starts nothing.
        self.start("cleanup", {}, "cleanup")
        self.start("cleanup", {}, "cleanup")

        # Summaries written word by word: their pages show progress and the stream live.
        for n in range(base + 1, base + 3):
            self.start("summarize_document", {"document": n}, f"summary:{n}")
