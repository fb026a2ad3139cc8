"""The transport edge: the only package that imports pika.

Connections and channels (``connection``), connections on an event loop (``links``),
publishing with confirms in flight (``confirms``; on a link, ``window``), message
properties encoded (``wire``), topology declaration (``topology``), the header-decoding
guard (``headerguard``), what pika lacks and we need (``pikaext``: the one module that
touches pika's internals) and pika's errors translated into ours (``errors``). pika 2.0
drops ``BlockingConnection``; a transport swap touches this package only.

Importing this package loads nothing: its names are looked up on first use (PEP 562), so
importing the app (every web worker, ``migrate``, ``shell``) neither loads pika nor changes
it. Only code that really publishes or consumes pays for pika.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .confirms import ConfirmChannel, Outgoing, settled_reason
    from .connection import Channel, Connection, connect, connection_parameters, mask_url
    from .consuming import ConsumeChannel
    from .headerguard import decoding
    from .links import Link, asyncio_link, select_link
    from .pikaext import log_features
    from .window import ConfirmWindow
    from .wire import Encoded, decode_properties, encode_properties

#: Each public name and the module that defines it.
_WHERE = {
    "ConfirmChannel": "confirms",
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
    "log_features": "pikaext",
}

__all__ = [
    "Channel",
    "ConfirmChannel",
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
