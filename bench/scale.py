"""Scale scenario: the operator's admin screens over a big parked-message table (issue #16).

    .venv/bin/python bench/scale.py                      # 1,000,000 rows, pages only
    .venv/bin/python bench/scale.py --rows 10000000      # the full run
    .venv/bin/python bench/scale.py --bulk               # also requeue / discard / purge
    .venv/bin/python bench/scale.py --keep --reuse       # keep the database, load only once
    .venv/bin/python bench/scale.py --bulk --requeue-budget 10   # a click under a short budget

Loads N parked rows into a PostgreSQL database of its own (``BENCH_SCALE_DB``, default
``rmq_scale``, created from ``BENCH_PG_URL``) with one ``INSERT ... SELECT`` over
``generate_series`` per 250,000 rows, runs ``VACUUM ANALYZE`` (what autovacuum does to a
table after a bulk insert), then times every admin page with Django's test client, logged in
as a superuser, the way a browser would ask for it: the list, each filter, the searches,
"Show counts", a deep page, the failure groups, a detail page. Each page is asked for once to
warm up, then ``--repeat`` times; the median is reported. ``--bulk`` then runs the admin's
"requeue all matching" on a 100,000-row failure group (through a publisher that confirms
everything at once: the database side of a requeue, not the broker's), "discard" on another
100,000-row group, and ``rmq_purge_parked``. At the end: the table with its target
(300 ms a page) and the ``EXPLAIN (ANALYZE, BUFFERS)`` of the slowest statement seen.

The spread of the rows: 50 failure groups over 20 receivers and 12 error types; group 0
(10 %, the last hour: a bad deploy) and group 1 (10 %, the last day) are all parked; the
rest spreads over 90 days and is 70 % parked, 20 % requeued, 10 % discarded; reasons mostly
"exhausted"; bodies of about 40 bytes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PG_ADMIN_URL = os.environ.get("BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")
TARGET_MS = 300.0
CHUNK = 250_000
RECEIVERS = 20
GROUPS = 50
ERROR_TYPES = [
    "shop.models.Order.DoesNotExist",
    "requests.exceptions.ConnectTimeout",
    "KeyError",
    "ValueError",
    "django.db.utils.IntegrityError",
    "billing.errors.CardDeclined",
    "TimeoutError",
    "json.decoder.JSONDecodeError",
    "PermissionError",
    "shop.errors.StockMissing",
    "redis.exceptions.ConnectionError",
    "TypeError",
]
MESSAGES = [
    "Order %s matching query does not exist.",
    "HTTPSConnectionPool(host='pay.example.com'): connect timeout=5 for order %s",
    "'customer_%s'",
    "invalid literal for int() with base 10: 'x%s'",
    "duplicate key value violates unique constraint for invoice %s",
    "card declined for payment %s",
    "operation timed out after 30 s (request %s)",
    "Expecting value: line 1 column %s (char 0)",
    "permission denied for file /var/exports/%s.csv",
    "no stock left for sku %s",
    "Error 111 connecting to cache:6379 (attempt %s)",
    "unsupported operand type(s) for +: 'int' and 'str' in line %s",
]


def db_url(name: str) -> str:
    parts = urlsplit(PG_ADMIN_URL)
    return urlunsplit(parts._replace(path=f"/{name}"))


def admin_execute(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql)


def database_exists(name: str) -> bool:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    return row is not None


def setup_django(url: str) -> None:
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "testproject.settings"
    os.environ.setdefault("RMQ_PREFIX", "rmq_scale")
    import django
    from django.conf import settings

    django.setup()
    settings.DEBUG = False
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]


def _array(values: list[str]) -> str:
    return "ARRAY[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]"


def load(rows: int, first: int = 1) -> float:
    """Insert ``rows`` rows with SQL; returns the seconds it took (ANALYZE included)."""
    from django.db import connection

    started = time.monotonic()
    types = _array(ERROR_TYPES)
    texts = _array(MESSAGES)
    table = "django_rmq_retry_parkedmessage"
    # g: failure group; 0 and 1 are the two 10 % incidents, all parked.
    sql = f"""
    INSERT INTO {table} (
        park_key, receiver, queue, exchange, routing_key, message_id, correlation_id,
        body, body_size, content_type, properties, headers, reason, reason_detail,
        error_type, error_message, traceback, fingerprint, attempts, first_failure_at,
        last_failure_at, parked_at, park_count, status, status_changed_at,
        status_changed_by, requeue_count, history)
    SELECT
        md5('k' || i), 'shop.receivers.handler_' || (g % {RECEIVERS}),
        'rmq_retry.shop.receivers.handler_' || (g % {RECEIVERS}), 'rmq_retry.work',
        'shop.event_' || (g % 7), md5(i::text), 'corr-' || (i / 3), convert_to(
        '{{"order_id": ' || i || ', "kind": "paid"}}', 'UTF8'), 30 + length(i::text),
        'application/json', '{{"content_type": "application/json", "delivery_mode": 2}}',
        '{{}}', CASE WHEN i % 20 = 0 THEN 'rejected' WHEN i % 20 = 1 THEN 'non_retryable'
        ELSE 'exhausted' END, '', ({types})[1 + g % 12],
        format(({texts})[1 + g % 12], i), 'Traceback (most recent call last):' || chr(10)
        || '  File "shop/receivers.py", line ' || (10 + g) || ', in handle' || chr(10)
        || ({types})[1 + g % 12], ({types})[1 + g % 12] || '@shop/receivers.py:handler_'
        || g, 5, at - interval '5 minutes', at - interval '1 minute', at, 1,
        CASE WHEN g < 2 OR i % 10 < 7 THEN 'parked' WHEN i % 10 < 9 THEN 'requeued'
        ELSE 'discarded' END, NULL, '', 0, '[]'
    FROM (
        SELECT i, g, CASE WHEN g = 0 THEN now() - (i % 3600) * interval '1 second'
                          WHEN g = 1 THEN now() - (i % 86400) * interval '1 second'
                          ELSE now() - (%(rows)s - i) * interval '90 days' / %(rows)s END AS at
        FROM (
            SELECT i, CASE WHEN i % 10 = 0 THEN 0 WHEN i % 10 = 1 THEN 1
                           ELSE 2 + (i / 10) % {GROUPS - 2} END AS g
            FROM generate_series(%(start)s, %(stop)s) AS i
        ) AS numbered
    ) AS spread
    """
    # Every % of the SQL (modulo, format()) doubled for the driver, except the parameters.
    sql = sql.replace("%", "%%")
    for name in ("rows", "start", "stop"):
        sql = sql.replace(f"%%({name})s", f"%({name})s")
    with connection.cursor() as cursor:
        for start in range(first, rows + 1, CHUNK):
            stop = min(rows, start + CHUNK - 1)
            cursor.execute(sql, {"rows": rows, "start": start, "stop": stop})
            print(f"  loaded {stop:,} rows", file=sys.stderr, flush=True)
    connection.close()
    # VACUUM cannot run in a transaction block: a connection of its own, autocommit.
    import psycopg

    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {table}")
    return time.monotonic() - started


class Timer:
    """Times pages with the test client; remembers the slowest statement seen."""

    def __init__(self, repeat: int) -> None:
        from django.contrib.auth.models import User
        from django.test import Client

        self.repeat = repeat
        self.client = Client()
        user = User.objects.filter(username="scale-bench").first()
        if user is None:
            user = User.objects.create_superuser("scale-bench", "ops@example.com", "pw")
        self.client.force_login(user)
        self.rows: list[dict[str, Any]] = []
        self.slowest: tuple[float, str, str] = (0.0, "", "")

    def page(self, label: str, url: str, expect: str | None = None) -> None:
        from django.db import connection
        from django.test.utils import CaptureQueriesContext

        response = self.client.get(url)  # warm-up (and the check that the page works)
        if response.status_code != 200:
            raise SystemExit(f"{label}: {url} answered {response.status_code}")
        if expect is not None and expect not in response.content.decode():
            raise SystemExit(f"{label}: {url} does not show {expect!r}")
        times = []
        for _ in range(self.repeat):
            t0 = time.perf_counter()
            self.client.get(url)
            times.append((time.perf_counter() - t0) * 1000)
        with CaptureQueriesContext(connection) as captured:
            self.client.get(url)
        queries = [(float(q["time"]) * 1000, q["sql"]) for q in captured.captured_queries]
        worst = max(queries, default=(0.0, ""))
        if worst[0] > self.slowest[0]:
            self.slowest = (worst[0], worst[1], label)
        self.add(label, statistics.median(times), "ms", len(queries), worst[0])

    def add(
        self,
        label: str,
        value: float,
        unit: str,
        queries: int | None = None,
        worst: float | None = None,
        target: float | None = TARGET_MS,
        note: str = "",
    ) -> None:
        met = None if target is None else value <= target
        self.rows.append(
            {
                "label": label + (f" ({note})" if note else ""),
                "value": value,
                "unit": unit,
                "queries": queries,
                "worst": worst,
                "target": target,
                "met": met,
            }
        )
        print(f"  {label}: {value:,.1f} {unit}", file=sys.stderr, flush=True)

    def table(self) -> str:
        head = ["page", "median", "queries", "slowest query", "target", "met?"]
        body = []
        for r in self.rows:
            unit = r["unit"]
            body.append(
                [
                    r["label"],
                    f"{r['value']:,.0f} {unit}" if r["value"] >= 10 else f"{r['value']:.1f} {unit}",
                    "—" if r["queries"] is None else str(r["queries"]),
                    "—" if r["worst"] is None else f"{r['worst']:,.0f} ms",
                    "—" if r["target"] is None else f"≤ {r['target']:,.0f} {unit}",
                    "—" if r["met"] is None else ("yes" if r["met"] else "NO"),
                ]
            )
        widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
        lines = [
            "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
            "|" + "|".join("-" * (w + 2) for w in widths) + "|",
        ]
        lines += [
            "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
            for row in body
        ]
        return "\n".join(lines)


def changelist(**query: Any) -> str:
    from django.urls import reverse

    url = reverse("admin:django_rmq_retry_parkedmessage_changelist")
    return f"{url}?{urlencode(query)}" if query else url


def group_query(g: int) -> dict[str, str]:
    """The filter the failure-groups page links to for group ``g``."""
    error_type = ERROR_TYPES[g % 12]
    return {
        "status__exact": "parked",
        "receiver": f"shop.receivers.handler_{g % RECEIVERS}",
        "fingerprint": f"{error_type}@shop/receivers.py:handler_{g}",
        "error_type": error_type,
    }


def pages(timer: Timer, rows: int) -> None:
    from django.db import connection
    from django.urls import reverse
    from django.utils import timezone

    from django_rmq_retry.models import ParkedMessage

    some = rows // 2 + 7
    with connection.cursor() as cursor:
        cursor.execute("SELECT md5(%s::text), 'corr-' || (%s / 3)", [some, some])
        message_id, correlation_id = cursor.fetchone()
    # As the filter's own "Past 7 days" link writes them.
    today = timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)
    week_ago = today - timezone.timedelta(days=7)
    tomorrow = today + timezone.timedelta(days=1)
    timer.page("list, no filter", changelist())
    timer.page("filter status = parked", changelist(status__exact="parked"))
    timer.page("filter reason = rejected", changelist(reason__exact="rejected"))
    timer.page("filter receiver", changelist(receiver="shop.receivers.handler_3"))
    timer.page("filter queue", changelist(queue="rmq_retry.shop.receivers.handler_3"))
    timer.page("filter error type", changelist(error_type="TimeoutError"))
    timer.page("filter failure group", changelist(fingerprint=group_query(7)["fingerprint"]))
    timer.page(
        "filter parked at: past 7 days",
        changelist(parked_at__gte=str(week_ago), parked_at__lt=str(tomorrow)),
    )
    big, small = rows // 10, rows * 8 // 10 // (GROUPS - 2)
    timer.page(f"a failure group's link (4 filters), {big:,} rows", changelist(**group_query(0)))
    timer.page(f"a failure group's link (4 filters), {small:,} rows", changelist(**group_query(7)))
    timer.page("search: message id", changelist(q=message_id), expect=message_id)
    timer.page("search: correlation id", changelist(q=correlation_id))
    timer.page("search: a word no row has", changelist(q="zebrafish"))
    timer.page("search: a word in 1 of 12 errors", changelist(q="declined"))
    timer.page("show counts (facets)", changelist(_facets="True"))
    timer.page("deep page: 200 (rows 9,951-10,000)", changelist(p="200"))
    timer.page("failure groups page", reverse("admin:django_rmq_retry_parkedmessage_summary"))
    pk = ParkedMessage.objects.order_by().values_list("pk", flat=True).filter(pk__gte=some)[0]
    timer.page("detail page", reverse("admin:django_rmq_retry_parkedmessage_change", args=[pk]))


class _ConfirmAll:
    """A publisher that confirms every message at once: a requeue's database side only."""

    def stream_batches(
        self, batches: Any, answered: Any, window: int = 0, most: Any = None, deadline: Any = None
    ) -> None:
        for batch in batches:
            if batch is not None:
                for item in batch:
                    item.state = "ack"
                answered(batch)


