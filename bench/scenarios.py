"""The benchmark scenarios of issue 6. Each returns table rows; ``bench/run.py`` runs them.

Every figure is measured beside its raw-pika twin in the same run, on the same broker, one
after the other, so the ratio is meaningful even on a busy machine. Each scenario checks
that the work was really done (queue depths, row counts) before it reports a figure.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from bench.common import (
    BROKER_URL,
    ROOT,
    Row,
    Run,
    Timed,
    declare_raw_queue,
    depth,
    manage_cmd,
    pct,
    publish_bodies,
    purge,
    queue_name,
    raw_cmd,
    run_timed,
    wait_depth,
)
from bench.peers.record import lateness

PREFETCH = 20
#: Rounds of a figure given as a median (ours and its twin alternating).
ROUNDS = 3

T = TypeVar("T")


# Helpers ---------------------------------------------------------------------------------
def in_turn(steps: Sequence[T], rnd: int) -> Sequence[T]:
    """Round ``rnd``'s order of ``steps``: reversed every other round, so no step always
    runs first (on a host whose speed drifts within minutes)."""
    return steps if rnd % 2 == 0 else steps[::-1]


def ours_consume(
    run: Run,
    short: str,
    n: int,
    *,
    processes: int = 1,
    db: str = "sqlite",
    timeout: float = 300,
    extra_args: tuple[str, ...] = (),
    **env: str,
) -> Timed:
    mark = run.path("mark")
    mark.touch()
    args = ["rmq_consume", short, "--prefetch", str(PREFETCH), "--no-orphans", *extra_args]
    if processes > 1:
        # --max-messages counts per process, so no split of n is exact: stop on
        # idleness instead; the time is first call -> last call.
        args += ["--processes", str(processes), "--max-idle-time", "2"]
    else:
        args += ["--max-messages", str(n)]
    return run_timed(
        manage_cmd(*args),
        run.env(db, BENCH_MARK_FILE=str(mark), **env),
        mark,
        run.path(f"ours-{short}.log"),
        timeout,
    )


def raw_consume(
    run: Run, mode: str, queue: str, n: int, *, processes: int = 1, extra: str = ""
) -> Timed:
    mark = run.path("mark")
    mark.touch()
    args: list[Any] = [mode, queue, n, PREFETCH, mark] + ([extra] if extra else [])
    if processes > 1:
        args = ["multi", processes, *args]
    return run_timed(raw_cmd(*args), run.env(), mark, run.path(f"raw-{mode}.log"), 600)


def ensure_empty(*queues: str) -> None:
    for q in queues:
        left = depth(q)
        if left:
            raise RuntimeError(f"{q} still holds {left} message(s): the run did not finish")


def happy_pair(
    run: Run, n: int, processes: int = 1, work: str = "noop", *, batched: bool = False
) -> tuple[Timed, Timed] | tuple[Timed, Timed, Timed]:
    """Pre-publish n messages to our queue and n to the raw twin's; consume both.

    Repeated (3×, 2× above 50,000 messages, the order alternating) and the median taken:
    other work on a small machine moves single runs by ±30 %. ``work`` is ``noop`` or
    ``cpu`` (``bench/cpuwork.burn()`` per message, in both consumers). ``batched`` adds a
    third consumer in each round, the raw twin that acks with ``multiple=True`` (returned
    last).
    """
    short, raw_mode = ("bench_noop", "consume") if work == "noop" else ("bench_cpu", "cpu")
    ours_q = queue_name(short)
    raw_q = declare_raw_queue(run, f"happy{work}", f"bench.raw{work}")
    reps = 2 if n > 50_000 else 3
    runs: dict[str, list[Timed]] = {"ours": [], "raw": [], "batched": []}
    steps = {
        "ours": lambda: runs["ours"].append(ours_consume(run, short, n, processes=processes)),
        "raw": lambda: runs["raw"].append(
            raw_consume(run, raw_mode, raw_q, n, processes=processes)
        ),
        "batched": lambda: runs["batched"].append(
            raw_consume(run, "batched", raw_q, n, processes=processes)
        ),
    }
    order = ["ours", "raw", "batched"] if batched else ["ours", "raw"]
    for _rep in range(reps):
        for name in order:
            # Each consumer's messages published just before it runs: the same queue depth
            # (and broker state) for all of them.
            routing = f"bench.{work}" if name == "ours" else f"bench.raw{work}"
            publish_bodies(routing, n)
            wait_depth(ours_q if name == "ours" else raw_q, n)
            steps[name]()
            ensure_empty(ours_q, raw_q)
            if runs[name][-1].calls != n:
                raise RuntimeError(f"{name}: {runs[name][-1].calls} receiver calls for {n}")
        order.reverse()  # alternate who goes first
    if batched:
        return _median(runs["ours"]), _median(runs["raw"]), _median(runs["batched"])
    return _median(runs["ours"]), _median(runs["raw"])


def _median(runs: list[Timed]) -> Timed:
    ordered = sorted(runs, key=lambda t: t.seconds)
    mid = ordered[(len(ordered) - 1) // 2] if len(ordered) % 2 else None
    if mid is None:  # even count: mean of the middle two
        a, b = ordered[len(ordered) // 2 - 1], ordered[len(ordered) // 2]
        mid = Timed((a.seconds + b.seconds) / 2, (a.wall + b.wall) / 2, 0, 0, a.log, a.calls)
    mid.maxrss_mb = max(t.maxrss_mb for t in runs)
    return mid


# 1. Happy path ---------------------------------------------------------------------------
def happy(run: Run) -> list[Row]:
    n = 20_000
    one_ours, one_raw, one_batched = happy_pair(run, n, batched=True)
    run.cache[("happy", n)] = (one_ours, one_raw)
    two_ours, two_raw = happy_pair(run, n, processes=2)
    r1o, r1r, r1b = n / one_ours.seconds, n / one_raw.seconds, n / one_batched.seconds
    r2o, r2r = n / two_ours.seconds, n / two_raw.seconds
    cpu_n = 2_000 if run.quick else 4_000
    c1o, c1r = (cpu_n / t.seconds for t in happy_pair(run, cpu_n, work="cpu"))
    c2o, c2r = (cpu_n / t.seconds for t in happy_pair(run, cpu_n, processes=2, work="cpu"))
    cpu_note = "receiver burns ~0.5 ms of pure-Python CPU per message"
    return [
        Row(
            f"happy path, 1 process, {n:,} msgs",
            r1o,
            r1r,
            "msg/s",
            "≥ 0.90× raw",
            r1o / r1r >= 0.9,
        ),
        Row(
            f"happy path, 1 process, {n:,} msgs, vs raw acking with multiple=True",
            r1o,
            r1b,
            "msg/s",
            "≥ 0.90× raw",
            r1o / r1b >= 0.9,
            note=f"raw: one multiple=True ack per {PREFETCH // 2} messages, prefetch {PREFETCH}",
        ),
        Row(f"happy path, 2 processes, {n:,} msgs", r2o, r2r, "msg/s", "", None),
        Row(
            "happy path, 2 processes ÷ 1 process",
            r2o / r1o,
            r2r / r1r,
            "×",
            "ours ≥ 1.7×",
            r2o / r1o >= 1.7,
            note="no-op receiver: the broker is the bottleneck",
        ),
        Row(
            f"CPU-bound receiver, 1 process, {cpu_n:,} msgs",
            c1o,
            c1r,
            "msg/s",
            "",
            None,
            note=cpu_note,
        ),
        Row(f"CPU-bound receiver, 2 processes, {cpu_n:,} msgs", c2o, c2r, "msg/s", "", None),
        Row(
            "CPU-bound receiver, 2 processes ÷ 1 process",
            c2o / c1o,
            c2r / c1r,
            "×",
            "ours ≥ 1.7×",
            c2o / c1o >= 1.7,
        ),
    ]


# 2. Publishing ---------------------------------------------------------------------------
def _raw_props() -> Any:
    import pika

    return pika.BasicProperties(
        content_type="application/json",
        delivery_mode=2,
        message_id=uuid.uuid4().hex,
        timestamp=int(time.time()),
        headers={},
    )


def raw_single_publish(exchange: str, routing_key: str, n: int) -> float:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(BROKER_URL))
    ch = conn.channel()
    ch.confirm_delivery()
    body = json.dumps({"i": -1, "op": "bench"}, separators=(",", ":")).encode()
    ch.basic_publish(exchange, routing_key, body, _raw_props(), mandatory=True)  # warm-up
    t0 = time.perf_counter()
    for i in range(n):
        body = json.dumps({"i": i, "op": "bench"}, separators=(",", ":")).encode()
        ch.basic_publish(exchange, routing_key, body, _raw_props(), mandatory=True)
    seconds = time.perf_counter() - t0
    conn.close()
    return seconds


def raw_batch_publish(exchange: str, routing_key: str, n: int, window: int = 1000) -> float:
    """The raw pipelined publisher: pika's async SelectConnection, confirms in a window."""
    import pika

    state: dict[str, Any] = {"sent": 0, "outstanding": {}, "nacked": 0, "returned": 0}
    t: dict[str, float] = {}

    def on_open(conn: Any) -> None:
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch: Any) -> None:
        state["ch"] = ch
        ch.add_on_return_callback(lambda *a: state.__setitem__("returned", state["returned"] + 1))
        ch.confirm_delivery(on_confirm, callback=lambda _f: start())

    def start() -> None:
        t["start"] = time.perf_counter()
        pump()

    def on_confirm(frame: Any) -> None:
        m = frame.method
        out = state["outstanding"]
        tags = [x for x in out if x <= m.delivery_tag] if m.multiple else [m.delivery_tag]
        for x in tags:
            out.pop(x, None)
        if m.NAME == "Basic.Nack":
            state["nacked"] += len(tags)
        pump()

    def pump() -> None:
        ch, out = state["ch"], state["outstanding"]
        while state["sent"] < n and len(out) < window:
            i = state["sent"]
            body = json.dumps({"i": i, "op": "bench"}, separators=(",", ":")).encode()
            ch.basic_publish(exchange, routing_key, body, _raw_props(), mandatory=True)
            state["sent"] += 1
            out[state["sent"]] = True
        if state["sent"] == n and not out and "end" not in t:
            t["end"] = time.perf_counter()
            conn.close()

    conn = pika.SelectConnection(
        pika.URLParameters(BROKER_URL),
        on_open_callback=on_open,
        on_close_callback=lambda c, r: c.ioloop.stop(),
    )
    conn.ioloop.start()
    if state["nacked"] or state["returned"] or "end" not in t:
        raise RuntimeError(f"raw batch publish failed: {state['nacked']} nacked, {state}")
    return t["end"] - t["start"]


