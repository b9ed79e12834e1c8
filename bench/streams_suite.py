"""Streams (docs/streams.md), standalone: ``python bench/streams_suite.py [--clients N]``.

- write p50: one ``writer.write`` of a step's writer, beside a raw INSERT + COMMIT of
  the same row through Django's cursor;
- items/s for one stream, and for 100 streams written at once (a thread each);
- write->reader latency p50/p99 with N idle SSE clients (default 1,000) of one uvicorn
  process, the PostgreSQL sessions that process holds and its RSS per client;
- worker_c4 (bench/durable_suite.py's burst) alone, and with a stream of 10,000 small
  items written beside it.

It makes its own database (``BENCH_DB_NAME``, default bench_streams), prints one JSON
line of figures, and records ``uptime`` before and after.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
DATABASE = os.environ.get("BENCH_DB_NAME", "bench_streams")


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def prepare() -> None:
    from bench.common import migrate, recreate_database, suite_env

    recreate_database(DATABASE)
    migrate(suite_env(DATABASE))


def measure(clients: int) -> dict:
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["BENCH_DB_NAME"] = DATABASE
    import django

    django.setup()
    import httpx
    from django.db import connection

    from bench.durable_suite import run_worker_burst
    from django_durable.models import Run
    from django_durable.runtime.stream_writer import StreamWriter

    def running_run() -> Run:
        """A run claimed as a worker claims it (running, fence 1): what a writer writes for."""
        run = Run.objects.create(
            workflow="bench_streams", status="running", fence=1, attempt=1, input={}
        )
        run.step_names = ["first", "second"]
        return run

    def writer(name="default") -> StreamWriter:
        return StreamWriter(running_run(), "first", 0, name)

    def p(values, q):
        values = sorted(values)
        return values[min(len(values) - 1, int(len(values) * q))]

    out: dict = {}
    # --- write p50 vs raw INSERT + COMMIT ---------------------------------------------
    one = writer()
    for _ in range(200):
        one.write({"t": "warm"})
    times = []
    for i in range(3000):
        started = time.perf_counter()
        one.write({"t": f"tok {i}"})
        times.append(time.perf_counter() - started)
    out["write_p50_ms"] = round(p(times, 0.5) * 1000, 3)
    out["write_p99_ms"] = round(p(times, 0.99) * 1000, 3)
    raw_run = running_run()
    raw = []
    with connection.cursor() as cursor:
        for i in range(3000):
            started = time.perf_counter()
            cursor.execute(
                'INSERT INTO durable_stream_item (run_id, stream, "offset", kind, value, '
                "step, attempt, written_at) "
                "VALUES (%s, 'raw', %s, 'value', %s::jsonb, 'first', 1, now())",
                [raw_run.id, i, json.dumps({"t": f"tok {i}"})],
            )  # autocommit: the COMMIT is the statement's own
            raw.append(time.perf_counter() - started)
    out["raw_insert_p50_ms"] = round(p(raw, 0.5) * 1000, 3)
    out["items_per_s_one_stream"] = round(1 / statistics.mean(times))
    out["raw_inserts_per_s"] = round(1 / statistics.mean(raw))

    # --- 100 streams at once ------------------------------------------------------------
    writers = [writer() for _ in range(100)]
    per = 100
    barrier = threading.Barrier(101)

    def write_many(w: StreamWriter) -> None:
        try:
            barrier.wait()
            for i in range(per):
                w.write(i)
        finally:
            connection.close()

    threads = [threading.Thread(target=write_many, args=(w,)) for w in writers]
    for t in threads:
        t.start()
    barrier.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    out["items_per_s_100_streams"] = round(100 * per / (time.perf_counter() - started))

    # --- write->reader latency with many SSE clients -------------------------------------
    out.update(sse_latency(clients, writer(), httpx))

    # --- worker_c4 with and without a stream written beside it ----------------------------
    alone = [run_worker_burst("bench_two_steps", 2000, 4) for _ in range(2)]
    beside_writer = writer("beside")
    stop = threading.Event()
    written = [0]

    def keep_writing() -> None:
        try:
            while not stop.is_set() and written[0] < 10_000:
                beside_writer.write(written[0])
                written[0] += 1
        finally:
            connection.close()

    with_stream = []
    for _ in range(2):
        written[0] = 0
        stop.clear()
        thread = threading.Thread(target=keep_writing)
        thread.start()
        with_stream.append(run_worker_burst("bench_two_steps", 2000, 4))
        stop.set()
        thread.join()
        beside_writer = writer("beside")
    out["worker_c4"] = round(max(alone))
    out["worker_c4_with_stream"] = round(max(with_stream))
    out["worker_c4_ratio"] = round(max(with_stream) / max(alone), 3)
    out["items_written_during_burst"] = written[0]
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sse_latency(clients: int, w, httpx) -> dict:
    from django.db import connection

    port, app = _free_port(), f"bench-sse-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DURABLE_TEST_DB": "postgres",
        "DURABLE_SUBPROCESS_DB_NAME": DATABASE,
        "DURABLE_APPLICATION_NAME": app,
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "tests.asgi:application", "--port", str(port),
         "--log-level", "warning", "--no-access-log", "--timeout-keep-alive", "120",
         "--backlog", str(clients * 2)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def rss() -> int:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def sessions() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app]
            )
            return cursor.fetchone()[0]

    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    url = f"http://127.0.0.1:{port}/astreams/{w._run.id}/{w.name}/"
    rounds = 20
    sent: dict[int, float] = {}
    latencies: list[float] = []
    connected = [0]
    before = rss()

    async def reader(client) -> None:
        async with client.stream("GET", url, timeout=300) as response:
            first = True
            async for line in response.aiter_lines():
                if line.startswith(":") and first:
                    first = False
                    connected[0] += 1
                elif line.startswith("id: "):
                    offset = int(line[4:])
                    latencies.append(time.monotonic() - sent[offset])
                    if offset == rounds - 1:
                        return

    async def main() -> tuple[int, int]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(limits=limits, timeout=300) as client:
            tasks = [asyncio.create_task(reader(client)) for _ in range(clients)]
            give_up = time.monotonic() + 300
            while connected[0] < clients:
                if time.monotonic() > give_up:
                    raise RuntimeError(f"{connected[0]} of {clients} connected")
                await asyncio.sleep(0.2)
            await asyncio.sleep(2)  # every reader waits
            held = await asyncio.to_thread(sessions)
            idle_rss = rss()
            for i in range(rounds):
                sent[i] = time.monotonic()
                await asyncio.to_thread(w.write, i)
                await asyncio.sleep(0.5)
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
            return held, idle_rss

    try:
        held, idle_rss = asyncio.run(main())
    finally:
        proc.kill()
        proc.wait(10)
    return {
        "sse_clients": clients,
        "sse_sessions_held": held,
        "sse_rss_kib_per_client": round((idle_rss - before) / clients, 1),
        "write_to_reader_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "write_to_reader_p99_ms": round(sorted(latencies)[int(len(latencies) * 0.99)] * 1000, 1),
        "write_to_reader_samples": len(latencies),
    }


if __name__ == "__main__":
    clients = int(sys.argv[sys.argv.index("--clients") + 1]) if "--clients" in sys.argv else 1000
    if "--measure" in sys.argv:
        print(json.dumps(measure(clients)))
        sys.exit(0)
    print("uptime before:", uptime(), flush=True)
    prepare()
    done = subprocess.run(
        [sys.executable, __file__, "--measure", "--clients", str(clients)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    sys.stderr.write(done.stderr[-3000:])
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "no figures")
    print("uptime after:", uptime())
