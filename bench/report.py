"""The results table: each metric with its ratio to raw PostgreSQL and to the best peer,
and the targets of the benchmark."""

from __future__ import annotations

import statistics
from pathlib import Path

SUITE_METRICS = {
    "raw": ["raw_insert", "raw_cycle_c1", "raw_cycle_c4"],
    "django-durable": [
        "start_new_key",
        "start_duplicate",
        "start_duplicate_error",
        "start_handoff",
        "start_statement",
        "start_new_key_prepared",
        "worker_c1",
        "worker_c4",
        "worker1_c4",
        "worker_c4_logged",
        "worker_c4_backlog",
        "worker_c4_flow",
        "latency_p50_ms",
        "latency_p99_ms",
    ],
    "django-durable start_many": ["start_many_new_key", "start_many_duplicate"],
    "procrastinate": [
        "procrastinate_defer_lock",
        "procrastinate_duplicate",
        "procrastinate_batch_defer",
        "procrastinate_worker_c4",
        "procrastinate_latency_p50_ms",
    ],
    "pgqueuer": [
        "pgqueuer_enqueue_dedupe",
        "pgqueuer_enqueue_unprepared",
        "pgqueuer_duplicate",
        "pgqueuer_enqueue_batch",
        "pgqueuer_worker",
    ],
    "dbos": ["dbos_start", "dbos_worker"],
    "celery": [
        "celery_delay",
        "celery_delay_setnx",
        "celery_duplicate_setnx",
        "celery_delay_once",
        "celery_duplicate_once",
        "celery_worker_c4",
        "celery_worker_c4_setnx",
        "celery_worker_c4_once",
    ],
    "django-tasks-db": ["tasksdb_enqueue", "tasksdb_worker", "tasksdb_worker_x4"],
}
ORDER = [m for suite in SUITE_METRICS.values() for m in suite]
OURS_AND_RAW = (
    SUITE_METRICS["raw"]
    + SUITE_METRICS["django-durable"]
    + SUITE_METRICS["django-durable start_many"]
)

# What each metric is compared with: the raw PostgreSQL equivalent, and the peers
# doing the same job (the best of them is the one to beat).
RAW = {
    "start_new_key": "raw_insert",
    "start_duplicate": "raw_insert",
    "start_duplicate_error": "raw_insert",
    "start_handoff": "raw_insert",
    "start_statement": "raw_insert",
    "start_new_key_prepared": "raw_insert",
    "start_many_new_key": "raw_insert",
    "start_many_duplicate": "raw_insert",
    "worker_c1": "raw_cycle_c1",
    "worker_c4": "raw_cycle_c4",
    "worker1_c4": "raw_cycle_c4",
    "worker_c4_logged": "raw_cycle_c4",
    "worker_c4_backlog": "raw_cycle_c4",
    "worker_c4_flow": "raw_cycle_c4",
    "procrastinate_defer_lock": "raw_insert",
    "procrastinate_duplicate": "raw_insert",
    "procrastinate_worker_c4": "raw_cycle_c4",
    "pgqueuer_enqueue_dedupe": "raw_insert",
    "pgqueuer_enqueue_unprepared": "raw_insert",
    "pgqueuer_duplicate": "raw_insert",
    "pgqueuer_enqueue_batch": "raw_insert",
    "procrastinate_batch_defer": "raw_insert",
    "pgqueuer_worker": "raw_cycle_c4",
    "dbos_start": "raw_insert",
    "dbos_worker": "raw_cycle_c4",
}
KEYED_STARTS = ["procrastinate_defer_lock", "pgqueuer_enqueue_dedupe", "dbos_start"]
DUPLICATES = ["procrastinate_duplicate", "pgqueuer_duplicate"]
WORKERS = ["procrastinate_worker_c4", "pgqueuer_worker", "dbos_worker"]
PEERS = {
    "start_new_key": KEYED_STARTS,
    "start_statement": KEYED_STARTS,
    "start_new_key_prepared": KEYED_STARTS,
    "start_duplicate": DUPLICATES,
    "start_duplicate_error": DUPLICATES,
    "worker_c4": WORKERS,
    "worker1_c4": WORKERS,
    "worker_c4_logged": WORKERS,
    "worker_c4_backlog": WORKERS,
    "worker_c4_flow": WORKERS,
    "latency_p50_ms": ["procrastinate_latency_p50_ms"],
    "start_many_new_key": ["pgqueuer_enqueue_batch", "procrastinate_batch_defer"],
}
# What a Django team would pick instead (Celery with Redis, django-tasks-db): ours
# against each of them, in a table of its own (they keep no key in PostgreSQL, so
# they are not "the peer doing the same job" of the table above).
DJANGO_PEERS = {
    "start_new_key": ["celery_delay", "celery_delay_setnx", "celery_delay_once", "tasksdb_enqueue"],
    "start_duplicate": ["celery_duplicate_setnx", "celery_duplicate_once"],
    "worker1_c4": [
        "celery_worker_c4",
        "celery_worker_c4_setnx",
        "celery_worker_c4_once",
        "tasksdb_worker",
        "tasksdb_worker_x4",
    ],
}
# The same protocol on both sides: a start with Django's defaults (client-side
# binding, nothing prepared) against pgqueuer's enqueue on a connection that
# prepares nothing, and the documented opt-in for prepared statements against
# pgqueuer's default (psycopg prepares a statement from its fifth call).
LIKE_FOR_LIKE = {
    "start_new_key": ["pgqueuer_enqueue_unprepared"],
    "start_new_key_prepared": ["pgqueuer_enqueue_dedupe"],
}
LOWER_IS_BETTER = {"latency_p50_ms", "latency_p99_ms", "procrastinate_latency_p50_ms"}

