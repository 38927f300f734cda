"""Hand-drawn SVG charts for the HTML report: layout and display down-sampling only.

Every chart is a function of arrays the :class:`~stepscope.report.model.Report` already holds; it
returns SVG markup (a string) whose text parts are escaped here. Charts that share a time axis take
the same :class:`TimeAxis`, so a step and the samples taken during it line up vertically.

Down-sampling keeps peaks:

- step bars: more than ``max_bars`` steps are grouped into consecutive buckets of equal step
  count; a bucket's bar stacks its *mean* phase times, and a tick marks its *slowest* step;
- lines: more than two points per pixel column are reduced to each column's minimum and maximum,
  in the order they occurred (so an oscillation stays an oscillation and a spike stays a spike);
- heatmaps: columns are averaged into at most ``max_columns`` buckets and drawn as an embedded
  PNG (one pixel per core and bucket), which stays small however many cores there are.
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import Any
from dataclasses import dataclass
from html import escape

import numpy as np

PHASE_COLORS = {"data_wait": "#e4572e", "forward": "#4c78a8", "backward": "#72b7b2",
                "optimizer": "#b279a2", "communication": "#eeca3b", "other": "#b8b0a8", "compile": "#54a24b"}
PHASE_LABELS = {"data_wait": "data wait", "forward": "forward", "backward": "backward",
                "optimizer": "optimizer", "communication": "communication", "other": "other", "compile": "compile"}
SERIES_COLORS = ("#4c78a8", "#e4572e", "#54a24b", "#b279a2", "#eeca3b", "#72b7b2", "#ff9da6", "#9d755d")
CATEGORY_COLORS = {"Kernel": "#4c78a8", "Memcpy": "#eeca3b", "Memset": "#f2cf5b", "Communication": "#b279a2",
                   "Runtime": "#e45756", "DataLoader": "#e4572e", "CPU Exec": "#54a24b", "Other": "#b8b0a8"}

WIDTH = 1000  # drawing units of every chart's plot area
LEFT = 64  # room for the y labels
RIGHT = 12


@dataclass(frozen=True)
class TimeAxis:
    """Monotonic nanoseconds ``[start_ns, end_ns]`` mapped onto the plot's width."""

    start_ns: int
    end_ns: int

    @property
    def span_ns(self) -> float:
        return float(max(self.end_ns - self.start_ns, 1))

    def x(self, t_ns: np.ndarray | float) -> np.ndarray:
        """Plot x of each time (a 0-d array for one time: ``float(axis.x(t))``)."""
        out: np.ndarray = LEFT + (np.asarray(t_ns, dtype=np.float64) - self.start_ns) / self.span_ns * WIDTH
        return out

    def ticks(self) -> str:
        """Tick labels in seconds from the axis start (bottom of a chart)."""
        span_s = self.span_ns / 1e9
        step = _nice_step(span_s / 8)
        out = []
        value = 0.0
        while value <= span_s + 1e-12:
            x = LEFT + value / span_s * WIDTH
            out.append(f'<text x="{x:.1f}" y="12" class="tick" text-anchor="middle">{_seconds(value)}</text>')
            value += step
        return "".join(out)


def axis_svg(axis: TimeAxis) -> str:
    """A thin SVG row with the time ticks (placed under the last chart of a group)."""
    return (f'<svg class="chart axis" viewBox="0 0 {LEFT + WIDTH + RIGHT} 16" role="img" '
            f'aria-label="time axis">{axis.ticks()}</svg>')