def bulk(timer: Timer) -> None:
    from django.core.management import call_command
    from django.db import connection

    from django_rmq_retry.models import ParkedMessage, ParkedStatus, RequeueOperation
    from django_rmq_retry.parking import operations

    requeue_module = sys.modules["django_rmq_retry.parking.requeuing"]

    def post(action: str, query: dict[str, str], pk: int) -> float:
        data = {"action": action, "_selected_action": [str(pk)], "index": "0", "select_across": "1"}
        t0 = time.perf_counter()
        response = timer.client.post(changelist(**query), data, follow=True)
        seconds = time.perf_counter() - t0
        if response.status_code != 200:
            raise SystemExit(f"{action}: answered {response.status_code}")
        import re

        for message in re.findall(
            r'<li class="(?:success|warning|error)">(.*?)</li>', response.content.decode(), re.S
        ):
            print(f"    {action}: {message}", file=sys.stderr, flush=True)
        return seconds

    original = requeue_module.get_publisher
    requeue_module.get_publisher = lambda: _ConfirmAll()  # type: ignore[assignment]
    try:
        query = group_query(0)
        group = ParkedMessage.objects.filter(
            **{k: v for k, v in query.items() if k != "status__exact"}
        )
        pk = group.values_list("pk", flat=True)[0]
        before = group.filter(status=ParkedStatus.PARKED).count()
        # The click starts an operation (one INSERT ... SELECT of the ids); its steps, run
        # here as a consumer's housekeeping thread would, send the rows.
        seconds = post("requeue_selected", query, pk)
        op = RequeueOperation.objects.latest("pk")
        timer.add(
            f"requeue all matching, group of {before:,}: the click",
            seconds * 1000,
            "ms",
            target=None,
            note=f"starts an operation of {op.total:,} rows, sends nothing",
        )
        t0 = time.perf_counter()
        while op.sent + op.refused + op.skipped < op.total:
            if not operations.advance_due(only=op.pk):
                time.sleep(0.01)
            op.refresh_from_db()
        stepped = time.perf_counter() - t0
        done = group.filter(status=ParkedStatus.REQUEUED).count()
        timer.add(
            f"requeue all matching, group of {before:,}: its steps",
            stepped,
            "s",
            target=None,
            note=f"{done:,} rows, {done / stepped:,.0f} rows/s; broker left out",
        )
    finally:
        requeue_module.get_publisher = original  # type: ignore[assignment]

    query = group_query(1)
    group = ParkedMessage.objects.filter(**{k: v for k, v in query.items() if k != "status__exact"})
    pk = group.values_list("pk", flat=True)[0]
    before = group.filter(status=ParkedStatus.PARKED).count()
    seconds = post("discard_selected", query, pk)
    done = group.filter(status=ParkedStatus.DISCARDED).count()
    timer.add(
        f"discard all matching, group of {before:,}",
        seconds * 1000,
        "ms",
        target=None,
        note=f"{done:,} discarded, {done / seconds:,.0f} rows/s",
    )

    def table_mb() -> float:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_total_relation_size('django_rmq_retry_parkedmessage')")
            return cursor.fetchone()[0] / 1e6

    size_before = table_mb()
    count_before = ParkedMessage.objects.count()
    t0 = time.perf_counter()
    import io

    call_command("rmq_purge_parked", older_than="30d", stdout=io.StringIO())
    seconds = time.perf_counter() - t0
    purged = count_before - ParkedMessage.objects.count()
    timer.add(
        "rmq_purge_parked --older-than 30d",
        seconds * 1000,
        "ms",
        target=None,
        note=f"{purged:,} rows, {purged / max(seconds, 1e-9):,.0f} rows/s; table + indexes "
        f"{size_before:,.0f} MB -> {table_mb():,.0f} MB",
    )


