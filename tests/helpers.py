"""Small helpers shared by tests: claim a run as a worker would, run it, look at it."""

from datetime import timedelta

from django_durable import executor, store
from django_durable.models import Run

LEASE = timedelta(seconds=30)


def pick_up(run_id=None, worker_id="test-worker"):
    """Claim due runs like a worker (without running them); return the one asked for."""
    claimed = store.claim(worker_id=worker_id, queues=None, limit=100, lease=LEASE)
    if run_id is None:
        assert len(claimed) == 1, claimed
        return claimed[0]
    for run in claimed:
        if run.id == run_id:
            return run
    raise AssertionError(f"run {run_id} was not due; claimed {[r.id for r in claimed]}")


def run_claimed(run):
    """Execute a claimed run in this thread, as the worker's executor does."""
    return executor.execute(run)


def fresh(run_id) -> Run:
    return Run.objects.get(id=run_id)
