"""django-durable's own observer of a signal (telemetry) is called where the signal
is sent, not connected as a receiver: a start pays Django's dispatch only for the
project's receivers."""

import logging

import pytest
from django.db import transaction

import django_durable as durable
from django_durable import signals, telemetry
from django_durable.models import StepAttempt
from django_durable.testing import drain
from tests.testapp.workflows import SyncAccount

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def observed():
    """An observer of run_started and attempt_recorded, for one test."""
    got = []

    def run_started(sender, **kwargs):
        got.append(("run_started", sender, kwargs["run_id"]))

    def attempt_recorded(sender, **kwargs):
        got.append(("attempt_recorded", sender, kwargs["attempt"].run_id))

    signals.observe(signals.run_started, run_started)
    signals.observe(signals.attempt_recorded, attempt_recorded)
    yield got
    signals.observe(signals.run_started, None)
    signals.observe(signals.attempt_recorded, None)
    telemetry.install()  # telemetry's observers again, as the app installs them


@pytest.mark.skipif(not telemetry.AVAILABLE, reason="opentelemetry-api is not installed")
def test_installed_telemetry_connects_no_receiver_and_observes_only_while_a_provider_listens():
    from opentelemetry.sdk.trace import TracerProvider

    try:
        telemetry.install()  # the API's global providers, which record nothing
        assert signals.run_started.receivers == []
        assert not signals.listened(signals.run_started)
        telemetry.install(tracer_provider=TracerProvider())
        assert signals.run_started.receivers == []
        assert signals.listened(signals.run_started)
        telemetry.uninstall()
        assert not signals.listened(signals.run_started)
    finally:
        telemetry.install()


def test_an_observer_hears_only_while_it_says_it_observes():
    got, observing = [], [False]

    def observer(sender, run_id, **kwargs):
        got.append(run_id)

    signals.observe(signals.run_started, observer, when=lambda: observing[0])
    try:
        durable.start(SyncAccount, {}, key="observed:off")
        assert got == [] and not signals.listened(signals.run_started)
        observing[0] = True
        run_id = durable.start(SyncAccount, {}, key="observed:on")
        assert got == [run_id] and signals.listened(signals.run_started)
    finally:
        signals.observe(signals.run_started, None)
        telemetry.install()


def test_the_observer_and_the_receivers_both_hear_a_signal_after_commit(observed):
    heard = []

    def receiver(sender, run_id, **kwargs):
        heard.append(run_id)

    signals.run_started.connect(receiver)
    try:
        with transaction.atomic():
            run_id = durable.start(SyncAccount, {}, key="observed:1")
            assert observed == [] and heard == []  # not before the commit
        assert observed == [("run_started", SyncAccount, run_id)]
        assert heard == [run_id]
        drain()
        assert ("attempt_recorded", StepAttempt, run_id) in observed
    finally:
        signals.run_started.disconnect(receiver)


def test_a_failing_observer_is_logged_and_the_receivers_still_hear(observed, caplog):
    heard = []

    def failing(sender, **kwargs):
        raise RuntimeError("observer broke")

    def receiver(sender, run_id, **kwargs):
        heard.append(run_id)

    signals.observe(signals.run_started, failing)
    signals.run_started.connect(receiver)
    try:
        with caplog.at_level(logging.ERROR, logger="django_durable"):
            run_id = durable.start(SyncAccount, {}, key="observed:2")
    finally:
        signals.run_started.disconnect(receiver)
    assert heard == [run_id]
    assert "observer of a django-durable signal failed" in caplog.text
    assert "observer broke" in caplog.text
