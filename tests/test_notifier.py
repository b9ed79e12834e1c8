"""LISTEN/NOTIFY: a NOTIFY goes out when the transaction that made a run due
commits, and the notifier wakes its worker for the queues it serves."""

import logging
import threading

import pytest
from django.db import transaction

import django_durable as durable
from django_durable import store
from django_durable.runtime.notifier import CHECK_PREFIX, Notifier, listen_works
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


def running(notifier):
    notifier.start()
    return notifier


def stopped(notifier):
    notifier.stop.set()
    notifier.join(10)
    assert not notifier.is_alive()


def test_the_notifier_says_listening_only_once_its_own_notify_arrived(caplog):
    caplog.set_level(logging.INFO, logger="django_durable")
    notifier = running(
        Notifier(channel=CHANNEL, queues=None, on_wake=lambda: None, stop=threading.Event())
    )
    try:
        assert notifier.checked.wait(30), "the check NOTIFY never came back"
        assert notifier.verified is True
    finally:
        stopped(notifier)
    (line,) = [r for r in caplog.records if "listening for NOTIFY" in r.getMessage()]
    assert line.levelno == logging.INFO and "its check arrived" in line.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_listen_that_receives_nothing_is_a_warning_naming_the_setting(caplog):
    """A LISTEN that delivers nothing, as through PgBouncer in transaction mode
    (tests/test_pgbouncer.py has the real one): here it listens on another channel."""
    caplog.set_level(logging.INFO, logger="django_durable")
    wakes = []
    notifier = running(
        Notifier(
            channel="nobody_sends_here",
            queues=None,
            on_wake=lambda: wakes.append(1),
            stop=threading.Event(),
            verify_timeout=0.5,
        )
    )
    try:
        assert notifier.checked.wait(30)
        assert notifier.verified is False
        assert notifier.is_alive()  # it goes on listening; the worker polls meanwhile
    finally:
        stopped(notifier)
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "DURABLE['LISTEN_DATABASE']" in warning.getMessage()
    assert "transaction mode" in warning.getMessage()
    assert not [r for r in caplog.records if "listening for NOTIFY" in r.getMessage()]


def test_another_workers_check_wakes_nobody():
    def notifier(queues):
        return Notifier(channel=CHANNEL, queues=queues, on_wake=None, stop=threading.Event())

    assert notifier(None).concerns("default")
    assert notifier(["mail"]).concerns("mail")
    assert not notifier(["mail"]).concerns("default")
    assert not notifier(None).concerns(f"{CHECK_PREFIX}0123abcd")


def test_listen_works_on_a_direct_connection_and_not_on_a_silent_channel():
    assert listen_works(alias="default") is True
    assert listen_works(alias="default", channel="nobody_sends_here", timeout=0.5) is False
