"""Database-side steps of the requeue benchmark, each run as its own process.

    python -m bench.dbtool seed N TAG [BYTES]  # N parked rows (not timed), bodies of ~BYTES
    python -m bench.dbtool sendmany N [BYTES]  # Topic.send_many of N such bodies: JSON result
    python -m bench.dbtool requeue TAG       # parking.requeue() of those rows: JSON result
    python -m bench.dbtool rawrequeue TAG    # the raw twin: SQL + pika with confirms
    python -m bench.dbtool count TABLE       # rows in a table
    python -m bench.dbtool outbox N          # the outbox relay vs send_many: JSON result

The environment (``bench.common.Run.env``) says which database and prefix. ``requeue``
prints the process's peak RSS before and after, so the memory figure is that of a real
requeue of every row, measured in a process that did nothing else.
"""

from __future__ import annotations

import json
import sys
import time
import uuid


def _setup() -> None:
    import django

    django.setup()


def _rss_mb() -> float:
    from bench.common import vm_hwm_mb

    return vm_hwm_mb()


def _body(i: int, size: int) -> bytes:
    """A JSON body of about ``size`` bytes (at least the small one), padded with random
    base64: PostgreSQL's TOAST compression must not make large bodies cheap."""
    small = {"i": i, "op": "bench"}
    if size <= 40:
        return json.dumps(small, separators=(",", ":")).encode()
    import base64
    import os

    pad = base64.b64encode(os.urandom(size * 3 // 4)).decode()[: max(0, size - 40)]
    return json.dumps({**small, "pad": pad}, separators=(",", ":")).encode()


def seed(n: int, tag: str, size: int = 0) -> None:
    from django.utils import timezone

    from bench.common import queue_name
    from django_rmq_retry.conf import app_settings
    from django_rmq_retry.core.names import Names
    from django_rmq_retry.models import ParkedMessage

    queue = queue_name("bench_requeue")
    exchange = Names(app_settings.PREFIX).work_exchange
    now = timezone.now()
    batch = []
    for i in range(n):
        mid = uuid.uuid4().hex
        body = _body(i, size)
        batch.append(
            ParkedMessage(
                park_key=f"{tag}-{i}",
                receiver=f"bench.{tag}",  # filtered on: indexed (receiver, status)
                queue=queue,
                exchange=exchange,
                routing_key="bench.requeue",
                message_id=mid,
                body=body,
                body_size=len(body),
                content_type="application/json",
                properties={
                    "content_type": "application/json",
                    "delivery_mode": 2,
                    "message_id": mid,
                    "timestamp": int(time.time()),
                },
                headers={"app": "bench"},
                reason="rejected",
                reason_detail=tag,
                error_type="bench.Rejected",
                error_message="bench",
                attempts=1,
                parked_at=now,
            )
        )
        if len(batch) >= (2000 if size < 4096 else 100):
            ParkedMessage.objects.bulk_create(batch)
            batch = []
    if batch:
        ParkedMessage.objects.bulk_create(batch)
    from django.db import connection

    if connection.vendor == "postgresql":
        # What autovacuum does within a minute of a flood of parked rows. (A CI machine's
        # PostgreSQL may run with autovacuum off: without statistics the planner guesses.)
        with connection.cursor() as cursor:
            cursor.execute(f"ANALYZE {ParkedMessage._meta.db_table}")


def requeue(tag: str) -> None:
    from django_rmq_retry import parking
    from django_rmq_retry.models import ParkedMessage
    from django_rmq_retry.publishing.per_thread import get_publisher

    qs = ParkedMessage.objects.filter(receiver=f"bench.{tag}")
    get_publisher().close()  # nothing warmed up beyond what every requeue needs
    before = _rss_mb()
    t0 = time.perf_counter()
    result = parking.requeue(qs, user="bench")
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "requeued": result.requeued,
                "failed": result.failed,
                "seconds": seconds,
                "baseline_mb": before,
                "maxrss_mb": _rss_mb(),
            }
        )
    )