def publishing(run: Run) -> list[Row]:
    """Single confirmed sends and the pipelined batch, ours and raw, in alternating rounds.

    Each round runs the four timings once (the order of ours and raw alternating between
    rounds); the table shows each figure's median over the rounds.
    """
    from bench.benchapp.consumers import pub_topic
    from django_rmq_retry.core.names import Names

    single_n = 1_000 if run.quick else 3_000
    batch_n = 20_000 if run.quick else 50_000
    q = queue_name("bench_pub")
    exchange = Names(run.prefix).work_exchange
    purge(q)
    pub_topic.send({"i": -1, "op": "bench"})  # connect and declare before timing
    purge(q)

    def ours_single() -> float:
        t0 = time.perf_counter()
        for i in range(single_n):
            pub_topic.send({"i": i, "op": "bench"})
        return time.perf_counter() - t0

    def ours_batch() -> float:
        bodies = [{"i": i, "op": "bench"} for i in range(batch_n)]
        t0 = time.perf_counter()
        results = pub_topic.send_many(bodies)
        seconds = time.perf_counter() - t0
        assert len(results) == batch_n
        return seconds

    timings: dict[str, list[float]] = {"os": [], "rs": [], "ob": [], "rb": []}
    steps = [
        ("os", single_n, ours_single),
        ("rs", single_n + 1, lambda: raw_single_publish(exchange, "bench.pub", single_n)),
        ("ob", batch_n, ours_batch),
        ("rb", batch_n, lambda: raw_batch_publish(exchange, "bench.pub", batch_n)),
    ]
    for rnd in range(ROUNDS):
        order = steps if rnd % 2 == 0 else [steps[1], steps[0], steps[3], steps[2]]
        for key, expect, step in order:
            timings[key].append(step())
            wait_depth(q, expect)  # every message confirmed is in the queue
            purge(q)
    med = {k: statistics.median(v) for k, v in timings.items()}
    os_, rs = single_n / med["os"], single_n / med["rs"]
    ob, rb = batch_n / med["ob"], batch_n / med["rb"]
    note = f"median of {ROUNDS} alternating rounds"
    return [
        Row(
            "Topic.send, one at a time (confirmed)",
            os_,
            rs,
            "msg/s",
            "≥ 0.90× raw",
            os_ / rs >= 0.9,
            note=note,
        ),
        Row(
            f"Topic.send_many, {batch_n:,} msgs (pipelined confirms)",
            ob,
            rb,
            "msg/s",
            "",
            None,
            note=note,
        ),
        Row("send_many ÷ Topic.send", ob / os_, rb / rs, "×", "ours ≥ 10×", ob / os_ >= 10),
    ]


