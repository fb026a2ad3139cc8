"""pika's internals are touched in one module only, guarded and reported once.

The header guard's use of pika's internals (``pika.spec.data``) lives in
``broker.headerguard`` alone; no other module names a private attribute of pika's. These
tests run on whichever pika is installed: CI's oldest leg (pyproject's lower bound) and its
newest leg both run them, so a pika that changed shape shows up here as a guard that is
off, not as a wrong value.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pika
import pytest

from django_rmq_retry.broker import connect, headerguard
from tests.conftest import BROKER_URL

PACKAGE = Path(__file__).resolve().parent.parent / "django_rmq_retry"

#: pika's private names we know of (those our code has used at one time or another).
PIKA_PRIVATE = re.compile(
    r"\._(impl|transport|tx_buffers|produce|poller|fd_events|get_remaining_interval|"
    r"closing_reason|output_marshaled_frames|body_max_length|raise_if_not_open|"
    r"on_data_available|frame_buffer|process_frame|channels|on_deliver|sock)\b"
)
#: The module global pika's properties decode header tables through (the header guard's).
SPEC_DATA = re.compile(r"pika\.spec\.data")
#: Any private attribute of an object that is not ours (``self``/``cls``): in broker/.
ANY_PRIVATE = re.compile(r"(?<![\w.])(?!self\b|cls\b)[A-Za-z_]\w*(\(\))?\._[a-z]\w*")


def test_no_private_pika_name_and_the_guard_in_headerguard_only():
    found = []
    guard_uses = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(PACKAGE))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if SPEC_DATA.search(code):
                guard_uses.add(where)
                if where != "broker/headerguard.py":
                    found.append(f"{where}:{number}: {line.strip()}")
            private = PIKA_PRIVATE.search(code)
            if private is None and path.parent.name == "broker":
                private = ANY_PRIVATE.search(code)
            if private is not None:
                found.append(f"{where}:{number}: {line.strip()}")
    assert found == []
    assert guard_uses == {"broker/headerguard.py"}


@pytest.fixture
def fresh_state(monkeypatch):
    """This test's view of the guard's state (a pika said off must not stay so for the
    rest of the session)."""
    monkeypatch.setattr(headerguard, "_on", None)
    monkeypatch.setattr(headerguard, "_logged", False)


@pytest.mark.parametrize(
    ("on", "word", "level"), [(True, "on", logging.INFO), (False, "off", logging.WARNING)]
)
def test_the_guard_is_logged_once_with_pikas_version(
    fresh_state, monkeypatch, caplog, on, word, level
):
    monkeypatch.setattr(headerguard, "_on", on)
    with caplog.at_level(logging.INFO, logger="django_rmq_retry.broker"):
        headerguard.log_features()
        headerguard.log_features()
    lines = [r for r in caplog.records if r.getMessage().startswith("pika ")]
    assert len(lines) == 1
    assert lines[0].getMessage() == f"pika {pika.__version__}: header guard {word}"
    assert lines[0].levelno == level  # off: production must see it


@pytest.mark.broker
def test_on_a_pika_we_allow_the_guard_is_on(broker_ok, fresh_state):
    connection = connect(BROKER_URL, name="t-pika-private")
    try:
        connection.channel().qos(1)
        assert headerguard.state() is True, f"pika {pika.__version__} changed shape"
    finally:
        connection.close()
