"""A proxy that forwards bytes and nothing else: `bench/gateway.py`'s control arm.

    python bench/byte_proxy.py LISTEN_PORT UPSTREAM_PORT

Each connection it accepts gets one to the upstream on 127.0.0.1; what either side sends is
written to the other as it arrives, and either side's close closes both. No parsing, no
billing: on a host where the client, the upstream and the proxy share the CPUs, its speed
against direct is what any extra hop costs there, the floor for Tokenshop's own ratio. It runs
on uvloop, as `tokenshop serve` does.
"""

from __future__ import annotations

import asyncio
import sys

import uvloop


class _Side(asyncio.Protocol):
    """One end of a proxied connection; `peer` is the transport its bytes go to."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: asyncio.Transport | None = None
        self.early: list[bytes] = []  # what the client sent before the upstream answered

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self.early.append(data)
        else:
            self.peer.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None:
            self.peer.close()


async def _serve(listen: int, upstream: int) -> None:
    loop = asyncio.get_running_loop()

    class Client(_Side):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            loop.create_task(self._connect())

        async def _connect(self) -> None:
            assert self.transport is not None
            try:
                upstream_transport, side = await loop.create_connection(
                    _Side, "127.0.0.1", upstream
                )
            except OSError:
                self.transport.close()
                return
            if self.transport.is_closing():  # the client left while this connected
                upstream_transport.close()
                return
            side.peer = self.transport
            for data in self.early:
                upstream_transport.write(data)
            self.peer = upstream_transport

    server = await loop.create_server(Client, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


def main() -> None:
    listen, upstream = (int(arg) for arg in sys.argv[1:3])
    uvloop.run(_serve(listen, upstream))


if __name__ == "__main__":
    main()
