"""The view-model of ``stepscope diff``: one :class:`DiffView`, built by
:mod:`stepscope.pipeline.compare`, rendered by the ``text``, ``json`` and ``html`` entries of
:data:`stepscope.report.render.VIEW_RENDERERS` (``kind`` ``"diff"``: :mod:`~stepscope.report.render.diff_text`,
:mod:`~stepscope.report.render.diff_json`, :mod:`~stepscope.report.render.diff_html`).

Plain data only: numbers, words and the sentences the pipeline wrote (the headline, where the
change comes from, the notes, the gate's message); the renderers format and escape them and
compute nothing. ``document`` is the ``--format json`` document, built by the pipeline from the
same comparison. The value formatters at the end are shared by the terminal and the HTML page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from stepscope.units import format_duration


@dataclass(frozen=True)
class Figure:
    """One figure of B against A: values, relative change, its 95 % interval, the verdict."""

    a: float | None
    b: float | None
    change: float | None
    low: float | None
    high: float | None
    verdict: str  # "faster" | "slower" | "within noise" | "no noise bound" | "failed" | "same run"
    tone: str = "neutral"  # how the verdict reads: "good", "bad", "neutral", "unsure"


@dataclass(frozen=True)
class DiffRow:
    """A row of the table: ``metric`` (``--metric``'s name), its label and unit, the figure, and
    for a part of the step its share of A's and B's step."""

    metric: str
    label: str
    unit: str  # "s", "s total", "/s", "ratio", "count"
    figure: Figure
    share_a: float | None = None
    share_b: float | None = None
    phase: bool = False  # a part of the step (indented under the step time)

    @property
    def verdict(self) -> str:
        return self.figure.verdict

    @property
    def change(self) -> float | None:
        return self.figure.change


@dataclass(frozen=True)
class RankLine:
    rank: int
    step_time: Figure
    communication: Figure


@dataclass(frozen=True)
class SetupLine:
    what: str
    a: str
    b: str


@dataclass(frozen=True)
class FindingLine:
    change: str  # "appeared" | "disappeared" | "more severe" | "less severe"
    severity: str  # the severity shown (B's, else A's), upper case
    title: str
    was: str | None  # A's severity when it changed


@dataclass(frozen=True)
class Histogram:
    """Per-step time distributions of A and B: each side's share of steady steps per bin."""

    low_s: float
    high_s: float
    shares_a: tuple[float, ...]
    shares_b: tuple[float, ...]


@dataclass(frozen=True)
class Gate:
    """``--fail-if-slower``: the metric, the threshold and the outcome."""

    metric: str
    threshold: float
    worse_by: float | None
    verdict: str
    failed: bool
    status: str  # "failed" | "passed" | "inconclusive"
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "threshold": self.threshold, "worse_by": self.worse_by,
                "verdict": self.verdict, "failed": self.failed, "status": self.status, "message": self.message}


@dataclass(frozen=True)
class OpLine:
    """One operator or kernel of a trace diff."""

    name: str
    category: str
    count_a: int
    count_b: int
    total_us_a: float
    total_us_b: float
    diff_us: float
    per_call_change: float | None


@dataclass(frozen=True)
class OpTable:
    title: str
    rows: tuple[OpLine, ...]


@dataclass(frozen=True)
class RunDiffView:
    """Two runs (or two sides of repeats) compared."""

    basis: str  # runs, steady steps, the method and the noise floor, in one line
    rows: tuple[DiffRow, ...]
    ranks: tuple[RankLine, ...]
    setup: tuple[SetupLine, ...]
    setup_more: int  # setup lines not shown on the terminal
    sources_changed: tuple[str, ...]  # local source files whose content changed (named by the setup lines too)
    top_a: str | None
    top_b: str | None
    findings: tuple[FindingLine, ...]
    notes: tuple[str, ...]
    headline: str
    origin: str | None  # where the step time's change comes from (the typical step or a few long steps)
    same_run: bool
    shares_a: dict[str, float] = field(default_factory=dict)  # the phase bars of the HTML page
    shares_b: dict[str, float] = field(default_factory=dict)
    histogram: Histogram | None = None

    def row(self, metric: str) -> DiffRow | None:
        return next((row for row in self.rows if row.metric == metric), None)


@dataclass(frozen=True)
class TraceDiffView:
    """Two traces compared (operators and kernels, HTA's TraceDiff rules)."""

    iterations_a: tuple[int, ...]
    iterations_b: tuple[int, ...]
    device: str
    step_ms_a: float | None
    step_ms_b: float | None
    step_change: float | None
    counts: dict[str, int]
    tables: tuple[OpTable, ...]  # the terminal's: largest increases, decreases, per-call, added, deleted
    ops: tuple[OpLine, ...]  # the HTML page's (at most 2000)
    op_count: int


@dataclass(frozen=True)
class DiffView:
    """What ``stepscope diff`` shows: A and B, the comparison (runs or traces), the gate."""

    kind: ClassVar[str] = "diff"
    a: str
    b: str
    runs: RunDiffView | None
    traces: TraceDiffView | None
    gate: Gate | None
    document: dict[str, Any]  # the --format json document

    def row(self, metric: str) -> DiffRow | None:
        return self.runs.row(metric) if self.runs is not None else None

    def to_dict(self) -> dict[str, Any]:
        return self.document


# -- formatting, shared by the terminal and the page -----------------------------------------------
def value_text(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit in ("s", "s total"):
        return format_duration(value)
    if unit == "/s":
        return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"
    if unit == "ratio":
        return f"{value:.1%}" if value >= 0.01 or value == 0 else f"{value * 100:.2g}%"
    return f"{value:g}"


def _percent(value: float) -> str:
    return f"{value * 100:+.0f}" if abs(value) >= 1 else f"{value * 100:+.1f}"


def change_text(figure: Figure) -> str:
    return "–" if figure.change is None else f"{_percent(figure.change)}%"


def interval_text(figure: Figure) -> str:
    if figure.low is None or figure.high is None:
        return "–"
    return f"{_percent(figure.low)}…{_percent(figure.high)}%"
