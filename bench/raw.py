"""The raw pika twins: what a careful user would write by hand, with no library at all.

Run as processes by the benchmarks (no Django here), e.g.::

    python bench/raw.py consume QUEUE N PREFETCH MARKFILE
    python bench/raw.py retry QUEUE N PREFETCH MARKFILE DELAY_QUEUE
    python bench/raw.py park QUEUE N PREFETCH MARKFILE DATABASE_URL
    python bench/raw.py multi 2 consume QUEUE N PREFETCH MARKFILE   # 2 processes, N/2 each
    python bench/raw.py cpu QUEUE N PREFETCH MARKFILE   # consume, with bench/cpuwork.burn()
    python bench/raw.py batched QUEUE N PREFETCH MARKFILE  # consume, acks with multiple=True
    python bench/raw.py retryonce QUEUE N PREFETCH MARKFILE DELAY_QUEUE TIMESFILE

Every mode decodes the JSON body and acks each message on its own (``multiple=False``; the
library's consumer batches plain acks, the twin stays the simple hand-written loop), except
``batched``: one ``multiple=True`` ack per half prefetch window (and for the last message),
what a hand-tuned consumer does to get the most out of one consumer's prefetch;
``retry`` first republishes a copy with a confirm (``BlockingChannel`` waits for it),
``park`` first inserts and commits a row. The first delivery writes
``<epoch seconds> <pid>`` to MARKFILE.

``retryonce`` (the peers group, ``bench/peers``) is the naive delayed retry a user writes by
hand: the first attempt of each message fails and a copy is published, with a confirm, into
ONE delay queue with a per-message TTL (``expiration`` = the body's ``delay``), which
dead-letters back to QUEUE; the original is then acked. The second attempt succeeds; it stops
after N successes and writes MARKFILE and TIMESFILE as ``bench/peers/record.py`` says.
RabbitMQ expires only the message at the head of a queue, so a short delay waits behind a
longer one published before it (head-of-line blocking): the pattern ours replaces.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import pika

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.cpuwork import burn

URL = os.environ.get("RMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


def _db(url: str) -> tuple[Any, str]:
    """A DB-API connection and the parameter style for ``url`` (sqlite:/// or postgres://)."""
    if url.startswith("sqlite:///"):
        import sqlite3

        conn = sqlite3.connect(url[len("sqlite:///") :], timeout=20)
        conn.execute(
            "CREATE TABLE IF NOT EXISTS raw_parked (id INTEGER PRIMARY KEY, message_id TEXT, "
            "routing_key TEXT, body BLOB, headers TEXT, reason TEXT, parked_at REAL)"
        )
        conn.commit()
        return conn, "?"
    import psycopg

    conn = psycopg.connect(url)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS raw_parked (id BIGSERIAL PRIMARY KEY, message_id TEXT, "
        "routing_key TEXT, body BYTEA, headers JSONB, reason TEXT, parked_at DOUBLE PRECISION)"
    )
    conn.commit()
    return conn, "%s"


def _second_attempt(props: Any, **extra: Any) -> pika.BasicProperties:
    """The properties of a failed delivery's retry copy, as a careful user writes them."""
    headers = {**(props.headers or {}), "raw-attempt": 2, "raw-error": "first attempt fails"}
    return pika.BasicProperties(
        content_type=props.content_type,
        delivery_mode=2,
        message_id=props.message_id,
        timestamp=props.timestamp,
        headers=headers,
        **extra,
    )


def consume(mode: str, queue: str, n: int, prefetch: int, mark: str, extra: str = "") -> None:
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    pub = None
    db = None
    if mode == "retry":
        pub = conn.channel()
        pub.confirm_delivery()
    if mode == "park":
        db, ph = _db(extra)
        insert = (
            "INSERT INTO raw_parked (message_id, routing_key, body, headers, reason, parked_at) "
            f"VALUES ({', '.join([ph] * 6)})"
        )
    count = 0
    marked = False
    last = 0.0

    def on_message(channel: Any, method: Any, props: Any, body: bytes) -> None:
        nonlocal count, marked, last
        if not marked:
            marked = True
            with open(mark, "a") as fh:
                fh.write(f"{time.time()} {os.getpid()}\n")
        data = json.loads(body)
        if mode == "cpu":
            burn()
        elif mode == "retry":
            copy = _second_attempt(props)
            pub.basic_publish("", extra, body, copy, mandatory=True)  # waits for the confirm
        elif mode == "park":
            db.execute(
                insert,
                (
                    props.message_id,
                    method.routing_key,
                    body,
                    json.dumps(props.headers or {}),
                    f"rejected {data.get('i')}",
                    time.time(),
                ),
            )
            db.commit()
        count += 1
        if mode != "batched":
            channel.basic_ack(method.delivery_tag)
        elif count % max(1, prefetch // 2) == 0 or count >= n:
            channel.basic_ack(method.delivery_tag, multiple=True)
        last = time.time()
        if count >= n:
            channel.stop_consuming()

    ch.basic_consume(queue, on_message)
    ch.start_consuming()
    conn.close()
    if mode in ("consume", "cpu", "batched"):
        with open(mark, "a") as fh:
            fh.write(f"end {last} {os.getpid()} {count}\n")
    if db is not None:
        db.close()


def retry_once(queue: str, n: int, prefetch: int, mark: str, delay_queue: str, times: str) -> None:
    from bench.peers.record import Recorder

    rec = Recorder(mark, times)
    conn = pika.BlockingConnection(pika.URLParameters(URL))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    pub = conn.channel()
    pub.confirm_delivery()

    def on_message(channel: Any, method: Any, props: Any, body: bytes) -> None:
        rec.first()
        data = json.loads(body)
        if "raw-attempt" not in (props.headers or {}):
            rec.failed(data["i"])
            copy = _second_attempt(props, expiration=str(round(float(data["delay"]) * 1000)))
            pub.basic_publish("", delay_queue, body, copy, mandatory=True)  # waits for the confirm
            channel.basic_ack(method.delivery_tag)
            return
        done = rec.ok(data["i"]) >= n
        channel.basic_ack(method.delivery_tag)
        if done:
            channel.stop_consuming()

    ch.basic_consume(queue, on_message)
    ch.start_consuming()
    conn.close()
    rec.finish()


def main(argv: list[str]) -> None:
    if argv[0] == "multi":  # multi P MODE QUEUE N ...: P processes, N/P messages each
        import subprocess

        procs, mode, queue, n, *rest = argv[1:]
        each = int(n) // int(procs)
        children = [
            subprocess.Popen([sys.executable, __file__, mode, queue, str(each), *rest])
            for _ in range(int(procs))
        ]
        sys.exit(max(abs(c.wait()) for c in children))
    mode, queue, n, prefetch, mark, *rest = argv
    if mode == "retryonce":
        retry_once(queue, int(n), int(prefetch), mark, rest[0], rest[1])
        return
    consume(mode, queue, int(n), int(prefetch), mark, rest[0] if rest else "")


if __name__ == "__main__":
    main(sys.argv[1:])
