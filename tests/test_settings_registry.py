"""Pure tests of settings, system checks, the registry, discovery and body encoding."""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_rmq_retry import Policy, Topic, receiver
from django_rmq_retry.broker import mask_url
from django_rmq_retry.checks import check_settings
from django_rmq_retry.conf import DEFAULTS, app_settings
from django_rmq_retry.core.outcome import ParkReason
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.publishing.publisher import build_properties, encode_body
from django_rmq_retry.registry import Registry, default_registry


def test_defaults_are_used_when_unset():
    with override_settings(RMQ_RETRY={}):
        assert app_settings.PREFETCH == DEFAULTS["PREFETCH"]
        assert app_settings.RETRY["max_attempts"] == DEFAULTS["RETRY"]["max_attempts"]


def test_override_settings_just_works():
    with override_settings(RMQ_RETRY={"PREFETCH": 3, "RETRY": {"max_attempts": 9}}):
        assert app_settings.PREFETCH == 3
        assert app_settings.RETRY["max_attempts"] == 9
        assert app_settings.RETRY["multiplier"] == DEFAULTS["RETRY"]["multiplier"]
    with override_settings(RMQ_RETRY={"PREFETCH": 4}):
        assert app_settings.PREFETCH == 4


def test_unknown_attribute_raises():
    with pytest.raises(AttributeError):
        _ = app_settings.NOPE


def test_setting_must_be_a_dict():
    with (
        override_settings(RMQ_RETRY=["x"]),
        pytest.raises(ImproperlyConfigured, match="must be a dict"),
    ):
        _ = app_settings.PREFETCH


def _ids(conf):
    with override_settings(RMQ_RETRY=conf):
        return [m.id for m in check_settings()]


def test_default_settings_pass_the_checks():
    assert _ids({}) == []


def test_a_publish_nack_wait_of_zero_is_allowed():
    assert _ids({"PUBLISH_NACK_WAIT": 0}) == []


@pytest.mark.parametrize(
    ("conf", "check_id"),
    [
        ({"BROKER_URL": "http://localhost"}, "django_rmq_retry.E003"),
        ({"BROKER_URLS": ["amqp://a/%2F", "amqp//b:5672/%2F"]}, "django_rmq_retry.E003"),
        ({"BROKER_URLS": "amqp://a/%2F"}, "django_rmq_retry.E003"),
        ({"HEARTBEAT": 0}, "django_rmq_retry.E004"),
        ({"PREFETCH": 0}, "django_rmq_retry.E005"),
        ({"PUBLISH_NACK_WAIT": -1}, "django_rmq_retry.E005"),
        ({"PUBLISH_NACK_WAIT": float("inf")}, "django_rmq_retry.E005"),
        ({"BROKR_URL": "amqp://x"}, "django_rmq_retry.E002"),
        ({"PREFIX": "a b"}, "django_rmq_retry.E006"),
        ({"QUEUE_TYPE": "stream"}, "django_rmq_retry.E007"),
        ({"DELAY_LEVELS": 40}, "django_rmq_retry.E008"),
        ({"RETRY": {"tries": 3}}, "django_rmq_retry.E009"),
        ({"RETRY": {"max_attempts": 0}}, "django_rmq_retry.E010"),
        ({"RETRY": {"max_delay": 10**9}}, "django_rmq_retry.W001"),
    ],
)
def test_bad_settings_are_reported_with_a_hint(conf, check_id):
    with override_settings(RMQ_RETRY=conf):
        messages = check_settings()
    assert check_id in [m.id for m in messages]
    assert all(m.hint for m in messages)


def test_mask_url_hides_the_password():
    assert mask_url("amqp://bob:s3cret@host:5672/%2F") == "amqp://bob:***@host:5672/%2F"
    assert "s3cret" not in mask_url("amqps://bob:s3cret@host/vh")
    assert mask_url("amqp://host/") == "amqp://host/"


# Registry -------------------------------------------------------------------------------------
T1 = Topic("t.one")
T2 = Topic("t.two")


def test_receiver_decorator_registers_one_queue_per_function():
    reg = Registry()

    @receiver(T1, registry=reg)
    def handler(message, **kwargs):
        pass

    @receiver([T1, T2], queue="explicit", retry={"max_attempts": 2}, registry=reg)
    def other(message, **kwargs):
        pass

    names = {r.name: r for r in reg.all()}
    assert set(names) == {
        f"{__name__}.test_receiver_decorator_registers_one_queue_per_function.handler",
        f"{__name__}.test_receiver_decorator_registers_one_queue_per_function.other",
    }
    rec = next(r for r in reg.all() if r.name.endswith(".other"))
    assert rec.queue_name("p") == "p.explicit"
    assert rec.routing_keys == ["t.one", "t.two"]
    assert rec.policy == Policy(max_attempts=2)
    assert [r.name for r in T1.receivers(reg)] == [r.name for r in reg.all()]


