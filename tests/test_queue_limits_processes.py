"""DURABLE["QUEUES"]["limited"]["concurrency"] = 2 held by 3 real worker processes of
4 threads each: sampled from the database, never more than 2 runs of the queue run
at once, and another queue keeps flowing meanwhile."""

import threading

import pytest
from django.db import connection

import django_durable as durable
from django_durable.models import Run, Status
from tests.testapp.workflows_queues import Limited, Unlimited
from tests.worker_processes import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


class Sampler(threading.Thread):
    """Counts, from the database, the runs of each queue running at once."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.peak: dict[str, int] = {}
        self.samples = 0

    def run(self):
        try:
            while not self.stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT queue, count(*) FROM durable_run WHERE status = 'running' "
                        "GROUP BY queue"
                    )
                    for queue, running in cursor.fetchall():
                        self.peak[queue] = max(self.peak.get(queue, 0), running)
                self.samples += 1
                self.stop.wait(0.01)
        finally:
            connection.close()


def test_three_workers_never_run_more_than_the_limit(workers, settings):
    settings.DURABLE = {"QUEUES": {"limited": {"concurrency": 2}}}
    # One thread per worker: the limit's two runs at once need two workers, so the
    # limit is shown across processes whichever worker claims first (a worker with
    # room for both would often take every limited run alone: it claims again the
    # moment its own run ends).
    procs = [
        workers.start("--worker-id", f"w{n}", "--concurrency", "1", queue_limits="limited=2")
        for n in range(4)
    ]
    for proc in procs:
        proc.wait_for_output("listening for NOTIFY", timeout=60)
    sampler = Sampler()
    sampler.start()
    try:
        limited = [durable.start(Limited, {"seconds": 0.3}) for _ in range(16)]
        others = [durable.start(Unlimited, {"seconds": 0.1}) for _ in range(24)]
        # The other queue flows while the limited one still has a backlog.
        wait_until(
            lambda: Run.objects.filter(id__in=others, status=Status.COMPLETED).count() == 24,
            120,
            "the other queue's runs to complete",
        )
        left = Run.objects.filter(id__in=limited).exclude(status=Status.COMPLETED).count()
        assert left > 0, "the limited queue was drained first: nothing flowed beside it"
        wait_until(
            lambda: Run.objects.filter(id__in=limited, status=Status.COMPLETED).count() == 16,
            120,
            "the limited queue's runs to complete",
        )
    finally:
        sampler.stop.set()
        sampler.join(30)
    assert sampler.samples > 20
    assert sampler.peak["limited"] == 2, sampler.peak
    # Beside the limited queue's two, the other two workers ran the other queue.
    assert sampler.peak.get("other", 0) >= 2, sampler.peak
    # Every worker took part in the limited queue (no one worker owned the limit).
    workers_used = set(
        Run.objects.filter(id__in=limited).values_list("worker_id", flat=True).distinct()
    )
    assert len(workers_used) >= 2, workers_used
