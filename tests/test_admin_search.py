"""The parked-message list's word search finds a page slice by slice (#16,
``parking.newest``): the same rows, in the same order, with the same count as the plain query.

The datasets put the matching rows behind newer rows that do not match (an incident of other
errors), with ties on ``parked_at`` on the slices' bounds; the slices are made a few rows
small so that a page crosses several. On SQLite the slices do not apply (the page is the
plain query's), so there the tests check only that the pages are right.
"""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_rmq_retry.admin import CappedPaginator, ParkedMessageAdmin
from django_rmq_retry.admin import changelist as admin_module
from django_rmq_retry.models import ParkedMessage
from django_rmq_retry.parking import WordsMatch, newest
from tests.test_admin import changelist_url, make_row, operator

POSTGRES = connection.vendor == "postgresql"


@pytest.fixture
def small_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slices of 3 rows (read row by row), then of 7 (or fewer, sized by the matches seen);
    pages of 5; counts capped at 20 (so a search's total is not known and the slices run,
    as at a million rows)."""
    monkeypatch.setattr(newest, "FIRST_SLICE", 3)
    monkeypatch.setattr(newest, "MAX_SLICE", 7)
    monkeypatch.setattr(newest, "SLICE_MATCHES", 1)
    monkeypatch.setattr(ParkedMessageAdmin, "list_per_page", 5)
    monkeypatch.setattr(CappedPaginator, "cap", 20)


def incident(now=None) -> dict[str, list[int]]:
    """Rows as an incident leaves them: 40 newest rows that do not match ``declined`` (in
    tie groups of 4), 29 older ones that do (tie groups of 3, one tie group shared with a
    non-matching row), 6 of them requeued; the ids of each kind."""
    now = now or timezone.now()
    rows: dict[str, list[int]] = {"other": [], "declined": []}
    for i in range(40):
        at = now - timedelta(seconds=i // 4)
        rows["other"].append(make_row(error_message=f"Order {i} does not exist", parked_at=at).pk)
    for i in range(29):
        at = now - timedelta(minutes=5, seconds=i // 3)
        status = "requeued" if i % 5 == 0 else "parked"
        row = make_row(error_message=f"card declined for payment {i}", parked_at=at, status=status)
        rows["declined"].append(row.pk)
    make_row(error_message="timed out", parked_at=now - timedelta(minutes=5, seconds=3))
    return rows


def page(client, **query: str) -> tuple[list[int], str, str, list[str]]:
    """(row ids in order, the count as shown, the page's HTML, the statements it ran)."""
    with CaptureQueriesContext(connection) as captured:
        response = client.get(changelist_url(**query))
    assert response.status_code == 200
    cl = response.context["cl"]
    html = response.content.decode()
    return [r.pk for r in cl.result_list], str(cl.result_count), html, _sqls(captured)


def _sqls(captured: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in captured.captured_queries]


def slices(sqls: list[str]) -> list[str]:
    """The statements that read a slice: the first row by row, the others from bitmaps."""
    return [s for s in sqls if "OFFSET 0) AS" in s or "AS MATERIALIZED" in s]


def plain(monkeypatch: pytest.MonkeyPatch) -> None:
    """The admin as it was: the page is a slice of the plain query."""
    monkeypatch.setattr(admin_module, "newest_first_ids", lambda *args, **kwargs: None)


def count_text(html: str) -> str:
    import re

    found = re.search(r"([\d,]+\+?) parked messages?", html)
    assert found, "the page shows no count"
    return found.group(1)


def expected(query_filter, order=("-parked_at", "-id")) -> list[int]:
    return list(
        ParkedMessage.objects.filter(query_filter).order_by(*order).values_list("pk", flat=True)
    )


@pytest.mark.django_db
def test_pages_of_a_word_only_older_rows_hold_are_those_of_the_plain_query(
    client, small_slices, monkeypatch
):
    rows = incident()
    client.force_login(operator())
    all_matches = expected(WordsMatch("error_message", "declined"))
    assert sorted(all_matches) == sorted(rows["declined"])
    pages = {}
    for p in ("1", "2", "3", "5"):  # 5: the last page, row 21 only (the cap + 1)
        ids, count, html, sqls = page(client, q="declined", p=p)
        pages[p] = (ids, count, count_text(html))
        start = (int(p) - 1) * 5
        assert ids == all_matches[start : min(start + 5, 21)], p
        if POSTGRES:
            # Page 1 needs 5 matches: 40 newer rows do not match, so 3 + 7 * 6 rows
            # (more with ties) come before the first match; a later page reads more.
            assert len(slices(sqls)) >= 6, (p, len(slices(sqls)))
            assert sum("OFFSET 0) AS" in s for s in sqls) == 1
    assert pages["1"][1:] == ("20+", "20+")  # 29 rows, counted up to 21
    plain(monkeypatch)
    for p, shown in pages.items():
        ids, count, html, sqls = page(client, q="declined", p=p)
        assert (ids, count, count_text(html)) == shown, p
        assert not slices(sqls)


@pytest.mark.django_db
def test_a_search_with_filters_and_another_order_pages_as_the_plain_query(
    client, small_slices, monkeypatch
):
    now = timezone.now()
    incident(now)
    client.force_login(operator())
    response = client.get(changelist_url(q="declined"))
    columns = list(response.context["cl"].list_display)
    at, pk = columns.index("parked_at_display"), columns.index("id")
    queries = [
        {"q": "declined", "status__exact": "parked"},  # 23 rows
        {"q": "declined payment", "status__exact": "parked", "p": "3"},
        {  # the parked-at filter's own links
            "q": "declined",
            "parked_at__gte": str(now - timedelta(minutes=5, seconds=6)),
            "parked_at__lt": str(now + timedelta(days=1)),
            "p": "2",
        },
        {"q": "declined", "o": f"-{at}.{pk}"},  # newest first, then the lowest id first
        {"q": "declined", "o": f"-{at}.{pk}", "p": "4"},
        {"q": "declined", "o": f"{at}"},  # oldest first: no slices
        {"q": "declined", "o": f"{at}", "p": "2"},
        {"q": "Order", "p": "2"},  # the newest rows match
    ]
    seen = []
    for query in queries:
        ids, count, html, sqls = page(client, **query)
        assert ids, query
        seen.append((ids, count, count_text(html)))
        assert bool(slices(sqls)) == (POSTGRES and query.get("o") != f"{at}"), query
    plain(monkeypatch)
    for query, shown in zip(queries, seen, strict=True):
        ids, count, html, _sqls = page(client, **query)
        assert (ids, count, count_text(html)) == shown, query


@pytest.mark.django_db
def test_a_total_within_the_cap_is_read_in_one_statement_and_pages_the_same(client, monkeypatch):
    incident()
    monkeypatch.setattr(ParkedMessageAdmin, "list_per_page", 5)
    client.force_login(operator())
    first, count, html, sqls = page(client, q="declined", p="2")
    assert count == "29" and count_text(html) == "29"
    if POSTGRES:  # the count is exact: every match at once, no slices
        assert len(slices(sqls)) == 1
    last, *_ = page(client, q="declined", p="6")
    plain(monkeypatch)
    assert page(client, q="declined", p="2")[0] == first
    assert page(client, q="declined", p="6")[0] == last


@pytest.mark.django_db
def test_after_the_last_slice_the_rest_comes_from_the_plain_query(
    client, small_slices, monkeypatch
):
    incident()
    monkeypatch.setattr(newest, "MAX_SLICES", 2)
    client.force_login(operator())
    ids, *_ = page(client, q="declined", p="2")
    assert ids == expected(WordsMatch("error_message", "declined"))[5:10]


@pytest.mark.django_db
@pytest.mark.parametrize("slice_matches", [newest.SLICE_MATCHES, 0])
def test_newest_first_ids_is_the_plain_querys_prefix_on_random_ties(monkeypatch, slice_matches):
    monkeypatch.setattr(newest, "FIRST_SLICE", 2)
    monkeypatch.setattr(newest, "BITMAP_SLICE", 3)  # then 12, capped at 11
    monkeypatch.setattr(newest, "MAX_SLICE", 11)
    monkeypatch.setattr(newest, "SLICE_MATCHES", slice_matches)
    rng = random.Random(16)
    now = timezone.now()
    for i in range(120):
        word = "declined" if rng.random() < 0.3 else "other"
        at = now - timedelta(seconds=rng.randrange(30))  # ~4 rows per second: many ties
        make_row(error_message=f"{word} {i}", parked_at=at)
    qs = ParkedMessage.objects.filter(WordsMatch("error_message", "declined"))
    for order in (("-parked_at", "-id"), ("-parked_at", "id"), ("-parked_at", "attempts", "-pk")):
        ordered = qs.order_by(*order)
        want = list(ordered.values_list("pk", flat=True))
        for stop in (0, 1, 5, 17, len(want), len(want) + 3):
            got = newest.newest_first_ids(ordered, stop)
            if not POSTGRES:
                assert got is None
                continue
            assert got == want[:stop], (order, stop)
            assert newest.newest_first_ids(ordered, stop, total=len(want)) == want[:stop]
    assert newest.newest_first_ids(qs.order_by("parked_at", "-id"), 5) is None
    assert newest.newest_first_ids(qs.order_by("-id"), 5) is None