# 3. Retry path ---------------------------------------------------------------------------
def retry(run: Run) -> list[Row]:
    """Failures handled per second, ours and raw, in alternating rounds (median shown)."""
    from django_rmq_retry.conf import current_plan
    from django_rmq_retry.registry import default_registry

    n = 2_000 if run.quick else 5_000
    ours_q = queue_name("bench_retry")
    raw_q = declare_raw_queue(run, "retry", "bench.rawretry")
    raw_delay = declare_raw_queue(run, "retrydelay", None, **{"x-message-ttl": 600_000})
    delay_queues = [
        q.name for q in current_plan(default_registry.all()).queues if ".delay." in q.name
    ]
    ours_s: list[float] = []
    raw_s: list[float] = []
    for rnd in range(ROUNDS):
        publish_bodies("bench.retry", n)
        publish_bodies("bench.rawretry", n)
        wait_depth(ours_q, n)
        wait_depth(raw_q, n)
        steps = [
            lambda: ours_s.append(ours_consume(run, "bench_retry", n).seconds),
            lambda: raw_s.append(raw_consume(run, "retry", raw_q, n, extra=raw_delay).seconds),
        ]
        for step in in_turn(steps, rnd):
            step()
        ensure_empty(ours_q, raw_q)
        held = sum(depth(q) for q in delay_queues)
        if held != n or depth(raw_delay) != n:
            raise RuntimeError(f"retry copies: ours {held}, raw {depth(raw_delay)}, expected {n}")
        for q in [*delay_queues, raw_delay]:
            purge(q)
    ro, rr = n / statistics.median(ours_s), n / statistics.median(raw_s)
    return [
        Row(
            f"retry path, failures handled/s ({n:,})",
            ro,
            rr,
            "msg/s",
            "≥ 0.80× raw",
            ro / rr >= 0.8,
            note=f"median of {ROUNDS} alternating rounds",
        )
    ]


