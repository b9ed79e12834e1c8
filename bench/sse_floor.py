"""The floor of bench/streams_suite.py's SSE latency: a bare ASGI app, no Django, no
database, that sends the same bytes to every waiting client when told to.

``GET /sse`` answers ``text/event-stream``, sends a heartbeat comment, then waits for
the next event; ``GET /fire/N`` (from the bench) makes event N (the frame a stream
reader would get: ``id:``, ``event:``, ``data:``) once and hands the same bytes to
every waiting client (each client's handler sends it, as an SSE response's body
would). What the bench measures against it is what one process of the server (its
HTTP protocol and event loop: ``--http``, ``--loop``) and the kernel take to send one
event to N sockets on this machine, whatever the application does.

Run by the bench as ``uvicorn bench.sse_floor:app``.
"""

from __future__ import annotations

import asyncio

_next: asyncio.Future | None = None


def _waiting() -> asyncio.Future:
    global _next
    if _next is None or _next.done():
        _next = asyncio.get_running_loop().create_future()
    return _next


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path.startswith("/fire/"):
        offset = int(path.rsplit("/", 1)[1])
        frame = f'id: {offset}\nevent: value\ndata: {{"t": {offset}}}\n\n'.encode()
        _waiting().set_result(frame)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
    while True:
        frame = await _waiting()
        await send({"type": "http.response.body", "body": frame, "more_body": True})
