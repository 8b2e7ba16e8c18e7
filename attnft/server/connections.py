"""What a connection may cost the server: uvicorn's h11 protocol with a deadline on a request's headers; and
uvicorn's server, telling when its sockets listen.

uvicorn closes a kept-alive connection that stays idle (``--timeout-keep-alive``), but its timer restarts
on every byte, and nothing bounds the wait for a first request: a slowloris client that sends a byte
every few seconds, or one that connects and sends nothing, holds a connection forever. Here the headers
of each request must be complete within ``header_timeout`` seconds of the connection (or of the previous
response), else the connection is closed. The body has its own deadline in the app
(:func:`attnft.server.http.classify`: 408), and ``--limit-concurrency`` caps connections and tasks (503).
"""
from __future__ import annotations

import asyncio
import socket
from typing import Callable, Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol


class HeaderDeadlineProtocol(H11Protocol):
    """H11Protocol that closes a connection whose request headers take longer than :attr:`header_timeout` s."""

    header_timeout: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline: Optional[asyncio.TimerHandle] = None
        self._waiting_after = None  # the cycle before the request whose headers are awaited
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not self._waiting_after:  # a new request's headers are in
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request on this kept-alive connection has the same deadline

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._waiting_after = self.cycle
        self._header_deadline = self.loop.call_later(self.header_timeout, self._headers_too_slow)

    def _disarm(self) -> None:
        if getattr(self, "_header_deadline", None) is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if self.transport.is_closing() or self.cycle is not self._waiting_after:
            return
        if self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE:
            self.conn.send(h11.ConnectionClosed())
        self.transport.close()


def protocol_with_deadline(seconds: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class uvicorn instantiates per connection, with a header deadline of ``seconds``."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout": float(seconds)})


class ListeningServer(uvicorn.Server):
    """uvicorn's Server that calls ``on_listening()`` once its sockets listen (after the app's start-up): a client
    that connects as soon as it is told the address is answered, not refused."""

    def __init__(self, config: uvicorn.Config, on_listening: Callable[[], None]):
        super().__init__(config)
        self.on_listening = on_listening

    async def startup(self, sockets: Optional[list[socket.socket]] = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.on_listening()
