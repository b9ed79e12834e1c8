"""Streams (docs/streams.md), standalone: ``python bench/streams_suite.py [--clients N]``.

- write p50: one ``writer.write`` of a step's writer, beside a raw INSERT + COMMIT of
  the same row through Django's cursor;
  (alternated one by one, so the machine's load falls on both alike);
- items/s for one stream, and for 100 streams written at once by a bounded pool of
  threads (within the server's free connections), beside raw INSERTs;
- write->reader latency p50/p99 with N idle SSE clients (default 1,000) of one uvicorn
  process, the clients in 2 processes of their own (bench/sse_clients.py: one epoll
  loop each), for each stack of uvicorn installed (h11 + asyncio; httptools + uvloop,
  ``uvicorn[standard]``), each beside its floor: a bare ASGI app sending the same
  bytes to the same clients (bench/sse_floor.py); and the PostgreSQL sessions that
  process holds and its RSS per client;
- worker_c4 (bench/durable_suite.py's burst) alone, beside a process writing a stream
  at 50 and at 1,000 items/s, and beside one making as many raw INSERTs of the same
  rows (``worker_beside_writes`` says what is fair to compare on 2 cores, and why).

``--only write,many,sse,worker`` measures some of them. ``BENCH_SSE_PROFILE=DIR``
records the uvicorn process with py-spy during the SSE writes.

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
        # Each stack of uvicorn, the floor (bench/sse_floor.py) then Django's
        # stream_response, back to back so that the machine's load is alike.
        for http, loop in server_stacks():
            for server in ("floor", "django"):
                figures = sse_latency(clients, writer(), server=server, http=http, loop=loop)
                tag = f"{server}_{http}_{loop}"
                out.update({f"{key}.{tag}": value for key, value in figures.items()})
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
    the raw INSERTs of the same rows) on a schedule, until stdin closes; print how many,
    for how long, and the CPU seconds this process and its PostgreSQL backend used. A
    process of its own, so it takes what such writes take of the machine and no more
    (it sleeps between writes)."""
    from django.db import connection

    setup()
    target = writer("beside") if kind == "stream" else running_run()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        backend = cursor.fetchone()[0]
    print("ready", flush=True)
    cpu = _cpu_seconds(os.getpid()) + _cpu_seconds(backend)
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
    seconds = time.monotonic() - started
    cpu = _cpu_seconds(os.getpid()) + _cpu_seconds(backend) - cpu
    print(json.dumps({"items": count, "seconds": seconds, "cpu": cpu}), flush=True)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (PostgreSQL runs on this
    machine: its backend's are readable too)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The paces of the writing process beside worker_c4: an LLM's tokens for one run (tens
# a second), and a thousand a second (dozens of such runs at once).
BESIDE_RATES = (50, 1000)


def worker_beside_writes(rounds: int = 5, runs: int = 2000) -> dict:
    """worker_c4 (bench/durable_suite.py's burst of 2,000 two-step runs, 4 threads)
    alone, and beside a process writing a stream at each of ``BESIDE_RATES`` items a
    second, and beside one making as many raw INSERT + COMMITs of the same rows (the
    control: the same rows, no stream), in turns, ``rounds`` times; the median of each
    (the machine's load moves single bursts by +-30%).

    What is fair: the worker and PostgreSQL take both cores of this machine, so any
    process beside them takes CPU from the worker in proportion to what it does,
    whatever it is (``*_cpu_share``: the writing process's and its backend's CPU
    seconds per second, against the machine's 2). At a token pace (50 a second) a
    stream's writer takes ~1% of the machine: the ratio to alone is the target
    (>= 0.95x). At 1,000 a second it takes a share that no design of the write avoids
    on 2 cores: there the ratio to the raw INSERTs of the same rows at the same pace
    says what the stream costs the claim beyond storing its rows (locks, the stream
    row, the NOTIFYs)."""
    from bench.durable_suite import run_worker_burst

    kinds = [(kind, rate) for rate in BESIDE_RATES for kind in ("stream", "raw")]
    figures: dict[str, list[float]] = {"alone": [], **{f"{k}_{r}": [] for k, r in kinds}}
    rates: dict[str, list[float]] = {f"{k}_{r}": [] for k, r in kinds}
    cpu: dict[str, list[float]] = {f"{k}_{r}": [] for k, r in kinds}
    for _ in range(rounds):
        figures["alone"].append(run_worker_burst("bench_two_steps", runs, 4))
        for kind, rate in kinds:
            proc = subprocess.Popen(
                [sys.executable, __file__, "--beside", kind, str(rate)],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": _pythonpath()},
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            )  # fmt: skip
            try:
                assert proc.stdout.readline().strip() == "ready"
                figures[f"{kind}_{rate}"].append(run_worker_burst("bench_two_steps", runs, 4))
                out, _ = proc.communicate("", timeout=60)
            finally:
                proc.kill()
            done = json.loads(out.strip().splitlines()[-1])
            rates[f"{kind}_{rate}"].append(done["items"] / done["seconds"])
            cpu[f"{kind}_{rate}"].append(done["cpu"] / done["seconds"] / 2)
    best = {key: statistics.median(values) for key, values in figures.items()}
    out: dict = {"worker_c4": round(best["alone"])}
    for rate in BESIDE_RATES:
        stream, raw = best[f"stream_{rate}"], best[f"raw_{rate}"]
        mean = {key: statistics.mean(values[f"{kind}_{rate}"]) for key, values, kind in (
            ("items", rates, "stream"), ("raw", rates, "raw"),
            ("cpu", cpu, "stream"), ("raw_cpu", cpu, "raw"),
        )}  # fmt: skip
        out.update(
            {
                f"worker_c4_beside_stream_{rate}": round(stream),
                f"worker_c4_beside_raw_{rate}": round(raw),
                f"worker_c4_stream_{rate}_ratio": round(stream / best["alone"], 3),
                f"worker_c4_raw_{rate}_ratio": round(raw / best["alone"], 3),
                f"worker_c4_stream_{rate}_vs_raw": round(stream / raw, 3),
                f"beside_stream_{rate}_items_per_s": round(mean["items"]),
                f"beside_raw_{rate}_per_s": round(mean["raw"]),
                f"beside_stream_{rate}_cpu_share": round(mean["cpu"], 3),
                f"beside_raw_{rate}_cpu_share": round(mean["raw_cpu"], 3),
            }
        )
    out["worker_c4_all"] = {k: [round(v) for v in vals] for k, vals in figures.items()}
    return out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _pythonpath() -> str:
    """The checkout first, then whatever PYTHONPATH the bench was started with."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def server_stacks() -> list[tuple[str, str]]:
    """The (http, loop) stacks of uvicorn to measure: pure Python (h11, asyncio), and
    ``uvicorn[standard]``'s (httptools, uvloop) where installed: what a deployment of
    an ASGI server for many SSE clients runs (docs/streams.md, "Deployment")."""
    stacks = [("h11", "asyncio")]
    if _has("httptools") and _has("uvloop"):
        stacks.append(("httptools", "uvloop"))
    return stacks


def sse_latency(
    clients: int,
    w,
    processes: int = 2,
    rounds: int = 20,
    *,
    server: str = "django",
    http: str = "h11",
    loop: str = "asyncio",
) -> dict:
    """Write ``rounds`` items, 0.5 s apart, to a stream that ``clients`` SSE clients of
    one uvicorn process (``--http``, ``--loop``) wait on; the clients run in
    ``processes`` processes of their own (bench/sse_clients.py). A sample is (when a
    client read the item's ``id:`` line) - (when the write returned, i.e. after its
    commit), on the system's monotonic clock, for each client and item.

    ``server="floor"``: the same clients and rounds against bench/sse_floor.py (no
    Django, no database: one frame handed to every client when the bench asks), the
    sample from just before the bench's request: what this machine's server process
    and kernel take to send one event to ``clients`` sockets."""
    import queue

    from django.db import connection

    port, app = _free_port(), f"bench-sse-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DURABLE_TEST_DB": "postgres",
        "DURABLE_SUBPROCESS_DB_NAME": DATABASE,
        "DURABLE_APPLICATION_NAME": app,
        "PYTHONPATH": _pythonpath(),
    }
    target = "bench.sse_floor:app" if server == "floor" else "tests.asgi:application"
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", target, "--port", str(port),
         "--http", http, "--loop", loop,
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

    def fire(offset: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(f"GET /fire/{offset} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            sock.recv(1024)

    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    path = "/sse" if server == "floor" else f"/astreams/{w._run.id}/{w.name}/"  # a new run
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
        held = sessions() if server != "floor" else 0
        idle_rss = rss()
        committed: dict[int, float] = {}
        called: dict[int, float] = {}
        profile, spy = os.environ.get("BENCH_SSE_PROFILE"), None  # py-spy's output folder
        if profile:
            spy = subprocess.Popen(
                ["py-spy", "record", "-p", str(proc.pid), "-r", "250", "-f", "raw",
                 "-d", str(int(rounds * 0.5) + 2), "-o", f"{profile}/{server}_{http}.txt"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            time.sleep(1)
        for i in range(rounds):
            offset = i
            called[offset] = time.monotonic()
            if server == "floor":
                fire(offset)
            else:
                w.write(i)
            committed[offset] = time.monotonic() if server != "floor" else called[offset]
            time.sleep(0.5)
        if spy is not None:
            spy.wait(60)
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
    # The spread of one event: from the first client's read to the last one's.
    spreads = sorted(max(times) - min(times) for times in seen.values())
    firsts = sorted(min(times) - committed[o] for o, times in seen.items())

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
        "event_spread_p50_ms": pct(spreads, 0.5),
        "event_spread_max_ms": pct(spreads, 1.0),
        "first_reader_p50_ms": pct(firsts, 0.5),
        "first_reader_max_ms": pct(firsts, 1.0),
        # Each event's first and last client, in ms after its write.
        "by_event_first_last_ms": [
            [round((f(seen[o]) - committed[o]) * 1000) for f in (min, max)] for o in sorted(seen)
        ],
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
        env={**os.environ, "PYTHONPATH": _pythonpath()},
        capture_output=True,
        text=True,
    )
    sys.stderr.write(done.stderr[-3000:])
    print(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "no figures")
    print("uptime after:", uptime())
