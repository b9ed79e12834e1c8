"""LISTEN/NOTIFY: a NOTIFY goes out when the transaction that made a run due
commits, and the notifier wakes its worker for the queues it serves."""

import threading

import pytest
from django.db import transaction

import django_durable as durable
from django_durable import store
from django_durable.runtime.notifier import Notifier
from django_durable.testing import drain
from tests.testapp.workflows import Noop, WorkerAwaitsEvent
from tests.worker_processes import wait_until

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CHANNEL = "django_durable"


def received(listener, timeout=1.0):
    return [n.payload for n in listener.notifies(timeout=timeout, stop_after=1)]


def test_a_start_notifies_when_its_transaction_commits():
    listener = store.open_listener(CHANNEL)
    try:
        with transaction.atomic():
            durable.start(Noop)
            assert received(listener, timeout=0.3) == []  # not before commit
        assert received(listener) == ["default"]
    finally:
        listener.close()


def test_a_start_that_rolls_back_notifies_nobody():
    listener = store.open_listener(CHANNEL)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            durable.start(Noop)
            raise RuntimeError("roll back")
        assert received(listener, timeout=0.3) == []
    finally:
        listener.close()


def test_an_event_that_resumes_a_waiting_run_notifies():
    run_id = durable.start(WorkerAwaitsEvent)
    drain()
    assert durable.get_run(run_id).status == "waiting"
    listener = store.open_listener(CHANNEL)
    try:
        durable.send_event(run_id, "go", {"n": 1})
        assert received(listener) == ["default"]
    finally:
        listener.close()


def test_the_notifier_wakes_its_worker_for_its_queues_only():
    stop = threading.Event()
    wakes = []
    notifier = Notifier(
        channel=CHANNEL, queues=["mail"], on_wake=lambda: wakes.append(1), stop=stop
    )
    notifier.start()
    try:
        wait_until(notifier.listening.is_set, 10, "the LISTEN")
        wait_until(lambda: wakes, 5, "the wake-up after connecting")
        wakes.clear()
        store.notify_due("default")
        store.notify_due("mail")
        wait_until(lambda: wakes, 5, "a wake-up for the mail queue")
        assert wakes == [1]
    finally:
        stop.set()
        notifier.join(10)
    assert not notifier.is_alive()
