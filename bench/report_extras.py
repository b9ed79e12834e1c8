"""The tables of the scale suite, the many producers and the soak, put into
``docs/benchmarks.md`` between their markers (``<!-- scale:start -->`` ...)."""

from __future__ import annotations

from pathlib import Path

THROUGHPUT = [
    ("start_new_key", "start, new key"),
    ("start_duplicate", "start, duplicate"),
    ("start_handoff", "start, hand-off"),
    ("claim_execute", "claim + execute (1 step, c4)"),
]
PAGES = [
    ("keys_page_ms", "Keys page (first 50 keys)"),
    ("list_keys_small_ms", "list_keys() of a workflow of 200 keys"),
    ("runs_page_ms", "runs list, first page"),
    ("runs_page_failed_ms", "runs list, status failed"),
]


def _mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def scale_markdown(scale: dict) -> str:
    if "error" in scale:
        return f"Not measured: {scale['error']}."
    rows = scale["sizes"]
    head = " | ".join(f"{r['size']:,} runs" for r in rows)
    lines = [
        f"N={scale['n']} operations per figure; ratio: to the empty table.",
        "",
        f"| | {head} |",
        "| --- |" + " ---: |" * len(rows),
        "| table + indexes | " + " | ".join(_mb(r["table_bytes"]) for r in rows) + " |",
        "| load (generate_series + VACUUM ANALYZE) | "
        + " | ".join(f"{r['load_seconds']:,.0f} s" for r in rows)
        + " |",
    ]
    for name, label in THROUGHPUT:
        cells = [f"{r[name]:,.0f}/s ({r['ratio'].get(name, 0):.2f}x)" for r in rows]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for name, label in PAGES:
        cells = [f"{r[name]:,.1f} ms ({r['ratio'].get(name, 0):.2f}x)" for r in rows]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    statements = rows[-1].get("statements", {})
    if statements:
        said = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in statements.items())
        lines += ["", f"Statements per start at {rows[-1]['size']:,} runs: {said}."]
    return "\n".join(lines)


def producers_markdown(result: dict) -> str:
    if "error" in result:
        return f"Not measured: {result['error']}."
    outcomes = ", ".join(f"{k} {v:,}" for k, v in sorted(result["outcomes"].items()))
    errors = ", ".join(f"{k} {v}" for k, v in result["errors"].items()) or "none"
    return "\n".join(
        [
            "| figure | value |",
            "| --- | ---: |",
            f"| producer processes | {result['processes']} |",
            f"| seconds | {result['seconds']:g} |",
            f"| starts | {result['starts']:,} |",
            f"| starts/s (all producers) | {result['starts_per_s']:,.0f} |",
            f"| outcomes | {outcomes} |",
            f"| `KeyContended` retries | {result['key_contended_retries']} |",
            f"| errors | {errors} |",
            f"| keys with two holders | {result['keys_with_two_holders']} |",
            f"| hot keys started (of {result['hot_keys']}) | {result['hot_keys_started']} |",
            f"| hot keys held afterwards | {result['hot_keys_held']} "
            f"by {result['hot_key_holders']} runs |",
            f"| exactly one holder per hot key | {result['exactly_one_holder_per_hot_key']} |",
        ]
    )


def soak_markdown(soak: dict) -> str:
    if "error" in soak:
        return f"Not measured: {soak['error']}."
    s = soak["summary"]
    lines = [
        f"{soak['minutes']:g} minutes at {soak['target_rate']:g} starts/s asked "
        f"({soak['starts']:,} starts made, {soak['duplicate_share']:.0%} duplicates), "
        f"retention {soak['retention_seconds']} s, pruning every "
        f"{soak['prune_interval_seconds']} s; server: {soak.get('server', '?')}; runs table "
        f"settings: {', '.join(soak['runs_table_reloptions']) or 'the defaults'}.",
        "",
        "| minute | finished/s | claim p50 | claim p99 | table | indexes | live | dead |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in soak["per_minute"]:
        lines.append(
            f"| {row['minute']} | {row['finished_per_s']:,.0f} | {row['claim_p50_ms']} ms "
            f"| {row['claim_p99_ms']} ms | {_mb(row['table_bytes'])} | {_mb(row['index_bytes'])} "
            f"| {row['live_tuples']:,} | {row['dead_tuples']:,} |"
        )
    if s:
        lines += [
            "",
            f"Last minute over first: {s['throughput_last_over_first']}x. Table after minute "
            f"3: at most {_mb(s['table_bytes_max_from_minute_3'])}, "
            f"{_mb(s['table_bytes_at_end'])} at the end (indexes at most "
            f"{_mb(s['index_bytes_max_from_minute_3'])}); most dead tuples seen: "
            f"{s['dead_tuples_max']:,}; HOT updates: {s['hot_update_share']:.0%} of updates.",
        ]
    return "\n".join(lines)


SECTIONS = {
    "scale": scale_markdown,
    "producers": producers_markdown,
    "soak": soak_markdown,
}


def update_docs(path: Path, recorded: dict) -> None:
    """Replace the text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` for
    each suite that ran."""
    if not path.exists():
        return
    text = path.read_text()
    load = recorded["machine"]
    note = (
        f"\n_Recorded {load['date']} at commit `{load['commit']}`, load average "
        f"{load['load_average_at_start']} at the start and {load.get('load_average_at_end')} "
        f"at the end ({load['cpus']} CPUs)._\n\n"
    )
    for name, render in SECTIONS.items():
        if name not in recorded:
            continue
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        if start not in text or end not in text:
            continue
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + start + note + render(recorded[name]) + "\n" + end + tail
    path.write_text(text)
