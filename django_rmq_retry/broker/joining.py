"""Frames written by a select link leave joined: a few socket sends per window of
messages, not one per frame.

pika hands its transport each frame alone (a publish is three: method, header, body), and
its transport sends each piece with a system call of its own: on a publisher writing a
window of small messages, the sends are most of the CPU. pika's public extension API lets
a connection's owner supply the I/O services that make its transport
(``nbio_interface.AbstractIOServices``, here pika's own ``SelectorIOServicesAdapter``):
:class:`JoiningServices` gives each connection a transport that keeps the pieces written
between two passes of the loop and hands them over joined (:meth:`JoiningServices.flush`,
which the loop's owner calls before each pass). Nothing of pika's is read or replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pika.adapters.select_connection import IOLoop
from pika.adapters.utils import nbio_interface
from pika.adapters.utils.selector_ioloop_adapter import SelectorIOServicesAdapter

#: Pieces are joined up to this many bytes (a larger frame goes alone): no large copies.
JOIN_LIMIT = 128 * 1024


class _JoiningTransport(nbio_interface.AbstractStreamTransport):
    """Pika's transport, with the pieces written meanwhile kept until :meth:`flush`."""

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.pieces: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        self.pieces.append(data)
        self.size += len(data)

    def flush(self) -> None:
        pieces, self.pieces, self.size = self.pieces, [], 0
        write = self.transport.write
        start, joined = 0, 0
        for end, piece in enumerate(pieces):
            if joined and joined + len(piece) > JOIN_LIMIT:
                write(b"".join(pieces[start:end]))
                start, joined = end, 0
            joined += len(piece)
        if start < len(pieces):
            write(b"".join(pieces[start:]) if len(pieces) - start > 1 else pieces[start])

    def abort(self) -> None:
        self.pieces, self.size = [], 0
        self.transport.abort()

    def get_protocol(self) -> Any:
        return self.transport.get_protocol()

    def get_write_buffer_size(self) -> int:
        return int(self.transport.get_write_buffer_size()) + self.size


class _Protocol(nbio_interface.AbstractStreamProtocol):
    """Stands between pika's transport and its connection: the connection is given the
    joining transport; what the socket brings is handed on as it comes."""

    def __init__(self, protocol: Any, transports: list[_JoiningTransport]) -> None:
        self.protocol = protocol
        self.transports = transports
        self.joining: _JoiningTransport | None = None

    def connection_made(self, transport: Any) -> None:
        self.joining = _JoiningTransport(transport)
        self.transports.append(self.joining)
        self.protocol.connection_made(self.joining)

    def connection_lost(self, error: BaseException | None) -> None:
        if self.joining in self.transports:
            self.transports.remove(self.joining)
        self.protocol.connection_lost(error)

    def eof_received(self) -> bool | None:
        return bool(self.protocol.eof_received())

    def data_received(self, data: bytes) -> None:
        self.protocol.data_received(data)


class JoiningServices(SelectorIOServicesAdapter):
    """pika's I/O services over ``ioloop``, whose connections' writes wait for
    :meth:`flush` (pass it to ``SelectConnection`` as its ``custom_ioloop``)."""

    def __init__(self, ioloop: IOLoop) -> None:
        super().__init__(ioloop)
        self.transports: list[_JoiningTransport] = []

    def create_streaming_connection(
        self,
        protocol_factory: Callable[[], Any],
        sock: Any,
        on_done: Callable[[Any], None],
        ssl_context: Any = None,
        server_hostname: Any = None,
    ) -> Any:
        def standing_in() -> _Protocol:
            return _Protocol(protocol_factory(), self.transports)

        def done(result: Any) -> None:
            # The connection's owner is told of pika's connection, not of the stand-in.
            if isinstance(result, tuple):
                transport, stand_in = result
                result = (transport, stand_in.protocol)
            on_done(result)

        return super().create_streaming_connection(
            standing_in, sock, done, ssl_context, server_hostname
        )

    def flush(self) -> None:
        """Hand what every connection wrote since the last flush to its transport."""
        for transport in self.transports:
            if transport.pieces:
                transport.flush()


__all__ = ["JOIN_LIMIT", "JoiningServices"]
