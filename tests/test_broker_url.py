"""The broker URL is the user's: options in its query win over our settings' defaults."""

from __future__ import annotations

import ssl
import subprocess
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.test import override_settings

from django_rmq_retry.broker import connect, connection_parameters, mask_url
from tests.conftest import BROKER_URL, rabbitmqctl_cmd

BASE = "amqp://guest:guest@127.0.0.1:5672/%2F"


def ours(**values: object) -> override_settings:
    return override_settings(RMQ_RETRY={**settings.RMQ_RETRY, **values})


def test_every_option_in_the_url_wins_over_our_settings():
    query = (
        "heartbeat=7&connection_attempts=5&socket_timeout=3&blocked_connection_timeout=30"
        "&retry_delay=2&stack_timeout=9&frame_max=8192&channel_max=64"
    )
    with ours(HEARTBEAT=60, CONNECT_TIMEOUT=10, BLOCKED_CONNECTION_TIMEOUT=300):
        params = connection_parameters(f"{BASE}?{query}")
        # The consumer's copies connection asks for no blocked timeout: the URL still wins.
        copies = connection_parameters(f"{BASE}?{query}", blocked_connection_timeout=None)
    seen = (
        params.heartbeat,
        params.connection_attempts,
        params.socket_timeout,
        params.blocked_connection_timeout,
        params.retry_delay,
        params.stack_timeout,
        params.frame_max,
        params.channel_max,
    )
    assert seen == (7, 5, 3.0, 30.0, 2.0, 9.0, 8192, 64)
    assert copies.blocked_connection_timeout == 30.0


def test_our_settings_fill_only_what_the_url_leaves_out():
    with ours(HEARTBEAT=25, CONNECT_TIMEOUT=4, BLOCKED_CONNECTION_TIMEOUT=120):
        params = connection_parameters(f"{BASE}?heartbeat=7", name="mine")
        copies = connection_parameters(BASE, blocked_connection_timeout=None)
    assert params.heartbeat == 7
    assert (params.socket_timeout, params.stack_timeout, params.connection_attempts) == (4, 8, 1)
    assert params.blocked_connection_timeout == 120.0
    assert params.client_properties == {"connection_name": "mine"}
    assert copies.heartbeat == 25 and copies.blocked_connection_timeout is None


def test_client_properties_of_the_url_are_kept_beside_our_connection_name():
    props = quote(str({"app": "billing", "connection_name": "theirs"}))
    params = connection_parameters(f"{BASE}?client_properties={props}", name="ours")
    assert params.client_properties == {"app": "billing", "connection_name": "theirs"}


def _a_ca_file() -> str:
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.skip("no CA bundle on this host to build TLS options from")


def test_tls_options_of_an_amqps_url_are_not_replaced():
    options = quote(str({"ca_certs": _a_ca_file(), "server_hostname": "rabbit.internal"}))
    with ours(TLS_CA_FILE=None):
        theirs = connection_parameters(f"amqps://u:p@10.0.0.5/%2F?ssl_options={options}")
        default = connection_parameters("amqps://u:p@rabbit.example/%2F")
    assert theirs.ssl_options.server_hostname == "rabbit.internal"
    assert default.ssl_options.server_hostname == "rabbit.example"  # ours where none given


def test_mask_url_keeps_ipv6_brackets():
    assert mask_url("amqp://bob:s3cret@[::1]:5672/%2F") == "amqp://bob:***@[::1]:5672/%2F"
    assert mask_url("amqps://bob:s3cret@[2001:db8::7]/vh") == "amqps://bob:***@[2001:db8::7]/vh"


def _negotiated_heartbeat(name: str) -> int:
    """The heartbeat the broker agreed with the connection named ``name`` (its own view)."""
    out = subprocess.run(
        rabbitmqctl_cmd("-q", "list_connections", "client_properties", "timeout"),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        if name in line:
            return int(line.rsplit("\t", 1)[1])
    raise AssertionError(f"no connection named {name!r} in {out!r}")


@pytest.mark.broker
@pytest.mark.parametrize(("query", "expected"), [("?heartbeat=7", 7), ("", 25)])
def test_the_broker_negotiates_the_urls_heartbeat(broker_ok, query, expected):
    url = BROKER_URL.split("?", 1)[0] + query
    name = f"t-url-{uuid.uuid4().hex[:8]}"
    with ours(HEARTBEAT=25):
        connection = connect(url, name=name)
    try:
        assert _negotiated_heartbeat(name) == expected
    finally:
        connection.close()
