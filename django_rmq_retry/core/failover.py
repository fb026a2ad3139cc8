"""Which broker URL to try next: a cluster's nodes in turn, starting after the one just lost."""

from __future__ import annotations

from collections.abc import Sequence


def connect_order(urls: Sequence[str], after: str | None = None) -> list[str]:
    """``urls`` rotated so that the one following ``after`` comes first and ``after`` last.

    A consumer or publisher whose node went away tries every other node before that one
    again; on a first connect (``after`` is ``None`` or unknown) the configured order holds,
    so processes given the list in different orders start on different nodes.
    """
    if after is None or after not in urls:
        return list(urls)
    start = list(urls).index(after) + 1
    return [*urls[start:], *urls[:start]]