def test_receivers_must_accept_kwargs():
    reg = Registry()
    with pytest.raises(ImproperlyConfigured, match=r"\*\*kwargs"):

        @receiver(T1, registry=reg)
        def handler(message):
            pass


def test_closures_are_held_strongly():
    reg = Registry()

    def make():
        def inner(message, **kwargs):
            pass

        return inner

    T1.connect(make(), registry=reg)
    import gc

    gc.collect()
    assert len(reg) == 1


def test_duplicate_queue_names_are_refused():
    reg = Registry()

    def a(message, **kwargs):
        pass

    def b(message, **kwargs):
        pass

    T1.connect(a, queue="same", registry=reg)
    with pytest.raises(ImproperlyConfigured, match="share the queue"):
        T1.connect(b, queue="same", registry=reg)


def test_registering_the_same_function_twice_is_idempotent_and_adds_topics():
    reg = Registry()

    def a(message, **kwargs):
        pass

    T1.connect(a, registry=reg)
    T1.connect(a, registry=reg)
    T2.connect(a, registry=reg)
    assert len(reg) == 1 and reg.all()[0].routing_keys == ["t.one", "t.two"]
    assert T1.disconnect(a, registry=reg)
    assert reg.all()[0].routing_keys == ["t.two"]
    assert T2.disconnect(a, registry=reg) and len(reg) == 0
    assert not T2.disconnect(a, registry=reg)


@pytest.mark.parametrize("key", ["", "a b", "orders.*", "orders.#", "x" * 256])
def test_topic_routing_keys_are_validated(key):
    with pytest.raises(ImproperlyConfigured):
        Topic(key)


def test_bad_queue_name_and_bad_policy_are_refused():
    reg = Registry()

    def a(message, **kwargs):
        pass

    with pytest.raises(ImproperlyConfigured, match="queue name"):
        T1.connect(a, queue="a b", registry=reg)
    with pytest.raises(ImproperlyConfigured, match="bad retry policy"):
        T1.connect(a, retry={"max_attempts": 0}, registry=reg)


def test_discovery_found_the_installed_apps_consumers():
    names = {r.name for r in default_registry.all()}
    assert "testproject.shop.consumers.send_invoice" in names
    assert "tests.testapp.consumers.gamma" in names


def test_find_by_short_name_queue_or_path():
    assert default_registry.find("gamma", "p").name == "tests.testapp.consumers.gamma"
    assert default_registry.find("p.tests.testapp.consumers.gamma", "p").name.endswith("gamma")
    assert default_registry.find("nope", "p") is None


# Encoding -------------------------------------------------------------------------------------
def test_json_is_the_default_encoding():
    import datetime
    import decimal
    import uuid

    data, ctype = encode_body(
        {
            "when": datetime.date(2026, 1, 2),
            "amount": decimal.Decimal("1.50"),
            "id": uuid.UUID(int=1),
            "name": "é",
        },
        None,
    )
    assert ctype == "application/json"
    assert json.loads(data) == {
        "when": "2026-01-02",
        "amount": "1.50",
        "id": "00000000-0000-0000-0000-000000000001",
        "name": "é",
    }


def test_bytes_and_str_pass_through_with_their_content_type():
    assert encode_body(b"\x00", None) == (b"\x00", "application/octet-stream")
    assert encode_body(b"<x/>", "application/xml") == (b"<x/>", "application/xml")
    assert encode_body("hé", None) == ("hé".encode(), "text/plain; charset=utf-8")


def test_unserialisable_body_is_a_clear_error():
    with pytest.raises(TypeError, match="not JSON serialisable"):
        encode_body({"x": object()}, None)


def test_properties_always_have_id_timestamp_and_persistence():
    props = build_properties("application/json", {"tenant": "a"}, {"correlation_id": "c"})
    assert props["delivery_mode"] == 2 and props["message_id"] and props["timestamp"]
    assert props["headers"] == {"tenant": "a"} and props["correlation_id"] == "c"
    with pytest.raises(TypeError, match="unknown message properties"):
        build_properties("x", None, {"colour": "red"})


def test_every_park_reason_has_an_operator_label():
    choices = dict(ParkedMessage._meta.get_field("reason").choices)
    assert set(choices) == {r.value for r in ParkReason}
    assert all(str(label) and str(label) != value for value, label in choices.items())


def test_a_bad_cluster_url_is_named_by_position_without_its_password():
    urls = ["amqp://u:secret@node1:5672/%2F", "amqps://u:secret@node2:5671/%2F", "node3:5672"]
    with override_settings(RMQ_RETRY={"BROKER_URLS": urls}):
        messages = [m for m in check_settings() if m.id == "django_rmq_retry.E003"]
    assert [m.msg for m in messages] == [
        "RMQ_RETRY['BROKER_URLS[2]'] must start with amqp:// or amqps://."
    ]
    assert "secret" not in messages[0].msg + messages[0].hint
