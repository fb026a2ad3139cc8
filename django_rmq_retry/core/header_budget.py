"""The frame budget of a copy we publish: our headers never push it past ``frame_max``.

AMQP carries a message's properties (its headers included) in one content-header frame,
which the body never shares: however the body is split, the properties must fit one frame
of the connection's negotiated ``frame_max``. A message whose own headers sit near that
limit is delivered fine, but the copy we publish for a retry adds ours (attempt, route, due
time, error text...); a frame over the limit makes the broker close the whole connection
(``501 frame_too_large``), which gives back every unsettled neighbour and loops the culprit
until the delivery limit parks it. So before publishing a copy, its properties are fitted
to the frame: our optional headers shrink first (the error text is shortened, then the
failure story dropped), and a copy that still cannot fit is not published at all: the
caller parks the message at once, with :func:`too_large_detail` as its reason.

Pure: the encoded size comes from the caller (``size``), who knows the wire codec.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .envelope import RawHeaders

#: A frame's header (type, channel, size: 7 bytes) and end octet (1).
FRAME_OVERHEAD = 8
#: The content header's fixed fields before the properties: class, weight, body size.
CONTENT_HEADER_FIXED = 12
#: The shortest error text worth keeping once shortened (bytes, before the mark).
MIN_ERROR_BYTES = 32
#: What ends a shortened error text.
CUT_MARK = " [...]"


def properties_room(frame_max: int) -> int | None:
    """Bytes the encoded properties may take on a connection of ``frame_max`` (``None``:
    no limit; AMQP's 0 means the peers agreed on none)."""
    if frame_max <= 0:
        return None
    return frame_max - FRAME_OVERHEAD - CONTENT_HEADER_FIXED


def fit_headers(
    properties: Mapping[str, Any],
    room: int | None,
    size: Callable[[Mapping[str, Any]], int],
    *,
    error_header: str,
    droppable: Sequence[str],
    drop_first: Sequence[str] = (),
) -> dict[str, Any] | None:
    """``properties`` with our optional headers shrunk until ``size`` of them is at most
    ``room``; ``None`` if even without them they do not fit (the copy cannot be sent).

    The error text (``error_header``) is shortened first (to what fits, marked with
    ``CUT_MARK``; the ``drop_first`` headers go before that), then the ``droppable``
    headers go in their order (the error itself,
    then the rest of the failure story). Nothing else is touched: the caller's headers are
    the message, and the ones we need to route and count a copy are not optional.
    """
    props = dict(properties)
    if room is None or size(props) <= room:
        return props
    source = props.get("headers") or {}
    # A copy keeps the sender's entries as bytes (``RawHeaders``); only ours are shrunk.
    headers = source.copy() if isinstance(source, RawHeaders) else dict(source)
    props["headers"] = headers
    for name in drop_first:  # the least needed (the attempt history), before the error
        if headers.pop(name, None) is not None and size(props) <= room:
            return props
    error = headers.get(error_header)
    if isinstance(error, str):
        excess = size(props) - room
        encoded = error.encode("utf-8", "surrogatepass")
        keep = len(encoded) - excess - len(CUT_MARK.encode())
        if keep >= MIN_ERROR_BYTES:
            headers[error_header] = (
                encoded[:keep].decode("utf-8", "ignore") + CUT_MARK
            )  # a cut inside a character loses that character
            if size(props) <= room:
                return props
    for name in droppable:
        if headers.pop(name, None) is not None and size(props) <= room:
            return props
    return None if size(props) > room else props


def too_large_detail(frame_max: int, needed: int) -> str:
    """The parked reason of a message whose copy cannot fit a frame."""
    return (
        f"its retry copy cannot fit the broker's frame limit: frame_max {frame_max} leaves "
        f"{properties_room(frame_max)} bytes for the properties, and the message's own with "
        f"the headers a copy needs take {needed} (the error text and failure story were "
        f"dropped already)"
    )


def too_large_to_requeue(frame_max: int, needed: int) -> str:
    """Why a parked message was not requeued: its copy cannot fit a frame."""
    return (
        f"not requeued: its copy cannot fit the broker's frame limit (frame_max {frame_max} "
        f"leaves {properties_room(frame_max)} bytes for the properties; the message's own "
        f"with the headers a requeued copy needs take {needed})"
    )
