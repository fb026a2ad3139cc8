"""pika's internals are touched in two modules only, each use guarded and reported once.

``broker.pikaext`` is "what pika lacks and we need"; the header guard's own use of pika's
internals (``pika.spec.data``) lives in ``broker.headerguard`` alone. These tests run on whichever pika is
installed: CI's oldest leg (pyproject's lower bound) and its newest leg both run them, so a
pika that changed shape shows up here as a feature that is off, not as a wrong byte.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pika
import pytest

from django_rmq_retry.broker import ConfirmChannel, connect, pikaext
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


def test_private_pika_names_appear_in_pikaext_only_and_the_guard_in_headerguard():
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
            if path.name == "pikaext.py":
                continue
            private = PIKA_PRIVATE.search(code)
            if private is None and path.parent.name == "broker":
                private = ANY_PRIVATE.search(code)
            if private is not None:
                found.append(f"{where}:{number}: {line.strip()}")
    assert found == []
    assert guard_uses == {"broker/headerguard.py"}


@pytest.fixture
def fresh_features(monkeypatch):
    """This test's view of the features (a fake pika object must not turn them off for
    the rest of the session)."""
    monkeypatch.setattr(pikaext, "_FEATURES", dict.fromkeys(pikaext._FEATURES))
    monkeypatch.setattr(pikaext, "_logged", False)


def test_every_piece_falls_back_on_a_pika_not_shaped_as_expected(fresh_features):
    class Stranger:
        channel_number = 1

    assert pikaext.join_queued_frames(Stranger()) is False  # type: ignore[arg-type]
    assert pikaext.idle_state(Stranger()) is None  # type: ignore[arg-type]
    assert pikaext.FrameWriter(Stranger()).usable is False
    assert pikaext.close_reason(Stranger()) is None
    with pytest.raises(pikaext.PikaUnsupported, match=r"pika .* no asynchronous channel"):
        pikaext.async_channel(Stranger())
    seen = pikaext.features()
    assert seen["frame joining"] is False and seen["two-connection wait"] is False
    assert seen["direct publish frames"] is False


def test_the_features_are_logged_once_with_pikas_version(fresh_features, caplog):
    pikaext.note("frame joining", True)
    pikaext.note("two-connection wait", False)
    with caplog.at_level(logging.INFO, logger="django_rmq_retry.broker"):
        pikaext.log_features()
        pikaext.log_features()
    lines = [r for r in caplog.records if r.getMessage().startswith("pika ")]
    assert len(lines) == 1
    assert lines[0].getMessage().startswith(f"pika {pika.__version__}: ")
    assert "frame joining on" in lines[0].getMessage()
    assert "two-connection wait off" in lines[0].getMessage()
    assert lines[0].levelno == logging.WARNING  # something is off: production must see it


@pytest.mark.broker
def test_on_a_pika_we_allow_every_piece_is_on(broker_ok, fresh_features):
    first, second = connect(BROKER_URL, name="t-pikaext"), connect(BROKER_URL, name="t-pe2")
    try:
        confirms = ConfirmChannel(second)
        first.pump_with(second, 0.01)
        channel = first.channel()
        channel.qos(1)
        assert pikaext.features() == {
            "header guard": True,
            "frame joining": True,
            "direct publish frames": True,
            "two-connection wait": True,
        }, f"pika {pika.__version__} changed shape"
        confirms.close()
    finally:
        first.close()
        second.close()