def rawrequeue(tag: str) -> None:
    """What a hand-written requeue does: keyset-paged SQL, a confirmed publish per row,
    one UPDATE per page. No claims, no history (less work than ours)."""
    import pika
    from django.db import connection

    from bench.common import BROKER_URL
    from django_rmq_retry.conf import app_settings
    from django_rmq_retry.core.names import Names
    from django_rmq_retry.models import ParkedMessage

    names = Names(app_settings.PREFIX)
    table = ParkedMessage._meta.db_table
    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    ch = conn.channel()
    ch.confirm_delivery()
    before = _rss_mb()
    t0 = time.perf_counter()
    last = 0
    done = 0
    with connection.cursor() as cur:
        while True:
            cur.execute(
                f"SELECT id, body, properties, headers, queue, requeue_count FROM {table} "
                "WHERE receiver = %s AND status = 'parked' AND id > %s ORDER BY id LIMIT 500",
                [f"bench.{tag}", last],
            )
            rows = cur.fetchall()
            if not rows:
                break
            ids = []
            for pk, body, props_json, headers_json, queue, requeue_count in rows:
                props = json.loads(props_json) if isinstance(props_json, str) else props_json
                headers = (
                    json.loads(headers_json) if isinstance(headers_json, str) else headers_json
                )
                headers = dict(headers or {})
                headers[names.target_header] = queue
                headers[names.header("requeued")] = requeue_count + 1
                headers[names.header("parked-id")] = str(pk)
                ch.basic_publish(
                    names.deliver_exchange,
                    "",
                    bytes(body),
                    pika.BasicProperties(
                        content_type=props.get("content_type"),
                        delivery_mode=2,
                        message_id=props.get("message_id"),
                        timestamp=props.get("timestamp"),
                        headers=headers,
                    ),
                    mandatory=True,
                )
                ids.append(pk)
            cur.execute(
                f"UPDATE {table} SET status = 'requeued', requeue_count = requeue_count + 1 "
                f"WHERE id IN ({', '.join(['%s'] * len(ids))})",
                ids,
            )
            done += len(ids)
            last = ids[-1]
    seconds = time.perf_counter() - t0
    conn.close()
    print(
        json.dumps(
            {
                "requeued": done,
                "failed": 0,
                "seconds": seconds,
                "baseline_mb": before,
                "maxrss_mb": _rss_mb(),
            }
        )
    )


def outbox(n: int) -> None:
    """N rows committed through the outbox (timed: the sender's transaction), then the relay
    publishing all of them (timed), then ``send_many`` of N bodies (the twin), in one process
    on one connection. The relay's figure includes its SELECT, DELETE and commit per batch."""
    from django.db import connection, transaction
    from django.test import override_settings
    from django.test.utils import CaptureQueriesContext

    from bench.benchapp.consumers import requeue_topic
    from django_rmq_retry.conf import app_settings
    from django_rmq_retry.models import OutboxMessage
    from django_rmq_retry.outbox import publish_all

    bodies = [{"i": i, "op": "bench"} for i in range(n)]
    requeue_topic.send_many(bodies[:10])  # connect and declare before timing
    conf = {**app_settings.user_settings(), "OUTBOX_PUBLISH_ON_COMMIT": False}
    with override_settings(RMQ_RETRY=conf):
        OutboxMessage.objects.all().delete()
        with transaction.atomic():
            OutboxMessage.objects.exists()  # the transaction's own work
            with CaptureQueriesContext(connection) as one:
                requeue_topic.send(bodies[0], outbox=True)
        t0 = time.perf_counter()
        with transaction.atomic():
            requeue_topic.send_many(bodies[1:], outbox=True)
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        publish_all()
        relay_s = time.perf_counter() - t0
    left = OutboxMessage.objects.count()
    t0 = time.perf_counter()
    requeue_topic.send_many(bodies)
    send_many_s = time.perf_counter() - t0
    statements = [q["sql"].split()[0] for q in one.captured_queries]
    print(
        json.dumps(
            {
                "relay_seconds": relay_s,
                "send_many_seconds": send_many_s,
                "write_seconds": write_s,
                "left": left,
                "one_send_statements": statements,
            }
        )
    )


def sendmany(n: int, size: int = 0) -> None:
    """The broker's pace for the same messages: ``Topic.send_many`` of N bodies of ``size``
    bytes to the requeue target, on a warm connection, in chunks of 10,000."""
    from bench.benchapp.consumers import requeue_topic

    requeue_topic.send_many([json.loads(_body(-1, size))])  # connect and declare
    bodies = [json.loads(_body(i, size)) for i in range(n)]
    t0 = time.perf_counter()
    for start in range(0, n, 10_000):
        requeue_topic.send_many(bodies[start : start + 10_000])
    print(json.dumps({"seconds": time.perf_counter() - t0, "sent": n + 1}))


def count(table: str) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"SELECT COUNT(*) FROM {table}")
        print(cur.fetchone()[0])


def main(argv: list[str]) -> None:
    _setup()
    cmd, *args = argv
    if cmd == "seed":
        seed(int(args[0]), args[1], int(args[2]) if len(args) > 2 else 0)
    elif cmd == "sendmany":
        sendmany(int(args[0]), int(args[1]) if len(args) > 1 else 0)
    elif cmd == "requeue":
        requeue(args[0])
    elif cmd == "rawrequeue":
        rawrequeue(args[0])
    elif cmd == "count":
        count(args[0])
    elif cmd == "outbox":
        outbox(int(args[0]))
    else:
        raise SystemExit(f"unknown command {cmd!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
