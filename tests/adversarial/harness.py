"""Publishing the adversary's cases, disturbing the broker, and counting every message.

Counting rules (both tests):

* a (receiver, token) pair is *handled* when that receiver logged ``done`` for the token;
* it is *parked* when a ``ParkedMessage`` row of that receiver carries the token (in its raw
  body, its gunzipped body or its message_id);
* *duplicates* = extra ``done`` lines of one pair + pairs both handled and parked + extra
  rows of one pair;
* *lost* = pairs of a message the broker accepted that are neither handled nor parked once
  every queue of the test is empty;
* *refused* = messages the broker did not accept (closed the connection, nacked, returned
  as unroutable): never ours to count.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pika
import pika.exceptions

from tests.adversarial.advapp.receivers import MAX_ATTEMPTS, ident
from tests.adversarial.gen import Case
from tests.conftest import BROKER_URL, rabbitmqctl_cmd, read_log
from tests.faults.rawamqp import BrokerClosed, RawPublisher

COLUMNS = (
    "test",
    "seed",
    "published",
    "handled",
    "parked",
    "dups",
    "lost",
    "refused",
    "runs max",
    "reconnects/events",
)
ROWS: list[dict[str, Any]] = []


def rabbitmqctl(*args: str, check: bool = True) -> str:
    return subprocess.run(
        rabbitmqctl_cmd("-q", *args), capture_output=True, text=True, check=check, timeout=60
    ).stdout


# Publishing ------------------------------------------------------------------------------------
class Publishers:
    """Three foreign clients: the spec-level raw one, pika's own channel, Debian's amqp-publish."""

    def __init__(self, routes: dict[str, tuple[str, str]]) -> None:
        self.routes = routes  # target -> (exchange, routing key)
        self.raw: RawPublisher | None = None
        self.pika_conn: Any = None
        self.pika_ch: Any = None

    def publish(self, case: Case) -> str:
        """``"ack"`` when the broker took it; otherwise why not (refused, returned, nack)."""
        exchange, key = self.routes[case.target]
        if case.client == "pika":
            return self._pika(case, exchange, key)
        if case.client == "cli":
            return self._cli(case, exchange, key)
        return self._raw(case, exchange, key)

    def _raw(self, case: Case, exchange: str, key: str) -> str:
        try:
            if self.raw is None:
                self.raw = RawPublisher(BROKER_URL)
            return self.raw.publish(exchange, key, case.body, **case.props)
        except (BrokerClosed, OSError, struct_error) as exc:
            with contextlib.suppress(Exception):
                assert self.raw is not None
                self.raw.sock.close()
            self.raw = None
            return f"refused: {str(exc.args)[:120]}"

    def _pika(self, case: Case, exchange: str, key: str) -> str:
        props: dict[str, Any] = {}
        for name, value in case.props.items():
            if name == "headers":
                continue
            if isinstance(value, bytes):
                try:
                    value = value.decode()
                except UnicodeDecodeError:
                    continue  # pika cannot send it; leave it out
            props[name] = value
        try:
            if self.pika_conn is None or not self.pika_conn.is_open:
                self.pika_conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
                self.pika_ch = self.pika_conn.channel()
                self.pika_ch.confirm_delivery()
            self.pika_ch.basic_publish(
                exchange,
                key,
                case.body,
                pika.BasicProperties(headers=case.pika_headers, **props),
                mandatory=True,
            )
            return "ack"
        except pika.exceptions.UnroutableError:
            return "returned"
        except pika.exceptions.NackError:
            return "nack"
        except Exception as exc:  # pika refused to encode it, or the broker closed the channel
            with contextlib.suppress(Exception):
                self.pika_conn.close()
            self.pika_conn = None
            return f"refused: {type(exc).__name__}: {str(exc)[:100]}"

    def _cli(self, case: Case, exchange: str, key: str) -> str:
        args: list[str | bytes] = ["amqp-publish", "--url", BROKER_URL.replace("%2F", "%2f")]
        args += ["-e", exchange, "-r", key, "-p"]
        if case.props.get("content_type"):
            args += ["-C", case.props["content_type"]]
        if case.props.get("content_encoding"):
            args += ["-E", case.props["content_encoding"]]
        for k, v in (case.pika_headers or {}).items():
            args += ["-H", f"{k}: {v}"]
        done = subprocess.run(args, input=case.body, capture_output=True, timeout=60)
        return "ack" if done.returncode == 0 else f"refused: amqp-publish {done.returncode}"

    def close(self) -> None:
        if self.raw is not None:
            self.raw.close()
        with contextlib.suppress(Exception):
            if self.pika_conn is not None:
                self.pika_conn.close()


struct_error = __import__("struct").error


# Counting ----------------------------------------------------------------------------------------
def short(receiver: str) -> str:
    return receiver.rsplit(".", 1)[-1]


@dataclass
class Tally:
    expected: dict[tuple[str, str], Case] = field(default_factory=dict)
    done: Counter[tuple[str, str]] = field(default_factory=Counter)
    starts: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    parked: dict[tuple[str, str], list[Any]] = field(default_factory=dict)

    def refresh(self, log: Path) -> Tally:
        from django_rmq_retry.models import ParkedMessage

        events = read_log(log)
        self.done = Counter((e["receiver"], e["token"]) for e in events if e["event"] == "done")
        starts: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for e in events:
            if e["event"] == "start":
                starts[(e["receiver"], e["token"])].append(e)
        self.starts = dict(starts)
        parked: dict[tuple[str, str], list[Any]] = defaultdict(list)
        for row in ParkedMessage.objects.all().iterator():
            parked[(short(row.receiver), ident(row.message_id, row.body))].append(row)
        self.parked = dict(parked)
        return self

    @property
    def lost(self) -> list[tuple[str, str]]:
        return [k for k in self.expected if k not in self.done and k not in self.parked]

    @property
    def handled(self) -> int:
        return sum(1 for k in self.expected if k in self.done)

    @property
    def parked_count(self) -> int:
        return sum(1 for k in self.expected if k in self.parked and k not in self.done)

    @property
    def duplicates(self) -> int:
        extra = sum(n - 1 for n in self.done.values() if n > 1)
        both = sum(1 for k in self.parked if k in self.done)
        rows = sum(len(v) - 1 for v in self.parked.values())
        return extra + both + rows

    def complete(self) -> bool:
        return not self.lost

    def over_runs(self, delivery_limit: int) -> tuple[list[str], int]:
        """Pairs whose receiver ran more than its policy allows, and the most runs of a pair.

        Fresh starts (not redelivered by the broker) are receiver attempts: at most
        max_attempts (these tests never requeue, so there is one round). Redelivered starts of one attempt are give-backs: at
        most the delivery limit before the message must be parked.
        """
        bad = []
        most = 0
        for (rec, token), starts in self.starts.items():
            most = max(most, len(starts))
            limit = MAX_ATTEMPTS.get(rec, 0)
            rounds = 1  # nothing here requeues: a forged requeued header earns no extra runs
            fresh = sum(1 for s in starts if not s["redelivered"])
            by_attempt = Counter(s["attempt"] for s in starts if s["redelivered"])
            if fresh > limit * rounds:
                bad.append(f"{rec} ran {token} {fresh} times fresh (policy {limit} x {rounds})")
            for attempt, n in by_attempt.items():
                if n > delivery_limit:
                    bad.append(
                        f"{rec} ran {token} attempt {attempt} redelivered {n} times "
                        f"(delivery limit {delivery_limit})"
                    )
            if len(starts) > limit * rounds * (delivery_limit + 1):
                bad.append(f"{rec} ran {token} {len(starts)} times in all")
        return bad, most


def unreadable_rows(tally: Tally) -> list[str]:
    out = []
    for (rec, token), rows in tally.parked.items():
        for row in rows:
            if not (row.reason_detail or row.error_message):
                out.append(f"{rec}/{token}: parked ({row.reason}) without a readable reason")
    return out


# Broker events ---------------------------------------------------------------------------------
def consumer_connections(child_pid: int) -> list[str]:
    """Broker pids of the connections a consumer process opened (its name carries its pid)."""
    out = rabbitmqctl("list_connections", "pid", "client_properties", check=False)
    return [
        line.split("\t", 1)[0]
        for line in out.splitlines()
        if re.search(rf"pid {child_pid}\b", line)
    ]


def kill_connections(child_pid: int) -> int:
    pids = consumer_connections(child_pid)
    for pid in pids:
        rabbitmqctl("close_connection", pid, "adversarial: connection killed", check=False)
    return len(pids)


@contextlib.contextmanager
def memory_alarm(seconds: float) -> Any:
    """Raise a memory alarm (every publisher blocks) for ``seconds``; always restored."""
    rabbitmqctl("set_vm_memory_high_watermark", "0.000001")
    try:
        time.sleep(seconds)
        yield
    finally:
        rabbitmqctl("set_vm_memory_high_watermark", "0.4")


def get_env(key: str) -> str:
    """A rabbit application setting (an integer, or "undefined")."""
    out = rabbitmqctl("eval", f"application:get_env(rabbit, {key}).")
    found = re.search(r"\{ok,\s*(\d+)\}", out)
    return found.group(1) if found else "undefined"


#: What to restore a setting to when it was not set (unsetting channel_tick_interval while
#: channels tick crashes them on 3.10: 541 INTERNAL_ERROR).
DEFAULTS = {"channel_tick_interval": "60000"}


def set_env(key: str, value: str) -> None:
    """Set a rabbit application setting (new channels read it); "undefined" unsets it."""
    value = DEFAULTS.get(key, value) if value == "undefined" else value
    if value == "undefined":
        rabbitmqctl("eval", f"application:unset_env(rabbit, {key}).")
    else:
        rabbitmqctl("eval", f"application:set_env(rabbit, {key}, {int(value)}).")


def get_consumer_timeout() -> str:
    return get_env("consumer_timeout")


def set_consumer_timeout(value: str) -> None:
    set_env("consumer_timeout", value)


def reconnects(output: str) -> int:
    """Reconnect log lines of the consumer (each is one abandoned connection)."""
    return len(re.findall(r"reconnecting in|; retrying in", output))


def record(row: dict[str, Any]) -> None:
    ROWS.append(row)
    print("\nADVERSARIAL " + " | ".join(f"{k}={row[k]}" for k in COLUMNS))


def format_table(rows: list[dict[str, Any]]) -> list[str]:
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in COLUMNS}
    out = ["| " + " | ".join(c.ljust(widths[c]) for c in COLUMNS) + " |"]
    out.append("|" + "|".join("-" * (widths[c] + 2) for c in COLUMNS) + "|")
    for r in rows:
        out.append("| " + " | ".join(str(r[c]).ljust(widths[c]) for c in COLUMNS) + " |")
    return out


class Background:
    """Run a broker event in a thread while the publisher keeps going; errors re-raised."""

    def __init__(self, target: Any) -> None:
        self.error: BaseException | None = None

        def run() -> None:
            try:
                target()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 120) -> None:
        self.thread.join(timeout)
        if self.error is not None:
            raise self.error


#: The seed when neither ``ADV_SEED`` nor a git checkout gives one (an unpacked sdist).
DEFAULT_SEED = 20261127


def seed_from_env() -> int:
    """``ADV_SEED`` if set; otherwise derived from the checked-out commit, so a CI run is
    repeatable (the same commit draws the same messages, a red run replays as it was) while
    each commit still explores new ones. Printed by the tests that use it."""
    raw = os.environ.get("ADV_SEED")
    if raw:
        return int(raw)
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        return int(head[:6], 16)
    except (OSError, subprocess.SubprocessError, ValueError):
        return DEFAULT_SEED