# 4. Delay accuracy -----------------------------------------------------------------------
def delay(run: Run) -> list[Row]:
    from bench.benchapp.consumers import delay_topic

    delays = (1, 3, 10) if run.quick else (1, 5, 30)
    per = 30 if run.quick else 60
    bodies = [{"i": i, "delay": d} for i in range(per) for d in delays]  # interleaved
    # One message per delay first, through the same levels, not counted: the run's queues
    # are new, and a freshly declared queue's first burst comes out 10-20 ms later than the
    # ones after it (RabbitMQ 3.10, measured with a raw pika client); a consumer in
    # production runs on warm queues.
    warm = [{"i": -1, "delay": d} for d in delays]
    out = run.path("delays.jsonl")
    mark = run.path("mark")
    mark.touch()
    proc = subprocess.Popen(
        manage_cmd(
            "rmq_consume",
            "bench_delay",
            "--max-messages",
            str(2 * (len(bodies) + len(warm))),
            "--no-orphans",
            "--prefetch",
            "50",
        ),
        cwd=ROOT,
        env=run.env(BENCH_DELAY_FILE=str(out), BENCH_MARK_FILE=str(mark)),
        stdout=open(run.path("ours-delay.log"), "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    delay_topic.send_many(warm)
    deadline = time.monotonic() + max(delays) + 60
    while not out.exists() or len(out.read_text().splitlines()) < len(warm):
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("the delay benchmark's warm-up messages did not come back")
        time.sleep(0.1)
    delay_topic.send_many(bodies)
    try:
        proc.wait(timeout=max(delays) + 120)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise RuntimeError("delay benchmark did not finish") from None
    records = [r for r in map(json.loads, out.read_text().splitlines()) if r["i"] != -1]
    if len(records) != len(bodies):
        raise RuntimeError(f"{len(records)} of {len(bodies)} delayed messages arrived")
    late = sorted(r["arrived"] - r["due"] for r in records)
    p50 = statistics.median(late)
    p99 = pct(late, 0.99)
    worst = {d: max(r["arrived"] - r["due"] for r in records if r["delay"] == d) for d in delays}
    from django_rmq_retry.conf import app_settings

    note = (
        f"{len(late)} msgs, delays {'/'.join(f'{d}s' for d in delays)}; min {late[0]:.2f} ms; "
        f"DELAY_LANDING_MS {app_settings.DELAY_LANDING_MS}"
    )
    per_delay = ", ".join(f"{d}s max {w:.0f}" for d, w in worst.items())
    return [
        Row("delay lateness p50", p50, None, "ms", "", None, note=note),
        Row("delay lateness p99", p99, None, "ms", "≤ 25 ms", p99 <= 25),
        Row("delay lateness max", late[-1], None, "ms", "", None, note=per_delay),
        *retry_stream(run),
    ]


def retry_stream(run: Run) -> list[Row]:
    """A steady stream whose every message is retried once after 1 s, at a rate where the
    copies the landing holds (rate × ~0.1 s) outnumber one prefetch window (20): PREFETCH
    bounds the window by default, so the copies and fresh messages behind a full window wait
    in the queue; ``SPARE_PREFETCH`` (opt-in, ``consumer/spare.py``) widens it. Lateness of
    the retries (second attempt − first failure − 1 s), median of 3 rounds."""
    from django_rmq_retry.publishing.per_thread import get_publisher

    rate, n = (700.0, 1400) if run.quick else (700.0, 3000)
    delays: dict[int, float | None] = dict.fromkeys(range(n), 1.0)
    publisher = get_publisher()
    rounds: list[tuple[float, float, float]] = []
    for rnd in range(3):
        times = run.path(f"stream-{rnd}.json")
        with ThreadPoolExecutor(1) as pool:  # the consumer runs while this thread publishes
            consumed = pool.submit(
                ours_consume, run, "bench_peer_retry", 2 * n, timeout=300,
                BENCH_TIMES_FILE=str(times),
            )  # fmt: skip
            time.sleep(3.0)  # the consumer's start-up (Django, connect, consume)
            t0, sent = time.monotonic(), 0
            while sent < n:  # batches of 10, paced to the rate
                publisher.send_bodies(
                    "bench.peerretry",
                    [{"i": i, "op": "bench", "delay": 1.0} for i in range(sent, sent + 10)],
                )
                sent += 10
                time.sleep(max(0.0, t0 + sent / rate - time.monotonic()))
            consumed.result()  # raises what the consumer's run raised
        late = list(lateness(times, delays, "retry stream").values())
        rounds.append((statistics.median(late), pct(late, 0.99), max(late)))
    ensure_empty(queue_name("bench_peer_retry"))
    figure = (
        f"retry stream: {rate:,.0f} msg/s, {n:,} msgs, each retried once after 1 s, prefetch 20"
    )
    each = "; ".join(f"{a:.1f}/{b:.1f}/{c:.1f}" for a, b, c in rounds)
    return [
        Row(
            f"{figure}: lateness {label}",
            statistics.median(r[i] for r in rounds),
            None,
            "ms",
            "",
            None,
            note=f"median of 3 rounds (p50/p99/max each: {each})" if i == 0 else "",
        )
        for i, label in enumerate(("p50", "p99", "max"))
    ]


# 5. Parking and requeue ------------------------------------------------------------------
def _db_count(run: Run, db: str, table: str) -> int:
    out = subprocess.run(
        [sys.executable, "-m", "bench.dbtool", "count", table],
        cwd=ROOT,
        env=run.env(db),
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.strip().splitlines()[-1])


def parking(run: Run) -> list[Row]:
    """Receivers that fail at once (``Reject``): every message parked, its row committed
    before its ack. Against the raw twin (INSERT + COMMIT per message, then ack) and, on
    PostgreSQL with ``CONN_MAX_AGE=300``, against our own happy path over as many messages
    in the same run (a flood of failures should park at the pace messages are handled).

    The row #14 targets (PostgreSQL, ``CONN_MAX_AGE=300``) in ``ROUNDS`` rounds, the order
    of ours, the twin and the happy path alternating, medians taken (each round's figures in the
    notes); the other rows once.
    """
    from django_rmq_retry.models import ParkedMessage

    n = 5_000 if run.quick else 20_000
    rows = []
    table = ParkedMessage._meta.db_table

    def park(db: str, label: str, max_age: str, threads: str, twin: bool) -> float:
        """One consumer parks ``n`` messages; ours is checked by the rows it added."""
        if twin:  # (its own table, raw_parked; the twin stops once it counted n)
            q = declare_raw_queue(run, "park", "bench.rawpark")
            publish_bodies("bench.rawpark", n)
            wait_depth(q, n)
            timed = raw_consume(run, "park", q, n, extra=run.db_url(db))
            ensure_empty(q)
            return timed.seconds
        q = queue_name("bench_park")
        before = _db_count(run, db, table)
        publish_bodies("bench.park", n)
        wait_depth(q, n)
        timed = ours_consume(
            run,
            "bench_park",
            n,
            db=db,
            extra_args=("--threads", threads),
            BENCH_CONN_MAX_AGE=max_age,
        )
        ensure_empty(q)
        parked = _db_count(run, db, table) - before
        if parked != n:
            raise RuntimeError(f"{parked} rows parked on {label}, expected {n}")
        return timed.seconds

    def happy(db: str, max_age: str) -> float:
        publish_bodies("bench.noop", n)
        wait_depth(queue_name("bench_noop"), n)
        timed = ours_consume(run, "bench_noop", n, db=db, BENCH_CONN_MAX_AGE=max_age)
        ensure_empty(queue_name("bench_noop"))
        return timed.seconds

    for db, label, max_age, threads in (
        ("sqlite", "SQLite", "0", "1"),
        ("postgres", "PostgreSQL, CONN_MAX_AGE=0", "0", "1"),
        ("postgres", "PostgreSQL, CONN_MAX_AGE=300", "300", "1"),
        ("postgres", "PostgreSQL, CONN_MAX_AGE=300, --threads 4", "300", "4"),
    ):
        main_row = label == "PostgreSQL, CONN_MAX_AGE=300"
        steps = ["ours", "twin", "happy"] if main_row else ["ours", "twin"]
        seconds: dict[str, list[float]] = {step: [] for step in steps}
        for rnd in range(ROUNDS if main_row else 1):
            for step in in_turn(steps, rnd):
                if step == "happy":
                    seconds[step].append(happy(db, max_age))
                else:
                    seconds[step].append(park(db, label, max_age, threads, step == "twin"))
        ro = n / statistics.median(seconds["ours"])
        rr = n / statistics.median(seconds["twin"])
        note = ""
        if main_row:
            note = f"medians of {ROUNDS} rounds; ours " + ", ".join(
                f"{n / s:,.0f}" for s in seconds["ours"]
            )
            note += "; twin " + ", ".join(f"{n / s:,.0f}" for s in seconds["twin"])
        rows.append(
            Row(
                f"parking, {label} ({n:,}, commit before ack)",
                ro,
                rr,
                "msg/s",
                "≥ 5,000/s" if main_row else "",
                (ro >= 5000) if main_row else None,
                note=note,
            )
        )
        if main_row:
            hp = n / statistics.median(seconds["happy"])
            ratios = ", ".join(
                f"{s_h / s_p:.2f}"
                for s_p, s_h in zip(seconds["ours"], seconds["happy"], strict=True)
            )
            rows.append(
                Row(
                    f"parking ÷ our happy path, PostgreSQL, CONN_MAX_AGE=300 ({n:,})",
                    ro / hp,
                    None,
                    "×",
                    "≥ 0.50×",
                    ro / hp >= 0.5,
                    note=f"medians of {ROUNDS} rounds; happy path {hp:,.0f} msg/s; each round's "
                    f"ratio: {ratios}",
                )
            )
    return rows


def _dbtool(run: Run, db: str, *args: str, timeout: float = 1800) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.dbtool", *args],
        cwd=ROOT,
        env=run.env(db),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if out.returncode:
        raise RuntimeError(f"dbtool {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else "{}"
    return json.loads(line)


def requeue(run: Run) -> list[Row]:
    """``parking.requeue()`` against a hand-written requeue (SQL + pika), on SQLite and
    PostgreSQL; on PostgreSQL also against ``send_many`` of the same messages (the broker's
    pace: what a requeue can reach at best), and the peak memory of a requeue of bodies of
    64 KiB (memory must stay flat for any body size).

    Ours (and, on PostgreSQL, ``send_many``) in ``ROUNDS`` alternating rounds, the median
    taken: a single pair moved the ratio between 0.53× and 0.74× on one day's runs. The hand-written
    twin once (at ~1,200 rows/s it is the longest step).
    """
    rows = []
    target_q = queue_name("bench_requeue")
    for db, label, n in (
        ("sqlite", "SQLite", 5_000 if run.quick else 20_000),
        ("postgres", "PostgreSQL", 20_000 if run.quick else 100_000),
    ):

        def timed(kind: str, db: str = db, n: int = n) -> float:
            tag = f"{kind}-{uuid.uuid4().hex[:8]}"
            _dbtool(run, db, "seed", str(n), tag)
            purge(target_q)
            res = _dbtool(run, db, kind, tag)
            if res.get("requeued") != n:
                raise RuntimeError(f"{kind} on {db}: {res}")
            wait_depth(target_q, n)
            purge(target_q)
            return float(res["seconds"])

        def send_many(db: str = db, n: int = n) -> float:
            sent = _dbtool(run, db, "sendmany", str(n))
            wait_depth(target_q, sent["sent"])
            purge(target_q)
            return float(sent["seconds"])

        ours_s: list[float] = []
        twin_s: list[float] = []
        for rnd in range(ROUNDS):
            order = ["ours", "send_many"] if db == "postgres" else ["ours"]
            for step in in_turn(order, rnd):
                if step == "ours":
                    ours_s.append(timed("requeue"))
                else:
                    twin_s.append(send_many())
        raw_s = timed("rawrequeue")
        ro, rr = n / statistics.median(ours_s), n / raw_s
        spread = ", ".join(f"{n / s:,.0f}" for s in ours_s)
        rows.append(
            Row(
                f"requeue, {label} ({n:,} rows, pipelined confirms)",
                ro,
                rr,
                "rows/s",
                "≥ 10,000/s",
                ro >= 10_000,
                note=f"median of {ROUNDS} rounds: {spread} rows/s",
            )
        )
        if db == "postgres":
            sm = n / statistics.median(twin_s)
            ratios = ", ".join(
                f"{s_sm / s_ours:.2f}" for s_ours, s_sm in zip(ours_s, twin_s, strict=True)
            )
            rows.append(
                Row(
                    f"requeue ÷ Topic.send_many, PostgreSQL ({n:,})",
                    ro / sm,
                    None,
                    "×",
                    "≥ 0.70×",
                    ro / sm >= 0.7,
                    note=f"medians of {ROUNDS} alternating rounds; send_many of the same "
                    f"messages: {sm:,.0f} msg/s; each round's ratio: {ratios}",
                )
            )
    # Memory: bodies of 64 KiB (fewer rows: the requeue holds a few chunks of at most
    # parking.requeue.CHUNK_BYTES, however many rows there are).
    big, size = (2_000 if run.quick else 10_000), 64 * 1024
    tag = f"requeue-{uuid.uuid4().hex[:8]}"
    _dbtool(run, "postgres", "seed", str(big), tag, str(size))
    purge(target_q)
    res = _dbtool(run, "postgres", "requeue", tag)
    if res.get("requeued") != big:
        raise RuntimeError(f"requeue of 64 KiB bodies: {res}")
    wait_depth(target_q, big)
    purge(target_q)
    rows.append(
        Row(
            f"requeue peak RSS, PostgreSQL, {big:,} rows of 64 KiB (process)",
            res["maxrss_mb"],
            None,
            "MB",
            "≤ 100 MB",
            res["maxrss_mb"] <= 100,
            note=f"before requeue {res['baseline_mb']:.0f} MB; {big / res['seconds']:,.0f} rows/s",
        )
    )
    return rows


def outbox(run: Run) -> list[Row]:
    """The outbox relay against ``send_many`` of the same messages, on PostgreSQL."""
    n = 20_000 if run.quick else 100_000
    target_q = queue_name("bench_requeue")
    purge(target_q)
    res = _dbtool(run, "postgres", "outbox", str(n))
    wait_depth(target_q, 2 * n + 10)  # the relay's n, send_many's n, the warm-up's 10
    purge(target_q)
    if res["left"]:
        raise RuntimeError(f"the relay left {res['left']} outbox rows")
    relay, twin = n / res["relay_seconds"], n / res["send_many_seconds"]
    statements = res["one_send_statements"]
    inserts = [s for s in statements if s.upper() == "INSERT"]
    return [
        Row(
            f"outbox relay, PostgreSQL ({n:,} committed rows → broker, rows deleted)",
            relay,
            twin,
            "msg/s",
            "≥ 0.8× send_many",
            relay >= 0.8 * twin,
            note="the raw column is Topic.send_many of the same bodies, same process",
        ),
        Row(
            "outbox: statements a transaction with one send adds",
            len(statements),
            None,
            "",
            "1 INSERT",
            statements == inserts and len(inserts) == 1,
            note=" ".join(statements),
        ),
    ]


# 6. Cost growth --------------------------------------------------------------------------
def growth(run: Run) -> list[Row]:
    sizes = (2_000, 20_000) if run.quick else (2_000, 20_000, 200_000)
    rows = []
    per: dict[int, tuple[Timed, Timed]] = {}
    for n in sizes:
        per[n] = run.cache.get(("happy", n)) or happy_pair(run, n)
        run.cache[("happy", n)] = per[n]
        ours, raw = per[n]
        rows.append(
            Row(
                f"cost per message at {n:,}",
                ours.seconds / n * 1e6,
                raw.seconds / n * 1e6,
                "µs",
                "",
                None,
            )
        )
        rows.append(
            Row(f"consumer peak RSS at {n:,}", ours.maxrss_mb, raw.maxrss_mb, "MB", "", None)
        )
    lo, hi = sizes[0], sizes[-1]
    cost_lo = per[lo][0].seconds / lo
    cost_hi = per[hi][0].seconds / hi
    raw_growth = (per[hi][1].seconds / hi) / (per[lo][1].seconds / lo)
    rows.append(
        Row(
            f"cost per message {hi:,} ÷ {lo:,}",
            cost_hi / cost_lo,
            raw_growth,
            "×",
            "≤ 1.3× (linear)",
            cost_hi / cost_lo <= 1.3,
        )
    )
    grow = per[hi][0].maxrss_mb - per[lo][0].maxrss_mb
    rows.append(
        Row(
            f"consumer RSS growth {lo:,} → {hi:,}",
            grow,
            per[hi][1].maxrss_mb - per[lo][1].maxrss_mb,
            "MB",
            "≤ 20 MB (flat)",
            grow <= 20,
            ratio=float("nan"),
        )
    )
    return rows


# 9. Observability overhead -----------------------------------------------------------------
#: The observability scenario's settings: (label, metrics on, BENCH_TRACING).
OBS_SETTINGS = (
    ("off", False, ""),
    ("metrics", True, ""),
    ("tracing (AlwaysOn)", False, "1"),
    ("metrics + tracing (AlwaysOn)", True, "1"),
    ("metrics + tracing (10 % sampled)", True, "0.1"),
)
#: burn() rounds of the observability scenario's working receiver (~1 ms of CPU).
OBS_BURN = 20_000


def observability(run: Run) -> list[Row]:
    """The happy and retry paths with metrics (``--metrics-port``), tracing (the SDK,
    spans dropped by the exporter) or both on, against the same consumer with both off:
    alternating rounds, medians. Tracing twice: every trace recorded (the SDK's default
    sampler: the worst case) and one in ten (``ParentBased(TraceIdRatioBased(0.1))``,
    what a busy project would set). Then a receiver that works (~1 ms of CPU a message).
    ``BENCH_OBS_N`` sets the message count (a tiny one checks it runs)."""
    import os
    import socket

    from django_rmq_retry.conf import current_plan
    from django_rmq_retry.registry import default_registry

    n = int(os.environ.get("BENCH_OBS_N") or (2_000 if run.quick else 20_000))
    n_retry = int(os.environ.get("BENCH_OBS_N") or (2_000 if run.quick else 5_000))
    n_work = int(os.environ.get("BENCH_OBS_N") or (1_000 if run.quick else 5_000))
    delay_queues = [
        q.name for q in current_plan(default_registry.all()).queues if ".delay." in q.name
    ]

    def port() -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return str(s.getsockname()[1])

    def consume(short: str, count: int, metrics: bool, tracing: str) -> float:
        extra = ("--metrics-port", port()) if metrics else ()
        env = {"BENCH_TRACING": tracing} if tracing else {}
        return ours_consume(run, short, count, extra_args=extra, **env).seconds

    rows = []
    for label, short, routing, count, retried, settings in (
        ("happy path", "bench_noop", "bench.noop", n, False, OBS_SETTINGS),
        ("retry path", "bench_retry", "bench.retry", n_retry, True, OBS_SETTINGS),
        (
            "receiver working ~1 ms",
            "bench_cpu",
            "bench.cpu",
            n_work,
            False,
            [OBS_SETTINGS[0], *OBS_SETTINGS[3:]],
        ),
    ):
        # Timed from the first call to the last (bench_retry's "count"): what observability
        # costs per message, not its exit (the metrics endpoint, the span processor's flush).
        extra = {"burn": OBS_BURN} if short == "bench_cpu" else {"count": 1} if retried else {}
        times: dict[str, list[float]] = {name: [] for name, _m, _t in settings}
        for rnd in range(ROUNDS):
            for name, metrics, tracing in in_turn(settings, rnd):
                publish_bodies(routing, count, **extra)
                wait_depth(queue_name(short), count)
                times[name].append(consume(short, count, metrics, tracing))
                ensure_empty(queue_name(short))
                if retried:
                    held = sum(depth(q) for q in delay_queues)
                    if held != count:
                        raise RuntimeError(f"retry copies: {held}, expected {count}")
                    for q in delay_queues:
                        purge(q)
        off = count / statistics.median(times["off"])
        for name, _metrics, _tracing in settings[1:]:
            rate = count / statistics.median(times[name])
            both = name.startswith("metrics + tracing")
            rows.append(
                Row(
                    f"{label}, {name} ÷ off, {count:,} msgs",
                    rate,
                    off,
                    "msg/s",
                    "≥ 0.90× off" if both else "",
                    rate / off >= 0.9 if both else None,
                    note=f"'raw': observability off; median of {ROUNDS}",
                )
            )
    return rows


# Typed receivers ------------------------------------------------------------------------
def typed(run: Run) -> list[Row]:
    """A no-op receiver typed by each library beside the same receiver untyped: CPU time
    per message through the handler, no broker (``bench/typed_cost.py``, in a process of
    its own; medians of alternating rounds)."""
    n, rounds = (3_000, 5) if run.quick else (10_000, 7)
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "typed_cost.py"),
            "--json",
            "--n",
            str(n),
            "--rounds",
            str(rounds),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=1800,
        cwd=ROOT,
    )
    per = {kind: statistics.median(v) * 1e6 for kind, v in json.loads(out.stdout).items()}
    untyped = per.pop("untyped")
    note = f"~400-byte event, {n:,} messages x {rounds} rounds; 'raw': the receiver untyped"
    return [
        Row(
            f"typed no-op receiver ({kind}), CPU per message",
            us,
            untyped,
            "µs",
            "≤ untyped + 5 µs" if kind == "msgspec" else "",
            us - untyped <= 5 if kind == "msgspec" else None,
            note=note,
        )
        for kind, us in per.items()
    ]


SCENARIOS = {
    "happy": happy,
    "publishing": publishing,
    "retry": retry,
    "delay": delay,
    "parking": parking,
    "requeue": requeue,
    "growth": growth,
    "outbox": outbox,
    "observability": observability,
    "typed": typed,
}