# (metric, factor, compared with): metric >= factor x other; "ms" targets are limits.
TARGETS = [
    ("start_new_key", 0.6, "raw_insert"),
    ("start_new_key", 1.0, "pgqueuer_enqueue_dedupe"),
    ("start_duplicate", 0.5, "raw_insert"),
    ("start_duplicate", 1.3, "procrastinate_duplicate"),
    ("worker_c4", 0.5, "raw_cycle_c4"),
    ("worker_c4", 1.5, "procrastinate_worker_c4"),
    ("worker1_c4", 0.5, "pgqueuer_worker"),
    ("worker_c4_backlog", 0.8, "worker_c4"),
    # Flow control's claim (20 flow keys, a per-key limit never reached) in a worker,
    # beside the same worker without flow keys.
    ("worker_c4_flow", 0.9, "worker_c4"),
    ("start_many_new_key", 5.0, "start_new_key"),
    ("latency_p50_ms", 5.0, "ms"),
    ("latency_p99_ms", 20.0, "ms"),
]


def value(metrics: dict, name: str) -> float | None:
    entry = metrics.get(name)
    return entry["value"] if entry else None


def ratio(metrics: dict, name: str, other: str) -> float | None:
    """``name`` over ``other``: the median of the ratios of each repeat, both measured
    minutes apart, when both have every repeat; the ratio of the medians otherwise.
    On a shared machine whose load moves between repeats, the ratio within a repeat
    is the steadier one."""
    mine, theirs = metrics.get(name), metrics.get(other)
    if not mine or not theirs or not theirs["value"]:
        return None
    pairs = list(zip(mine["runs"], theirs["runs"], strict=False))
    if len(mine["runs"]) == len(theirs["runs"]) and all(b for _a, b in pairs):
        return statistics.median(a / b for a, b in pairs)
    return mine["value"] / theirs["value"]


def best_peer(metrics: dict, name: str) -> tuple[str, float] | None:
    candidates = [(p, value(metrics, p)) for p in PEERS.get(name, [])]
    candidates = [(p, v) for p, v in candidates if v]
    if not candidates:
        return None
    pick = min if name in LOWER_IS_BETTER else max
    return pick(candidates, key=lambda c: c[1])


