"""django_durable.E016 and DurableRouter: django-durable's models stay on
DURABLE["DATABASE"] in a project with a primary/replica router.

The test settings have a second alias, "replica", that mirrors "default" (the same
database, as a replica that never lags); the routers below are set per test.
"""

import pytest
from django.core.checks import run_checks
from django.db import connections
from django.test.utils import CaptureQueriesContext

import django_durable as durable
from django_durable.checks import router_errors
from django_durable.models import Activity, Run
from django_durable.routers import DurableRouter
from django_durable.testing import drain
from tests.testapp.models import SideEffect
from tests.testapp.workflows import Noop

DURABLE_ROUTER = "django_durable.routers.DurableRouter"


class PrimaryReplica:
    """The usual primary/replica router: reads from the replica, writes to the primary."""

    def db_for_read(self, model, **hints):
        return "replica"

    def db_for_write(self, model, **hints):
        return "default"


class WritesToReplica:
    """A router that sends every write to the other alias."""

    def db_for_write(self, model, **hints):
        return "replica"


def ids(messages):
    return [m.id for m in messages]


def test_no_routers_and_a_primary_replica_router_are_fine(settings):
    settings.DATABASE_ROUTERS = []
    assert router_errors(settings.DATABASES) == []
    settings.DATABASE_ROUTERS = [f"{__name__}.PrimaryReplica"]
    assert router_errors(settings.DATABASES) == []


def test_routers_that_send_durables_writes_elsewhere_are_an_error(settings):
    settings.DATABASE_ROUTERS = [f"{__name__}.WritesToReplica"]
    (error,) = router_errors(settings.DATABASES)
    assert error.id == "django_durable.E016"
    assert "'replica'" in error.msg and "Run" in error.msg and "Activity" in error.msg
    assert DURABLE_ROUTER in error.hint
    assert "django_durable.E016" in ids(run_checks())  # registered with Django


def test_durable_router_first_fixes_it(settings):
    settings.DATABASE_ROUTERS = [DURABLE_ROUTER, f"{__name__}.WritesToReplica"]
    assert router_errors(settings.DATABASES) == []
    assert "django_durable.E016" not in ids(run_checks())


def test_another_durable_database_needs_the_router(settings):
    settings.DURABLE = {"DATABASE": "replica"}
    settings.DATABASE_ROUTERS = []
    assert ids(router_errors(settings.DATABASES)) == ["django_durable.E016"]
    settings.DATABASE_ROUTERS = [DURABLE_ROUTER]
    assert router_errors(settings.DATABASES) == []


def test_an_unknown_durable_database_is_left_to_its_own_check(settings):
    settings.DURABLE = {"DATABASE": "nowhere"}
    assert router_errors(settings.DATABASES) == []
    assert "django_durable.E011" in ids(run_checks())


def test_durable_router_decides_for_durables_models_only(settings):
    router = DurableRouter()
    assert router.db_for_read(Run) == router.db_for_write(Activity) == "default"
    assert router.db_for_read(SideEffect) is None and router.db_for_write(SideEffect) is None
    assert router.allow_migrate("default", "django_durable", "run") is True
    assert router.allow_migrate("replica", "django_durable", "run") is False
    assert router.allow_migrate("replica", "testapp") is None
    assert router.allow_relation(Run(), Activity()) is True
    assert router.allow_relation(Run(), SideEffect()) is None
    settings.DURABLE = {"DATABASE": "replica"}
    assert router.db_for_write(Run) == "replica"


@pytest.mark.django_db(transaction=True, databases=["default", "replica"])
def test_with_durable_router_first_nothing_of_durable_reaches_the_replica(settings):
    settings.DATABASE_ROUTERS = [DURABLE_ROUTER, f"{__name__}.PrimaryReplica"]
    with CaptureQueriesContext(connections["replica"]) as on_replica:
        run_id = durable.start(Noop, key="replicated")
        assert durable.get_run(run_id).status == "pending"
        assert durable.start(Noop, key="replicated") == run_id
        drain()
        assert durable.get_run(run_id).status == "completed"
        assert Run.objects.filter(key="replicated").count() == 1  # the project's own ORM use
    assert on_replica.captured_queries == []
    # The router leaves the project's other models to the project's routers.
    with CaptureQueriesContext(connections["replica"]) as on_replica:
        assert SideEffect.objects.count() == 0
    assert len(on_replica.captured_queries) == 1


@pytest.mark.django_db(transaction=True, databases=["default", "replica"])
def test_without_it_a_save_follows_the_project_router(settings):
    """django-durable's managers pin its queries, but ``save()`` of an instance asks
    the routers: that is where a router with an opinion on every model would
    split a run's rows, and what E016 and DurableRouter are for."""
    settings.DATABASE_ROUTERS = [f"{__name__}.WritesToReplica"]
    run = durable.get_run(durable.start(Noop))
    with CaptureQueriesContext(connections["replica"]) as on_replica:
        run.save(update_fields=["queue"])
    assert len(on_replica.captured_queries) == 1
    settings.DATABASE_ROUTERS = [DURABLE_ROUTER, f"{__name__}.WritesToReplica"]
    with CaptureQueriesContext(connections["replica"]) as on_replica:
        run.save(update_fields=["queue"])
    assert on_replica.captured_queries == []
