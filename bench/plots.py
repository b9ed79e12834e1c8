"""The soak's curves as PNG files (matplotlib), one per curve, for docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

CURVES = [
    ("soak_throughput.png", "Runs finished per second", [("finished_per_s", "finished/s")]),
    (
        "soak_claim_latency.png",
        "Claim latency (start to claim), ms",
        [("claim_p50_ms", "p50"), ("claim_p99_ms", "p99")],
    ),
    (
        "soak_table_size.png",
        "Runs table and its indexes, MB",
        [("table_mb", "table"), ("index_mb", "indexes")],
    ),
    ("soak_dead_tuples.png", "Dead tuples in the runs table", [("dead_tuples", "dead tuples")]),
]


def soak_curves(soak: dict, folder: Path) -> list[str]:
    """Write one PNG per curve into ``folder``; returns the file names."""
    samples = soak.get("samples") or []
    if not samples:
        return []
    for sample in samples:
        sample["table_mb"] = sample["table_bytes"] / 2**20
        sample["index_mb"] = sample["index_bytes"] / 2**20
    folder.mkdir(parents=True, exist_ok=True)
    minutes = [s["t"] / 60 for s in samples]
    written = []
    for filename, title, series in CURVES:
        figure, axes = plt.subplots(figsize=(7, 3.2), dpi=100)
        for field, label in series:
            axes.plot(minutes, [s.get(field) for s in samples], label=label)
        axes.set_title(title)
        axes.set_xlabel("minutes")
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        if len(series) > 1:
            axes.legend()
        figure.tight_layout()
        figure.savefig(folder / filename)
        plt.close(figure)
        written.append(filename)
    return written
