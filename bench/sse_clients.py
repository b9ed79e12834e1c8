"""SSE clients for bench/streams_suite.py, in a process of their own (several of them):
``python bench/sse_clients.py HOST PORT PATH CLIENTS LAST_OFFSET``.

Each client is a plain HTTP/1.1 connection read line by line with asyncio (no HTTP
library: the clients share the machine's cores with the server, and the less they
cost the more the figure is the server's). The process prints ``connected`` once every
client got the response's first line (the heartbeat comment), then, once every client
saw the event of offset ``LAST_OFFSET`` (or the deadline passed), one JSON line: for
each offset, the ``time.monotonic()`` at which each client read its ``id:`` line. On
Linux that clock is the system's, so the writer's process compares it with its own.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

DEADLINE = 300.0


async def client(host: str, port: int, path: str, last: int, connected, seen) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n".encode()
    )
    first = True
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            if first and line.startswith(b":"):
                first = False
                connected()
            elif line.startswith(b"id: "):
                offset = int(line[4:])
                seen.setdefault(offset, []).append(time.monotonic())
                if offset >= last:
                    return
    finally:
        writer.close()


async def main(host: str, port: int, path: str, clients: int, last: int) -> None:
    seen: dict[int, list[float]] = {}
    count = [0]
    everyone = asyncio.Event()

    def connected() -> None:
        count[0] += 1
        if count[0] == clients:
            everyone.set()

    tasks = []
    for _ in range(clients):
        tasks.append(asyncio.create_task(client(host, port, path, last, connected, seen)))
        await asyncio.sleep(0)  # let the server accept at its pace
    await asyncio.wait_for(everyone.wait(), DEADLINE)
    print("connected", flush=True)
    await asyncio.wait(tasks, timeout=DEADLINE)
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    host, port, path, clients, last = sys.argv[1:6]
    asyncio.run(main(host, int(port), path, int(clients), int(last)))
