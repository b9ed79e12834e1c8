import pytest
from django.db import connection

from django_durable.runtime.stream_listener import stop_listener
from django_durable.store import stop_stream_notices
from tests.helpers import define  # noqa: F401  (a fixture for every test module)
from tests.worker_processes import workers  # noqa: F401  (a fixture: real worker processes)


def pytest_collection_modifyitems(config, items):
    """Tests marked ``postgres`` need PostgreSQL itself (row locks, LISTEN/NOTIFY,
    EXPLAIN): on SQLite they are deselected, not skipped, and the run says so."""
    if connection.vendor == "postgresql":
        return
    kept, deselected = [], []
    for item in items:
        (deselected if item.get_closest_marker("postgres") else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.fixture(autouse=True)
def _stream_listener_stopped():
    """A test that read a stream started this process's LISTEN connection, one that
    wrote one its notices thread (and its connection): both end with the test (the
    test database cannot be dropped while they are open)."""
    yield
    stop_listener()
    stop_stream_notices()