def _nice_step(raw: float) -> float:
    if raw <= 0:
        return 1.0
    power = 10 ** np.floor(np.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return float(factor * power)
    return float(10 * power)


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 or value == 0 else f"{value:.3g} s"


def _frame(height: int, body: str, label: str, y_labels: Sequence[tuple[float, str]], css: str = "") -> str:
    """An SVG chart: horizontal grid lines with their labels, then the body."""
    grid = "".join(
        f'<line x1="{LEFT}" x2="{LEFT + WIDTH}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
        f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">{escape(text)}</text>'
        for y, text in y_labels)
    return (f'<svg class="chart {css}" viewBox="0 0 {LEFT + WIDTH + RIGHT} {height}" role="img" '
            f'aria-label="{escape(label)}">{grid}{body}</svg>')


# -- step bars -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepBars:
    """Steps as drawn: one bar per step, or per bucket of ``per_bar`` steps (means, slowest kept)."""

    start_ns: np.ndarray
    end_ns: np.ndarray
    phases: dict[str, np.ndarray]  # phase -> mean ns per bar
    slowest_ns: np.ndarray  # slowest step of each bar
    per_bar: int


def step_bars(start_ns: np.ndarray, duration_ns: np.ndarray, phases: dict[str, np.ndarray],
              max_bars: int) -> StepBars:
    """Group steps into at most ``max_bars`` bars (see the module docstring)."""
    count = len(start_ns)
    per_bar = max(1, int(np.ceil(count / max_bars))) if count else 1
    end = start_ns + duration_ns
    if per_bar == 1:
        return StepBars(start_ns, end, {name: values.astype(np.float64) for name, values in phases.items()},
                        duration_ns.astype(np.float64), 1)
    cuts = np.arange(0, count, per_bar)
    sizes = np.diff(np.r_[cuts, count])
    means = {name: np.add.reduceat(values.astype(np.float64), cuts) / sizes for name, values in phases.items()}
    return StepBars(start_ns[cuts], np.maximum.reduceat(end, cuts), means,
                    np.maximum.reduceat(duration_ns, cuts).astype(np.float64), per_bar)


def step_chart(bars: StepBars, axis: TimeAxis, marks: Sequence[tuple[int, int, str, str]] = (),
               height: int = 220) -> str:
    """Stacked phase bars on the time axis; ``marks`` are ``(start_ns, end_ns, css, label)`` bands,
    drawn behind the bars and as a strip above them (a marked step may be the tallest bar)."""
    top = 14
    plot = height - top - 4
    ymax = float(bars.slowest_ns.max()) if len(bars.slowest_ns) else 1.0
    ymax = ymax if ymax > 0 else 1.0
    scale = plot / ymax
    x0 = axis.x(bars.start_ns)
    widths = np.maximum(axis.x(bars.end_ns) - x0, 0.6)
    paths = []
    base = np.zeros(len(x0))
    for name, values in bars.phases.items():
        heights = values * scale
        ys = top + plot - base - heights
        keep = heights > 0.05
        data = "".join(f"M{x:.1f} {y:.1f}h{w:.1f}v{h:.1f}h{-w:.1f}z"
                       for x, y, w, h in zip(x0[keep], ys[keep], widths[keep], heights[keep]))
        paths.append(f'<path d="{data}" fill="{PHASE_COLORS.get(name, "#999")}" class="phase phase-{name}">'
                     f"<title>{escape(PHASE_LABELS.get(name, name))}</title></path>")
        base = base + heights
    if bars.per_bar > 1:
        ticks = "".join(f"M{x:.1f} {top + plot - slow * scale:.1f}h{w:.1f}"
                        for x, w, slow in zip(x0, widths, bars.slowest_ns))
        paths.append(f'<path d="{ticks}" class="slowest"><title>slowest step of each bar</title></path>')
    bands = []
    for start, end, css, label in marks:
        x1, x2 = float(axis.x(start)), float(axis.x(end))
        bands.append(f'<rect x="{x1:.1f}" y="{top}" width="{max(x2 - x1, 1.5):.1f}" height="{plot}" '
                     f'class="band {css}"><title>{escape(label)}</title></rect>'
                     f'<rect x="{x1:.1f}" y="{top - 9}" width="{max(x2 - x1, 2.5):.1f}" height="6" '
                     f'class="mark {css}"><title>{escape(label)}</title></rect>')
    labels = [(top + plot - frac * plot, _ms(ymax * frac)) for frac in (0.0, 0.5, 1.0)]
    return _frame(height, "".join(bands) + "".join(paths), "step time by phase over the run", labels, "steps")


def _ms(ns: float) -> str:
    ms = ns / 1e6
    return f"{ms:.0f} ms" if ms >= 10 or ms == 0 else f"{ms:.2g} ms"


def share_bar(shares: dict[str, float], colors: dict[str, str], labels: dict[str, str] | None = None,
              height: int = 26) -> str:
    """One horizontal 100 % bar of shares (legend and numbers are HTML beside it)."""
    x = 0.0
    parts = []
    for name, share in shares.items():
        if share <= 0:
            continue
        width = share * (LEFT + WIDTH + RIGHT)
        text = f"{(labels or {}).get(name, name)} {share:.1%}"
        parts.append(f'<rect x="{x:.1f}" y="0" width="{width:.1f}" height="{height}" fill="{colors.get(name, "#999")}">'
                     f"<title>{escape(text)}</title></rect>")
        x += width
    return (f'<svg class="chart share" viewBox="0 0 {LEFT + WIDTH + RIGHT} {height}" role="img" '
            f'aria-label="share of the step">{"".join(parts)}</svg>')


# -- lines -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    label: str
    t_ns: np.ndarray
    values: np.ndarray  # NaN = gap
    color: str


def min_max_points(t_ns: np.ndarray, values: np.ndarray, axis: TimeAxis,
                   columns: int = WIDTH) -> tuple[np.ndarray, np.ndarray]:
    """At most two points per pixel column: each column's min and max in the order they occurred."""
    if len(t_ns) <= 2 * columns:
        return t_ns, values
    column = np.clip(((t_ns - axis.start_ns) / axis.span_ns * columns).astype(np.int64), 0, columns - 1)
    order = np.argsort(column, kind="stable")
    column, t_sorted, v_sorted = column[order], t_ns[order], values[order]
    starts = np.flatnonzero(np.r_[True, column[1:] != column[:-1]])
    ends = np.r_[starts[1:], len(column)]
    keep = []
    filled = np.where(np.isnan(v_sorted), np.inf, v_sorted)
    for begin, finish in zip(starts, ends):
        part = filled[begin:finish]
        if np.isinf(part).all():
            keep.append(begin)
            continue
        low = begin + int(np.argmin(part))
        high = begin + int(np.argmax(np.where(np.isinf(part), -np.inf, part)))
        keep.extend(sorted({low, high}))
    index = np.array(keep, dtype=np.int64)
    return t_sorted[index], v_sorted[index]


def line_chart(lines: Sequence[Line], axis: TimeAxis, fmt: Callable[[float], str], ymax: float | None = None,
               height: int = 110, label: str = "", area: bool = False) -> str:
    """Lines over the shared time axis; NaN breaks a line."""
    top, plot = 6, height - 10
    peak = ymax
    if peak is None:
        shown = [line.values[(line.t_ns >= axis.start_ns) & (line.t_ns <= axis.end_ns)] for line in lines]
        finite = [float(np.nanmax(values)) for values in shown if np.isfinite(values).any()]
        peak = max(finite) if finite else 1.0
    peak = peak if peak and peak > 0 else 1.0
    paths = []
    for line in lines:
        inside = (line.t_ns >= axis.start_ns) & (line.t_ns <= axis.end_ns)
        t_ns, values = min_max_points(line.t_ns[inside], line.values[inside], axis)
        xs = axis.x(t_ns)
        ys = top + plot - np.clip(values / peak, 0, 1.05) * plot
        data = []
        pen_up = True
        for x, y in zip(xs, ys):
            if np.isnan(y):
                pen_up = True
                continue
            data.append(f"{'M' if pen_up else 'L'}{x:.1f} {y:.1f}")
            pen_up = False
        fill = f' fill="{line.color}" fill-opacity="0.15"' if area else ' fill="none"'
        path = "".join(data)
        if area and path:
            path = path + f"V{top + plot}H{xs[0]:.1f}Z" if not np.isnan(ys).any() else path
        paths.append(f'<path d="{path}" stroke="{line.color}"{fill} class="line">'
                     f"<title>{escape(line.label)}</title></path>")
    labels = [(top + plot, "0"), (top + plot / 2, fmt(peak / 2)), (top, fmt(peak))]
    return _frame(height, "".join(paths), label, labels, "lines")


# -- heatmap ---------------------------------------------------------------------------------------
def heatmap(t_ns: np.ndarray, values: np.ndarray, axis: TimeAxis, row_labels: Sequence[str],
            max_columns: int = 600, label: str = "") -> str:
    """Rows (e.g. cores) × time as an embedded PNG, 0 = white, 1 = dark red; NaN = grey."""
    inside = (t_ns >= axis.start_ns) & (t_ns <= axis.end_ns)
    t_ns, values = t_ns[inside], values[inside]
    rows = values.shape[1]
    if rows == 0 or not len(t_ns):
        return ""
    columns = min(max_columns, len(t_ns))
    column = np.clip(((t_ns - axis.start_ns) / axis.span_ns * columns).astype(np.int64), 0, columns - 1)
    sums = np.zeros((columns, rows))
    counts = np.zeros((columns, rows))
    known = ~np.isnan(values)
    np.add.at(sums, column, np.where(known, values, 0.0))
    np.add.at(counts, column, known)
    with np.errstate(invalid="ignore", divide="ignore"):
        grid = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan).T  # rows × columns
    image = _png(_ramp(grid))
    row_height = max(4, min(14, 160 // rows))
    height = rows * row_height + 2
    labels = "".join(f'<text x="{LEFT - 6}" y="{1 + (i + 0.5) * row_height + 3:.1f}" class="tick" '
                     f'text-anchor="end">{escape(text)}</text>'
                     for i, text in enumerate(row_labels) if rows <= 16 or i % max(1, rows // 8) == 0)
    body = (f'<image x="{LEFT}" y="1" width="{WIDTH}" height="{rows * row_height}" preserveAspectRatio="none" '
            f'href="data:image/png;base64,{image}" class="heat"/>{labels}')
    return (f'<svg class="chart heatmap" viewBox="0 0 {LEFT + WIDTH + RIGHT} {height}" role="img" '
            f'aria-label="{escape(label)}">{body}</svg>')


def _ramp(grid: np.ndarray) -> np.ndarray:
    """Share 0..1 → RGB, white through amber to dark red; NaN → light grey."""
    share = np.clip(np.nan_to_num(grid, nan=0.0), 0, 1)
    stops = np.array([[255, 255, 255], [253, 208, 120], [240, 90, 40], [128, 0, 38]], dtype=np.float64)
    position = share * (len(stops) - 1)
    low = np.floor(position).astype(int).clip(0, len(stops) - 2)
    frac = (position - low)[..., None]
    rgb = stops[low] * (1 - frac) + stops[low + 1] * frac
    rgb[np.isnan(grid)] = (225, 225, 225)
    out: np.ndarray = rgb.astype(np.uint8)
    return out


def _png(rgb: np.ndarray) -> str:
    """A base64 PNG of an (height, width, 3) uint8 array."""
    height, width, _ = rgb.shape
    raw = b"".join(b"\x00" + rgb[row].tobytes() for row in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode("ascii")


# -- categorical bars (trace overview, ranks) ------------------------------------------------------
def stacked_columns(names: Sequence[str], parts: Sequence[dict[str, float]], colors: dict[str, str],
                    fmt: Callable[[float], str], height: int = 180, label: str = "") -> str:
    """One stacked column per name (a step, a rank), evenly spaced."""
    top, plot = 8, height - 26
    totals = [sum(max(v, 0.0) for v in part.values()) for part in parts]
    peak = max(totals) if totals and max(totals) > 0 else 1.0
    count = max(len(names), 1)
    slot = WIDTH / count
    width = max(min(slot * 0.7, 80.0), 0.8)
    body = []
    for index, (name, part) in enumerate(zip(names, parts)):
        x = LEFT + index * slot + (slot - width) / 2
        base = 0.0
        for category, value in part.items():
            if value <= 0:
                continue
            h = value / peak * plot
            body.append(f'<rect x="{x:.1f}" y="{top + plot - base - h:.1f}" width="{width:.1f}" height="{h:.1f}" '
                        f'fill="{colors.get(category, "#999")}"><title>{escape(f"{name}: {category} {fmt(value)}")}'
                        "</title></rect>")
            base += h
        if count <= 40 or index % max(1, count // 20) == 0:
            body.append(f'<text x="{x + width / 2:.1f}" y="{height - 8}" class="tick" text-anchor="middle">'
                        f"{escape(_short(name, 18))}</text>")
    labels = [(top + plot, "0"), (top + plot / 2, fmt(peak / 2)), (top, fmt(peak))]
    return _frame(height, "".join(body), label, labels, "columns")


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- the critical path -----------------------------------------------------------------------------
PATH_COLORS = {"cpu": "#54a24b", "data_loading": "#e4572e", "launch_overhead": "#e45756", "kernel_gap": "#b8b0a8",
               "gpu_compute": "#4c78a8", "gpu_memory": "#eeca3b", "communication": "#b279a2", "sync_wait": "#9d755d"}
#: Path stretches drawn at most (past it, consecutive ones of one kind on a lane are merged).
MAX_PATH_RECTS = 4000


def path_timeline(spans: Sequence[tuple[str, str, str, float, float]], fmt: Callable[[float], str],
                  labels: dict[str, str], lane_height: int = 16) -> str:
    """One step's critical path on its lanes (a thread or a stream each): ``spans`` are (lane,
    kind, name, start µs, end µs), drawn in the kind's colour, with the event's name in a
    tooltip. Stretches narrower than a drawing unit are merged with their neighbours of the same
    kind on the lane."""
    if not spans:
        return ""
    t0 = min(start for *_, start, _ in spans)
    t1 = max(end for *_, end in spans)
    scale = WIDTH / (t1 - t0) if t1 > t0 else 0.0
    lanes: dict[str, int] = {}
    for lane, *_ in spans:
        lanes.setdefault(lane, len(lanes))
    merged: list[list[Any]] = []
    for lane, kind, name, start, end in sorted(spans, key=lambda item: (lanes[item[0]], item[3])):
        last = merged[-1] if merged else None
        if (last is not None and last[0] == lane and last[1] == kind
                and ((start - last[4]) * scale < 1 or len(merged) >= MAX_PATH_RECTS)):
            last[4] = max(last[4], end)
            last[5] += 1
            continue
        merged.append([lane, kind, name, start, end, 1])
    parts = []
    for lane, row in lanes.items():
        y = row * (lane_height + 4)
        parts.append(f'<text x="{LEFT - 4}" y="{y + lane_height - 4}" text-anchor="end" class="lane">'
                     f"{escape(_short(lane, 12))}</text>")
    for lane, kind, name, start, end, count in merged:
        x = LEFT + (start - t0) * scale
        width = max((end - start) * scale, 0.5)
        what = escape(name) + (f" and {count - 1} more" if count > 1 else "")
        tip = f"{what} · {escape(labels.get(kind, kind))} · {escape(fmt(end - start))}"
        parts.append(f'<rect x="{x:.2f}" y="{lanes[lane] * (lane_height + 4)}" width="{width:.2f}" '
                     f'height="{lane_height}" fill="{PATH_COLORS.get(kind, "#999")}"><title>{tip}</title></rect>')
    height = len(lanes) * (lane_height + 4)
    return (f'<svg class="chart path" viewBox="0 0 {LEFT + WIDTH + RIGHT} {height}" role="img" '
            f'aria-label="critical path of one step">{"".join(parts)}</svg>'
            f'<p class="sub">0 to {escape(fmt(t1 - t0))} from the first stretch of the path</p>')
