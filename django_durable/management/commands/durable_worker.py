import logging
import sys
from argparse import ArgumentTypeError

from django.core.management.base import BaseCommand, CommandError

from django_durable.conf import WORKER_CONCURRENCY
from django_durable.runtime.worker import Worker, WorkerIdInUse

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = {0: logging.WARNING, 1: logging.INFO}


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def queue_list(text: str) -> list[str]:
    queues = [name.strip() for name in text.split(",")]
    if not all(queues):
        raise ArgumentTypeError(f"--queues takes names separated by commas, got {text!r}")
    return queues


def worker_id(text: str) -> str:
    if not text.strip() or len(text) > 200:
        raise ArgumentTypeError("--worker-id must be 1 to 200 characters")
    return text


class Command(BaseCommand):
    help = (
        "Run durable workflows: claim due runs and execute them. Run as many as you need, "
        "on as many machines as you like, against one database."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--queues",
            type=queue_list,
            default=None,
            help="Only these queues, separated by commas (default: every queue).",
        )
        parser.add_argument(
            "--concurrency",
            type=positive_int,
            default=WORKER_CONCURRENCY,
            help="Runs executed at once, one thread and one database connection each "
            "(the worker holds N + 4 connections, + 1 to LISTEN; system check W003).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit (code 0) as soon as nothing is due.",
        )
        parser.add_argument(
            "--worker-id",
            type=worker_id,
            default=None,
            help="This worker's name, unique among live workers (default: host-pid-random).",
        )
        parser.add_argument(
            "--poll-interval",
            type=positive_seconds,
            default=None,
            help="Seconds between looks for due runs when idle "
            "(default: DURABLE['POLL_INTERVAL']; NOTIFY wakes a PostgreSQL worker sooner).",
        )

    def handle(self, *args, queues, concurrency, burst, worker_id, poll_interval, **options):
        self._configure_logging(options["verbosity"])
        worker = Worker(
            queues=queues,
            concurrency=concurrency,
            burst=burst,
            worker_id=worker_id,
            poll_interval=poll_interval,
        )
        try:
            code = worker.run()
        except WorkerIdInUse as exc:
            raise CommandError(str(exc)) from None
        if code:
            sys.exit(code)

    def _configure_logging(self, verbosity: int) -> None:
        """Show the worker's lifecycle on stderr unless the project configured logging for it."""
        package = logging.getLogger("django_durable")
        if not package.hasHandlers():
            package.setLevel(LEVELS.get(verbosity, logging.DEBUG))
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(LOG_FORMAT))
            package.addHandler(handler)
