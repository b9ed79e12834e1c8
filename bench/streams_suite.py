"""Streams (docs/streams.md), standalone: ``python bench/streams_suite.py [--clients N]``.

- write p50: one ``writer.write`` of a step's writer, beside a raw INSERT + COMMIT of
  the same row through Django's cursor;
  (alternated one by one, so the machine's load falls on both alike);
- items/s for one stream, and for 100 streams written at once by a bounded pool of
  threads (within the server's free connections), beside raw INSERTs;
- write->reader latency p50/p99 with N idle SSE clients (default 1,000) of one uvicorn
  process, the clients in 4 processes of their own (bench/sse_clients.py), and the
  PostgreSQL sessions that process holds and its RSS per client;
- worker_c4 (bench/durable_suite.py's burst) alone, beside a process writing a stream
  at 1,000 items/s, and beside one making as many raw INSERTs.

``--only write,many,sse,worker`` measures some of them.

It makes its own database (``BENCH_DB_NAME``, default bench_streams), prints one JSON
line of figures, and records ``uptime`` before and after.
"""

from __future__ import annotations

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


PARTS = ("write", "many", "sse", "worker")
# Items/s of the process written beside worker_c4: a stream a step writes quickly (an
# LLM's tokens come at tens per second per run; this is dozens of such runs at once).
BESIDE_RATE = 1000


def setup() -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    os.environ["BENCH_DB_NAME"] = DATABASE
    import django

    django.setup()


def running_run():
    """A run claimed as a worker claims it (running, fence 1): what a writer writes for."""
    from django_durable.models import Run

    run = Run.objects.create(
        workflow="bench_streams", status="running", fence=1, attempt=1, input={}
    )
    run.step_names = ["first", "second"]
    return run


def writer(name="default"):
    from django_durable.runtime.stream_writer import StreamWriter

    return StreamWriter(running_run(), "first", 0, name)


# The raw INSERT + COMMIT of the same row a write inserts (autocommit: the statement's
# own COMMIT), through Django's cursor.
RAW_INSERT = (
    'INSERT INTO durable_stream_item (run_id, stream, "offset", kind, value, step, attempt, '
    "written_at) VALUES (%s, %s, %s, 'value', %s::jsonb, 'first', 1, now())"
)


