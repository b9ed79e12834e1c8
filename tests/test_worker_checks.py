"""System checks for the DURABLE settings the worker reads, and the SQLite warning."""

from datetime import timedelta

import pytest

from django_durable.checks import check_settings, sqlite_concurrency_warning


def ids(errors):
    return [e.id for e in errors]


def test_the_defaults_pass(settings):
    settings.DURABLE = {}
    assert check_settings() == []


@pytest.mark.parametrize(
    ("durable", "expected"),
    [
        ([("LEASE", 30)], "django_durable.E001"),
        ({"LEASES": timedelta(seconds=30)}, "django_durable.E002"),
        ({"LEASE": 30}, "django_durable.E003"),
        ({"POLL_INTERVAL": timedelta(0)}, "django_durable.E003"),
        ({"SHUTDOWN_GRACE": timedelta(seconds=-1)}, "django_durable.E003"),
        ({"PRUNE_INTERVAL": 3600}, "django_durable.E004"),
        ({"PRUNE_BATCH_SIZE": 0}, "django_durable.E005"),
        (
            {"LEASE": timedelta(seconds=10), "HEARTBEAT_INTERVAL": timedelta(seconds=6)},
            "django_durable.E006",
        ),
        ({"NOTIFY_CHANNEL": ""}, "django_durable.E007"),
        ({"LISTEN_DATABASE": "nowhere"}, "django_durable.E008"),
        ({"DATABASE": "nowhere"}, "django_durable.E011"),
    ],
)
def test_bad_settings_are_reported_with_their_id(settings, durable, expected):
    settings.DURABLE = durable
    assert expected in ids(check_settings())


def test_listen_can_be_turned_off(settings):
    settings.DURABLE = {"LISTEN_DATABASE": None}
    assert check_settings() == []


def test_sqlite_with_several_threads_is_warned_about():
    assert ids(sqlite_concurrency_warning(4, True)) == ["django_durable.W001"]
    assert sqlite_concurrency_warning(1, True) == []
    assert sqlite_concurrency_warning(4, False) == []
