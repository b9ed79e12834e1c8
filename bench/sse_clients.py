"""SSE clients for bench/streams_suite.py, in a process of their own (several of them):
``python bench/sse_clients.py HOST PORT PATH CLIENTS LAST_OFFSET``.

Each client is a plain HTTP/1.1 connection, and the process reads all of them in one
``epoll`` loop of non-blocking ``recv`` calls (no HTTP library, no asyncio: the
clients share the machine's two cores with the server, so the less a client costs
and the sooner it stamps what it read, the more the figure is the server's). A
client's time for an event is ``time.monotonic()`` right after the ``recv`` that
brought its ``id:`` line. The process prints ``connected`` once every client got the
response's first line (the heartbeat comment), then, once every client saw the event
of offset ``LAST_OFFSET`` (or the deadline passed), one JSON line: for each offset,
the times at which each client read its ``id:`` line. On Linux that clock is the
system's, so the writer's process compares it with its own.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import time

DEADLINE = 300.0


class Client:
    __slots__ = ("sock", "buffer", "connected", "done")

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer, self.connected, self.done = sock, b"", False, False


def main(host: str, port: int, path: str, clients: int, last: int) -> None:
    request = (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    poll = select.epoll()
    by_fd: dict[int, Client] = {}
    for _ in range(clients):
        sock = socket.create_connection((host, port), timeout=30)
        sock.sendall(request)
        sock.setblocking(False)
        by_fd[sock.fileno()] = Client(sock)
        poll.register(sock.fileno(), select.EPOLLIN)
    seen: dict[int, list[float]] = {}
    connected = done = 0
    announced = False
    deadline = time.monotonic() + DEADLINE
    while done < clients and time.monotonic() < deadline:
        for fd, _ in poll.poll(1.0):
            client = by_fd[fd]
            try:
                data = client.sock.recv(65536)
            except BlockingIOError:
                continue
            at = time.monotonic()
            if not data:
                poll.unregister(fd)
                if not client.done:
                    client.done = True
                    done += 1
                continue
            buffer = client.buffer + data
            lines = buffer.split(b"\n")
            client.buffer = lines.pop()
            for line in lines:
                if not client.connected and line.startswith(b":"):
                    client.connected = True
                    connected += 1
                elif line.startswith(b"id: "):
                    offset = int(line[4:])
                    seen.setdefault(offset, []).append(at)
                    if offset >= last and not client.done:
                        client.done = True
                        done += 1
        if not announced and connected == clients:
            announced = True
            print("connected", flush=True)
    for client in by_fd.values():
        client.sock.close()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    host, port, path, clients, last = sys.argv[1:6]
    main(host, int(port), path, int(clients), int(last))