def pct(values, q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def measure(clients: int, parts: tuple[str, ...] = PARTS) -> dict:
    setup()
    out: dict = {}
    if "write" in parts:
        out.update(write_vs_raw())
    if "many" in parts:
        out.update(many_streams())
    if "sse" in parts:
        out.update(sse_latency(clients, writer()))
    if "worker" in parts:
        out.update(worker_beside_writes())
    return out


def write_vs_raw(n: int = 3000) -> dict:
    """``writer.write`` and the raw INSERT + COMMIT of the same row, alternated one by
    one on the same connection, so that the machine's load falls on both alike."""
    from django.db import connection

    one, raw_run = writer(), running_run()
    for _ in range(200):
        one.write({"t": "warm"})
    times, raw = [], []
    with connection.cursor() as cursor:
        for i in range(n):
            value = {"t": f"tok {i}"}
            started = time.perf_counter()
            one.write(value)
            times.append(time.perf_counter() - started)
            started = time.perf_counter()
            cursor.execute(RAW_INSERT, [raw_run.id, "raw", i, json.dumps(value)])
            raw.append(time.perf_counter() - started)
    return {
        "write_p50_ms": round(pct(times, 0.5) * 1000, 3),
        "write_p99_ms": round(pct(times, 0.99) * 1000, 3),
        "raw_insert_p50_ms": round(pct(raw, 0.5) * 1000, 3),
        "raw_insert_p99_ms": round(pct(raw, 0.99) * 1000, 3),
        "write_to_raw_p50_ratio": round(pct(times, 0.5) / pct(raw, 0.5), 2),
        "items_per_s_one_stream": round(1 / statistics.mean(times)),
        "raw_inserts_per_s": round(1 / statistics.mean(raw)),
    }


def pool_size(wanted: int = 16, spare: int = 30) -> tuple[int, int, int]:
    """How many writer threads (each one connection) to use: ``wanted``, fewer when the
    server's free connections less ``spare`` (other clients of a shared server) are
    fewer. Returns (threads, max_connections, connections open now)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('max_connections')::int"
            " - current_setting('superuser_reserved_connections')::int,"
            " (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')"
        )
        limit, used = cursor.fetchone()
    return max(1, min(wanted, limit - used - spare)), limit, used


def many_streams(streams: int = 100, per: int = 100) -> dict:
    """``streams`` streams written at once, ``per`` items each, by a bounded pool of
    threads (a connection each; each stream is one thread's, written in order), beside
    the same pool's raw INSERTs of as many rows."""
    from django.db import connection

    threads, limit, used = pool_size()
    writers = [writer() for _ in range(streams)]
    raw_runs = [running_run() for _ in range(streams)]

    def timed(work) -> float:
        barrier = threading.Barrier(threads + 1)

        def run(k: int) -> None:
            try:
                barrier.wait()
                work(k)
            finally:
                connection.close()

        pool = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
        for thread in pool:
            thread.start()
        barrier.wait()
        started = time.perf_counter()
        for thread in pool:
            thread.join()
        return streams * per / (time.perf_counter() - started)

    def write(k: int) -> None:
        mine = writers[k::threads]
        for i in range(per):
            for w in mine:
                w.write(i)

    def insert(k: int) -> None:
        mine = raw_runs[k::threads]
        with connection.cursor() as cursor:
            for i in range(per):
                for run in mine:
                    cursor.execute(RAW_INSERT, [run.id, "raw", i, json.dumps(i)])

    written, inserted = timed(write), timed(insert)
    return {
        "items_per_s_100_streams": round(written),
        "raw_inserts_per_s_100_streams": round(inserted),
        "writer_threads": threads,
        "max_connections": limit,
        "connections_open_before": used,
    }


def beside(kind: str, rate: int) -> None:
    """``--beside KIND RATE``: write up to ``rate`` items a second (a stream's writes, or
    the raw INSERTs of the same rows) on a schedule, until stdin closes; print how many
    and for how long. A process of its own, so it takes what such writes take of the
    machine and no more (it sleeps between writes)."""
    from django.db import connection

    setup()
    target = writer("beside") if kind == "stream" else running_run()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    print("ready", flush=True)
    started, count = time.monotonic(), 0
    with connection.cursor() as cursor:
        while not stop.is_set():
            due = started + count / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            if kind == "stream":
                target.write(count)
            else:
                cursor.execute(RAW_INSERT, [target.id, "raw", count, json.dumps(count)])
            count += 1
    print(json.dumps({"items": count, "seconds": time.monotonic() - started}), flush=True)


def worker_beside_writes(rounds: int = 5, runs: int = 2000) -> dict:
    """worker_c4 (bench/durable_suite.py's burst of 2,000 two-step runs, 4 threads)
    alone, beside a process writing ``BESIDE_RATE`` stream items a second, and beside one
    making as many raw INSERT + COMMITs of the same rows: in turns, ``rounds`` times,
    the median of each (the machine's load moves single bursts by +-30%). On a machine
    of 2 cores the writing process takes CPU from the worker and PostgreSQL whatever it
    writes: the stream/raw ratio says what a stream's writes cost the claim beyond that
    (locks, indexes, the runs table, the NOTIFYs)."""
    from bench.durable_suite import run_worker_burst

    figures: dict[str, list[float]] = {"alone": [], "stream": [], "raw": []}
    rates: dict[str, list[float]] = {"stream": [], "raw": []}
    for _ in range(rounds):
        figures["alone"].append(run_worker_burst("bench_two_steps", runs, 4))
        for kind in ("stream", "raw"):
            proc = subprocess.Popen(
                [sys.executable, __file__, "--beside", kind, str(BESIDE_RATE)],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                assert proc.stdout.readline().strip() == "ready"
                figures[kind].append(run_worker_burst("bench_two_steps", runs, 4))
                out, _ = proc.communicate("", timeout=60)
            finally:
                proc.kill()
            done = json.loads(out.strip().splitlines()[-1])
            rates[kind].append(done["items"] / done["seconds"])
    best = {kind: statistics.median(values) for kind, values in figures.items()}
    return {
        "worker_c4": round(best["alone"]),
        "worker_c4_beside_stream": round(best["stream"]),
        "worker_c4_beside_raw_inserts": round(best["raw"]),
        "worker_c4_stream_ratio": round(best["stream"] / best["alone"], 3),
        "worker_c4_raw_ratio": round(best["raw"] / best["alone"], 3),
        "worker_c4_stream_vs_raw": round(best["stream"] / best["raw"], 3),
        "beside_items_per_s": round(statistics.mean(rates["stream"])),
        "beside_raw_per_s": round(statistics.mean(rates["raw"])),
        "worker_c4_all": {k: [round(v) for v in vals] for k, vals in figures.items()},
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sse_latency(clients: int, w, processes: int = 4, rounds: int = 20) -> dict:
    """Write ``rounds`` items, 0.5 s apart, to a stream that ``clients`` SSE clients of
    one uvicorn process wait on; the clients run in ``processes`` processes of their
    own (bench/sse_clients.py). A sample is (when a client read the item's ``id:``
    line) - (when the write returned, i.e. after its commit), on the system's
    monotonic clock, for each client and item."""
    import queue

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
    path = f"/astreams/{w._run.id}/{w.name}/"
    before = rss()
    lines: queue.Queue = queue.Queue()
    shares = [clients // processes + (i < clients % processes) for i in range(processes)]
    readers = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "sse_clients.py"),
                "127.0.0.1",
                str(port),
                path,
                str(share),
                str(rounds - 1),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for share in shares
        if share
    ]

    def pump(reader) -> None:
        for line in reader.stdout:
            lines.put(line)

    for reader in readers:
        threading.Thread(target=pump, args=(reader,), daemon=True).start()

    def next_line(timeout: float) -> str:
        try:
            return lines.get(timeout=timeout)
        except queue.Empty:
            raise RuntimeError("the SSE clients did not answer in time") from None

    try:
        for _ in readers:
            assert next_line(300).strip() == "connected"
        time.sleep(2)  # every reader waits
        held = sessions()
        idle_rss = rss()
        committed: dict[int, float] = {}
        called: dict[int, float] = {}
        for i in range(rounds):
            called[i] = time.monotonic()
            w.write(i)
            committed[i] = time.monotonic()
            time.sleep(0.5)
        seen: dict[int, list[float]] = {}
        for _ in readers:
            for offset, times in json.loads(next_line(120)).items():
                seen.setdefault(int(offset), []).extend(times)
    finally:
        for reader in readers:
            reader.kill()
            reader.wait(10)
        proc.kill()
        proc.wait(10)
    latencies = sorted(t - committed[o] for o, times in seen.items() for t in times)
    from_call = sorted(t - called[o] for o, times in seen.items() for t in times)

    def pct(values: list[float], q: float) -> float:
        return round(values[min(len(values) - 1, int(len(values) * q))] * 1000, 1)

    return {
        "sse_clients": clients,
        "sse_client_processes": len(readers),
        "sse_sessions_held": held,
        "sse_rss_kib_per_client": round((idle_rss - before) / clients, 1),
        "write_to_reader_p50_ms": pct(latencies, 0.5),
        "write_to_reader_p99_ms": pct(latencies, 0.99),
        "write_to_reader_max_ms": pct(latencies, 1.0),
        "write_call_to_reader_p99_ms": pct(from_call, 0.99),
        "write_to_reader_samples": len(latencies),
        "write_to_reader_expected": clients * rounds,
    }


if __name__ == "__main__":
    if "--beside" in sys.argv:
        at = sys.argv.index("--beside")
        beside(sys.argv[at + 1], int(sys.argv[at + 2]))
        sys.exit(0)
    clients = int(sys.argv[sys.argv.index("--clients") + 1]) if "--clients" in sys.argv else 1000
    only = sys.argv[sys.argv.index("--only") + 1].split(",") if "--only" in sys.argv else PARTS
    if "--measure" in sys.argv:
        print(json.dumps(measure(clients, tuple(only))))
        sys.exit(0)
    print("uptime before:", uptime(), flush=True)
    prepare()
    done = subprocess.run(
        [sys.executable, __file__, "--measure", "--clients", str(clients)]
        + ["--only", ",".join(only)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
    )
    sys.stderr.write(done.stderr[-3000:])
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "no figures")
    print("uptime after:", uptime())
