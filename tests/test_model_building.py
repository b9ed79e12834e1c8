"""The hot paths build ``Run`` instances without ``Model.__init__`` (store.build): what
they build must behave like the ORM's, and a project's ``pre_init``/``post_init``
receivers must still see them."""

import pytest
from django.db.models.signals import post_init

import django_durable as durable
from django_durable import store
from django_durable.models import Run
from django_durable.operations.start import _blank_run
from tests.testapp.workflows import SyncAccount

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_built_run_is_like_one_from_the_orm():
    run_id = durable.start(SyncAccount, {"n": 1}, key="acct:1")
    from_orm = Run.objects.get(id=run_id)
    built = store.build(
        Run, {"id": run_id, "workflow": "sync_account", "key": "acct:1"}, from_db=True
    )
    assert (built._state.adding, built._state.db) == (False, "default")
    assert built.get_deferred_fields() >= {"input", "status"}
    assert built.input == from_orm.input == {"n": 1}  # a deferred field loads on access
    assert built.status == from_orm.status

    new = _blank_run(workflow="sync_account", key="acct:9")
    assert (new._state.adding, new._state.db, new.get_deferred_fields()) == (True, None, set())
    assert (new.status, new.attempt, new.state, new.parent_id) == ("pending", 1, {}, None)
    new.save(force_insert=True)
    assert Run.objects.get(id=new.id).key == "acct:9"


def test_post_init_receivers_see_the_runs_a_start_builds():
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance.key)

    post_init.connect(receiver, sender=Run)
    try:
        run_id = durable.start(SyncAccount, {"n": 1}, key="acct:2")
        assert durable.start(SyncAccount, {"n": 2}, key="acct:2") == run_id
    finally:
        post_init.disconnect(receiver, sender=Run)
    # The new run, then the holder the duplicate found (on SQLite, read by the ORM).
    assert seen[:2] == ["acct:2", "acct:2"]
