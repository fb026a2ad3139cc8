"""The transport edge: the only package that imports pika.

Short-lived blocking connections for administrative work (``connection``), connections
on an event loop (``links``), publishing with confirms in flight on a link (``window``;
what every publish shares: ``confirms``), message properties encoded (``wire``), topology
declaration (``topology``), the header-decoding guard (``headerguard``: the one module
that touches pika's internals) and pika's errors translated into ours (``translate``).
pika 2.0 drops ``BlockingConnection``; a transport swap touches this package only.

Importing this package loads nothing: its names are looked up on first use (PEP 562), so
importing the app (every web worker, ``migrate``, ``shell``) neither loads pika nor changes
it. Only code that really publishes or consumes pays for pika.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .confirms import Outgoing, settled_reason
    from .connection import Channel, Connection, connect, connection_parameters, mask_url
    from .consuming import ConsumeChannel
    from .headerguard import decoding, log_features
    from .links import Link, asyncio_link, select_link
    from .window import ConfirmWindow
    from .wire import Encoded, decode_properties, encode_properties

#: Each public name and the module that defines it.
_WHERE = {
    "Outgoing": "confirms",
    "settled_reason": "confirms",
    "Channel": "connection",
    "Connection": "connection",
    "connect": "connection",
    "connection_parameters": "connection",
    "mask_url": "connection",
    "ConsumeChannel": "consuming",
    "decoding": "headerguard",
    "Link": "links",
    "asyncio_link": "links",
    "select_link": "links",
    "ConfirmWindow": "window",
    "Encoded": "wire",
    "decode_properties": "wire",
    "encode_properties": "wire",
    "log_features": "headerguard",
}

__all__ = [
    "Channel",
    "ConfirmWindow",
    "Connection",
    "ConsumeChannel",
    "Encoded",
    "Link",
    "Outgoing",
    "asyncio_link",
    "connect",
    "connection_parameters",
    "decode_properties",
    "decoding",
    "encode_properties",
    "log_features",
    "mask_url",
    "select_link",
    "settled_reason",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