def explain(sql: str) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="timed requests per page")
    parser.add_argument("--bulk", action="store_true", help="also requeue, discard, purge")
    parser.add_argument("--keep", action="store_true", help="keep the database at the end")
    parser.add_argument("--reuse", action="store_true", help="use the kept database as it is")
    parser.add_argument("--db", default=os.environ.get("BENCH_SCALE_DB", "rmq_scale"))
    args = parser.parse_args(argv)

    started = time.monotonic()
    reuse = args.reuse and database_exists(args.db)
    if not reuse:
        admin_execute(f'DROP DATABASE IF EXISTS "{args.db}"')
        admin_execute(f'CREATE DATABASE "{args.db}"')
    try:
        setup_django(db_url(args.db))
        from django.core.management import call_command
        from django.db import connection

        from django_rmq_retry.models import ParkedMessage

        call_command("migrate", verbosity=0)
        load_seconds = None
        if not reuse:
            print(f"· loading {args.rows:,} rows ...", file=sys.stderr, flush=True)
            load_seconds = load(args.rows)
        rows = ParkedMessage.objects.count()
        print("· pages ...", file=sys.stderr, flush=True)
        timer = Timer(args.repeat)
        pages(timer, rows)
        if args.bulk:
            print("· bulk operations ...", file=sys.stderr, flush=True)
            bulk(timer)
        import django

        with connection.cursor() as cursor:
            cursor.execute("SHOW server_version")
            version = cursor.fetchone()[0]
        print()
        print(
            f"bench/scale.py: {rows:,} parked rows on PostgreSQL {version}"
            + (f" (loaded in {load_seconds:.0f} s)" if load_seconds else " (reused)")
            + f"; Django {django.__version__}; {os.cpu_count()} CPU(s); median of {args.repeat} "
            f"requests after one warm-up; total {time.monotonic() - started:.0f} s"
        )
        print()
        print(timer.table())
        seconds, sql, label = timer.slowest
        if sql:
            print()
            print(f"Slowest statement ({seconds:,.0f} ms, page: {label}):")
            print()
            print(sql)
            print()
            print(explain(sql))
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            admin_execute(f'DROP DATABASE IF EXISTS "{args.db}"')
    return 0


if __name__ == "__main__":
    sys.exit(main())