def targets(metrics: dict) -> list[dict]:
    rows = []
    for name, factor, other in TARGETS:
        mine = value(metrics, name)
        if other == "ms":
            met = None if mine is None else mine <= factor
            rows.append({"target": f"{name} <= {factor:g} ms", "value": mine, "met": met})
            continue
        measured = ratio(metrics, name, other)
        rows.append(
            {
                "target": f"{name} >= {factor:g} x {other}",
                "ratio": None if measured is None else round(measured, 3),
                "met": None if measured is None else measured >= factor,
            }
        )
    return rows


def _fmt(number: float | None, unit: str = "") -> str:
    if number is None:
        return "-"
    text = f"{number:,.1f}" if number < 100 else f"{number:,.0f}"
    return f"{text} {unit}".strip()


def markdown(metrics: dict, missing: dict, target_rows: list[dict]) -> str:
    lines = [
        "| metric | value | vs raw | vs best peer |",
        "| --- | ---: | ---: | --- |",
    ]
    for name in ORDER:
        if name not in metrics:
            if name in missing:
                lines.append(f"| `{name}` | missing: {missing[name]} | | |")
            continue
        entry = metrics[name]
        to_raw = ratio(metrics, name, RAW[name]) if name in RAW else None
        vs_raw = f"{to_raw:.2f}x" if to_raw is not None else ""
        peer = best_peer(metrics, name)
        to_peer = ratio(metrics, name, peer[0]) if peer else None
        vs_peer = f"{to_peer:.2f}x `{peer[0]}`" if to_peer is not None else ""
        lines.append(f"| `{name}` | {_fmt(entry['value'], entry['unit'])} | {vs_raw} | {vs_peer} |")
    lines += ["", "| target | measured | met |", "| --- | ---: | --- |"]
    for row in target_rows:
        measured = (
            _fmt(row.get("value"), "ms")
            if "value" in row
            else ("-" if row["ratio"] is None else f"{row['ratio']:.2f}x")
        )
        met = {True: "yes", False: "**no**", None: "not measured"}[row["met"]]
        lines.append(f"| {row['target']} | {measured} | {met} |")
    return "\n".join(lines)


def pairs_markdown(metrics: dict, missing: dict, pairs: dict[str, list[str]]) -> str:
    """Ours next to each peer ``pairs`` names for it, metric by metric: Celery with
    Redis and django-tasks-db (DJANGO_PEERS), or pgqueuer with the same protocol
    (LIKE_FOR_LIKE)."""
    lines = [
        "| ours | value | the peer | its value | ours / peer |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for name, peers in pairs.items():
        mine = metrics.get(name)
        for peer in peers:
            theirs = metrics.get(peer)
            if theirs is None:
                reason = missing.get(peer, "not measured")
                lines.append(f"| `{name}` | | `{peer}` | missing: {reason} | |")
                continue
            measured = ratio(metrics, name, peer) if mine else None
            lines.append(
                f"| `{name}` | {_fmt(mine['value'], mine['unit']) if mine else '-'} | `{peer}` "
                f"| {_fmt(theirs['value'], theirs['unit'])} "
                f"| {'-' if measured is None else f'{measured:.2f}x'} |"
            )
    return "\n".join(lines)


START, END = "<!-- results:start -->", "<!-- results:end -->"


def update_docs(path: Path, info: dict, table: str) -> None:
    """Put the latest table between the markers of ``docs/benchmarks.md``."""
    if not path.exists():
        return
    text = path.read_text()
    if START not in text or END not in text:
        return
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    versions = ", ".join(f"{k} {v}" for k, v in info["versions"].items() if v)
    body = (
        f"\nMeasured {info['date']} at commit `{info['commit']}`: N={info['n']}, "
        f"median of {info['repeats']}; {info['cpus']} CPUs (load average "
        f"{info['load_average_at_start'][0]} at the start), PostgreSQL {info['postgresql']}, "
        f"Python {info['python']}, {versions}.\n\n{table}\n"
    )
    path.write_text(head + START + body + END + tail)
