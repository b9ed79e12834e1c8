"""``conf.get`` keeps the ``DURABLE`` dict it read, and reads it again when a test
(or ``override_settings``) changes it."""

from django.test import override_settings

from django_durable import conf


def test_a_changed_setting_is_read_again(settings):
    assert conf.get("NOTIFY_CHANNEL") == "django_durable"
    settings.DURABLE = {**settings.DURABLE, "NOTIFY_CHANNEL": "elsewhere"}
    assert conf.get("NOTIFY_CHANNEL") == "elsewhere"
    with override_settings(DURABLE={"NOTIFY_CHANNEL": "inner"}):
        assert conf.get("NOTIFY_CHANNEL") == "inner"
        assert conf.get("DATABASE") == "default"  # the default of an unset one
    assert conf.get("NOTIFY_CHANNEL") == "elsewhere"


def test_a_change_made_in_place_is_seen(settings):
    settings.DURABLE = {**settings.DURABLE}
    conf.get("NOTIFY_CHANNEL")  # read and kept
    settings.DURABLE["NOTIFY_CHANNEL"] = "edited"
    assert conf.get("NOTIFY_CHANNEL") == "edited"
    assert conf.durable_settings()["NOTIFY_CHANNEL"] == "edited"
