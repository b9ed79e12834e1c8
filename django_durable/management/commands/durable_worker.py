import gc
import logging
import os
import signal
import sys
import threading
from argparse import ArgumentTypeError

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from django_durable import conf
from django_durable.conf import WORKER_CONCURRENCY
from django_durable.operations.queues import queue_stats
from django_durable.runtime.limited import LimitedWorker
from django_durable.runtime.worker import Worker, WorkerIdInUse
from django_durable.workflows.definition import registry

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = {0: logging.WARNING, 1: logging.INFO}
TASKS_BACKEND = "django_durable.tasks.DurableBackend"
# Where Django's Tasks framework logs its task lines (Django 6; the 5.2 backport).
TASKS_LOGGERS = ("django.tasks", "django_tasks")


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
        raise ArgumentTypeError(f"takes queue names separated by commas, got {text!r}")
    return queues


def worker_id(text: str) -> str:
    if not text.strip() or len(text) > 200:
        raise ArgumentTypeError("--worker-id must be 1 to 200 characters")
    return text


def known_queues() -> set[str]:
    """Every queue this project names now: its workflows', DURABLE["QUEUES"], the Tasks
    backends' QUEUES, and those of unfinished or paused runs."""
    names = {workflow.queue for workflow in registry.all()}
    names.update(conf.queue_limits())
    for backend in (getattr(settings, "TASKS", None) or {}).values():
        if backend.get("BACKEND") == TASKS_BACKEND:
            names.update(backend.get("QUEUES") or ())
    names.update(stats["queue"] for stats in queue_stats())
    return names


class StartSignals:
    """SIGTERM / SIGINT from the command's first moment until the worker's own handlers
    take over (``runtime.stopping``): the first stops the worker before it claims
    anything, a clean exit 0; a second exits at once."""

    def __init__(self) -> None:
        self.received = 0
        self.worker: Worker | None = None
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame) -> None:
        self.received += 1
        if self.received > 1:
            os.write(2, b"durable_worker: second signal, exiting at once\n")
            os._exit(1)
        if self.worker is not None:
            self.worker.stop()


class Command(BaseCommand):
    help = (
        "Run durable workflows: claim due runs and execute them. Run as many as you need, "
        "on as many machines as you like, against one database."
    )
    start_signals: StartSignals | None = None

    def run_from_argv(self, argv):
        # First thing: a SIGTERM while Django checks, parses or connects stops cleanly.
        self.start_signals = StartSignals()
        self.start_signals.install()
        try:
            super().run_from_argv(argv)
        finally:
            self.start_signals.restore()
            # The process ends now: what lives now lives until then, so the collector
            # need not walk it again while the interpreter exits (half a second for
            # Django and a project's modules on a busy machine, against a supervisor's
            # wait for an idle worker). Exit handlers (atexit) still run.
            gc.freeze()

    def add_arguments(self, parser):
        parser.add_argument(
            "--queues",
            type=queue_list,
            default=None,
            help="Only these queues, separated by commas (default: every queue).",
        )
        parser.add_argument(
            "--exclude-queues",
            type=queue_list,
            default=None,
            help="Every queue but these, separated by commas: the queues known when the "
            "worker starts (its workflows', settings', and those of unfinished runs) "
            "minus these. Not with --queues.",
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
            "--max-tasks",
            type=positive_int,
            default=None,
            help="Exit (code 0) after executing this many runs (a task is one run); "
            "with --burst, whichever comes first.",
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

    def handle(self, *args, queues, exclude_queues, concurrency, burst, max_tasks, **options):
        self._configure_logging(options["verbosity"])
        if exclude_queues:
            queues = self._every_queue_but(queues, exclude_queues)
        given = {
            "queues": queues,
            "concurrency": concurrency,
            "burst": burst,
            "worker_id": options["worker_id"],
            "poll_interval": options["poll_interval"],
        }
        worker = LimitedWorker(max_runs=max_tasks, **given) if max_tasks else Worker(**given)
        signals = self.start_signals
        if signals is not None:
            signals.worker = worker
            if signals.received:
                self.stderr.write("durable_worker: stopped by a signal before it started")
                return
        try:
            code = worker.run()
        except WorkerIdInUse as exc:
            raise CommandError(str(exc)) from None
        if code:
            sys.exit(code)

    def _every_queue_but(self, queues, excluded: list[str]) -> list[str]:
        if queues:
            raise CommandError(
                "--exclude-queues serves every queue but those given: not with --queues"
            )
        served = sorted(known_queues() - set(excluded))
        if not served:
            raise CommandError(f"--exclude-queues {','.join(excluded)} leaves no queue to serve")
        return served

    def _configure_logging(self, verbosity: int) -> None:
        """Show the worker's lifecycle on stderr unless the project configured logging for
        it; with the Tasks backend, the framework's task lines too (RUNNING, SUCCESSFUL,
        FAILED with its traceback), as its own workers show them."""
        level = LEVELS.get(verbosity, logging.DEBUG)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        package = logging.getLogger("django_durable")
        if not package.hasHandlers():
            package.setLevel(level)
            package.addHandler(handler)
        backends = (getattr(settings, "TASKS", None) or {}).values()
        if not any(backend.get("BACKEND") == TASKS_BACKEND for backend in backends):
            return
        configured = (getattr(settings, "LOGGING", None) or {}).get("loggers") or {}
        for name in TASKS_LOGGERS:
            tasks_logger = logging.getLogger(name)
            if name in configured or tasks_logger.handlers:
                continue  # the project's own configuration
            tasks_logger.setLevel(level)
            tasks_logger.addHandler(handler)
            tasks_logger.propagate = False  # not twice through Django's console handler
