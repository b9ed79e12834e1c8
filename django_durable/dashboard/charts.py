"""The overview's throughput chart: runs completed and failed per minute over the
last hour, drawn by the server as inline SVG (no script, no chart library).

The SVG holds the bars only, stretched to the width of the page
(``preserveAspectRatio="none"``: rectangles stretch well, text would not); the
axis labels and the legend are HTML around it, so they keep their size on a
390-pixel screen. Each minute is a ``<g>`` with a ``<title>`` (its time and
numbers, read by screen readers and shown on hover); the whole chart has a
title and a description, and the same numbers are in a table under it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils.timezone import localtime

from django_durable import stats

# The SVG's own coordinates: each minute is SLOT wide, the bars HEIGHT high at most.
SLOT = 10
BAR = 8
HEIGHT = 100


@dataclass(frozen=True)
class Minute:
    at: datetime
    label: str  # "14:03", in the current timezone
    completed: int
    failed: int
    x: int
    completed_y: float
    completed_height: float
    failed_y: float
    failed_height: float

    @property
    def total(self) -> int:
        return self.completed + self.failed


@dataclass(frozen=True)
class Chart:
    minutes: list[Minute]
    width: int
    height: int
    completed: int
    failed: int
    peak: int  # the most runs finished in one minute: the chart's top
    ticks: list[tuple[float, str]]  # (percent from the left, label) under the chart

    @property
    def finished(self) -> int:
        return self.completed + self.failed

    @property
    def failure_percent(self) -> float | None:
        """The failed share of the runs that completed or failed (None when none did)."""
        return 100 * self.failed / self.finished if self.finished else None

    @property
    def busy(self) -> list[Minute]:
        """The minutes in which anything finished, newest first: the table's rows."""
        return [m for m in reversed(self.minutes) if m.total]


def throughput(minutes: int = stats.THROUGHPUT_MINUTES) -> Chart:
    """The chart of ``stats.throughput(minutes)`` (one query)."""
    buckets = stats.throughput(minutes)
    peak = max((b["completed"] + b["failed"] for b in buckets), default=0)
    scale = HEIGHT / peak if peak else 0
    drawn = []
    for i, bucket in enumerate(buckets):
        done, failed = bucket["completed"], bucket["failed"]
        done_height = round(done * scale, 2)
        failed_height = round(failed * scale, 2)
        drawn.append(
            Minute(
                at=bucket["at"],
                label=localtime(bucket["at"]).strftime("%H:%M"),
                completed=done,
                failed=failed,
                x=i * SLOT + (SLOT - BAR) // 2,
                completed_y=round(HEIGHT - done_height, 2),
                completed_height=done_height,
                failed_y=round(HEIGHT - done_height - failed_height, 2),
                failed_height=failed_height,
            )
        )
    count = len(drawn)
    ticks = [(100 * i / count, drawn[i].label) for i in range(0, count, 15) if count] + [
        (100.0, "now")
    ]
    return Chart(
        minutes=drawn,
        width=count * SLOT,
        height=HEIGHT,
        completed=sum(m.completed for m in drawn),
        failed=sum(m.failed for m in drawn),
        peak=peak,
        ticks=ticks,
    )
