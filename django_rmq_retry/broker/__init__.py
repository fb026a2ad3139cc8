"""The transport edge: the only package that imports pika.

Connections and channels (``connection``), publishing with confirms in flight
(``confirms``), message properties encoded (``wire``), frames joined (``writes``), topology
declaration (``topology``), the header-decoding guard (``headerguard``) and pika's errors
translated into ours (``errors``). pika 2.0 drops
``BlockingConnection``; a transport swap touches this package only.
"""

from .confirms import BatchOutcome, ConfirmChannel, Outgoing, Pipeline, settled_reason
from .connection import Channel, Connection, connect, connection_parameters, mask_url
from .wire import Encoded, decode_properties, encode_properties

__all__ = [
    "BatchOutcome",
    "Channel",
    "ConfirmChannel",
    "Connection",
    "Encoded",
    "Outgoing",
    "Pipeline",
    "connect",
    "connection_parameters",
    "decode_properties",
    "encode_properties",
    "mask_url",
    "settled_reason",
]
