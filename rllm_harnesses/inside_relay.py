"""Run INSIDE the sandbox (standard library only, any Python 3.8+): TCP ports on the sandbox's own loopback, each
a plain byte pipe to a Unix socket the host bound in read-only. The sandbox has no network interface but its
loopback; these pipes are its only way out, and the host end of each decides what passes (relay.py).

    python3 inside_relay.py PORT=SOCKET [PORT=SOCKET ...]
"""

import asyncio
import sys


async def _pipe(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close: the other direction may still be sending
    except (ConnectionError, OSError):
        writer.close()


async def _serve(port, path):
    async def handle(reader, writer):
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True)
        up_writer.close()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port)


async def _main(pairs):
    servers = [await _serve(int(port), path) for port, path in pairs]
    try:
        await asyncio.Event().wait()
    finally:
        for server in servers:
            server.close()


if __name__ == "__main__":
    asyncio.run(_main([arg.split("=", 1) for arg in sys.argv[1:]]))
