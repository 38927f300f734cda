"""``stepscope diff`` rendered: one terminal screen, and a self-contained HTML page.

Everything that came from a record or a trace (paths, argv, environment values, operator names,
finding titles) is printed through :func:`stepscope.text.printable` on the terminal and escaped
with :func:`stepscope.report.render.html.text` in HTML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Group
from rich.table import Table
from rich.text import Text

from stepscope._version import __version__
from stepscope.analysis.compare_stats import FASTER, NO_BOUND, SLOWER, WITHIN_NOISE, Difference
from stepscope.analysis.run.diff import RunDiff
from stepscope.analysis.trace.trace_diff import OpDiff, TraceDiff
from stepscope.record.run import PHASES, RunRecord
from stepscope.text import printable
from stepscope.units import format_duration

VERDICT_STYLE = {FASTER: "green", SLOWER: "red", WITHIN_NOISE: "bright_black", NO_BOUND: "yellow", "failed": "red"}
MAX_SETUP = 20
MAX_OPS = 10


# -- formatting ------------------------------------------------------------------------------------
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


def change_text(diff: Difference) -> str:
    return "–" if diff.change is None else f"{_percent(diff.change)}%"


def interval_text(diff: Difference) -> str:
    if diff.low is None or diff.high is None:
        return "–"
    return f"{_percent(diff.low)}…{_percent(diff.high)}%"


def headline(diff: RunDiff, metric: str = "step_time") -> str:
    """One sentence: is B faster or slower, by how much, and is it beyond noise."""
    if diff.same_run:
        return "A and B are the same run: nothing was compared (every change is zero by construction)"
    row = diff.row(metric) or diff.step_time
    if row is None:
        return "nothing to compare"
    d = row.diff
    if d.change is None:
        return f"{row.label}: no comparison ({d.verdict})"
    if d.verdict in (FASTER, SLOWER):
        word = "faster" if d.verdict == FASTER else "slower"
        return (f"B is {word}: {row.label} {value_text(d.a, row.unit)} → {value_text(d.b, row.unit)} "
                f"({change_text(d)}, {interval_text(d)}: beyond noise)")
    if d.verdict == WITHIN_NOISE:
        bound = f", interval {interval_text(d)}" if d.low is not None else ""
        return f"no difference beyond noise in {row.label} ({change_text(d)}{bound})"
    return f"{row.label} {change_text(d)}, but without a noise bound ({d.verdict})"


def _basis(diff: RunDiff) -> str:
    runs = f"runs: A {diff.runs_a}, B {diff.runs_b} · " if diff.runs_a > 1 or diff.runs_b > 1 else ""
    floor = f" · noise floor {diff.floor_source}" if diff.floor_source else ""
    return f"{runs}steady steps: A {diff.steady_a}, B {diff.steady_b} · {diff.method}{floor}"


# -- terminal --------------------------------------------------------------------------------------
def render_run_diff(diff: RunDiff, metric: str = "step_time") -> Group:
    parts: list[Any] = [Text(f"stepscope diff · A {printable(diff.a)} → B {printable(diff.b)}", style="bold"),
                        Text(_basis(diff), style="bright_black")]
    table = Table(box=None, pad_edge=False, show_edge=False)
    for column, justify in (("", "left"), ("share", "right"), ("A", "right"), ("B", "right"), ("change", "right"),
                            ("95% interval", "right"), ("verdict", "left")):
        table.add_column(column, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for row in diff.rows:
        label = row.label if row.metric not in PHASES else f"  {row.label}"
        share = "" if row.share_a is None or row.share_b is None else \
            f"{row.share_a * 100:.0f}→{row.share_b * 100:.0f}%"
        d = row.diff
        table.add_row(label, share, value_text(d.a, row.unit), value_text(d.b, row.unit), change_text(d),
                      interval_text(d), Text(d.verdict, style=VERDICT_STYLE.get(d.verdict, "")))
    parts += [Text(""), table]
    if diff.ranks:
        ranks = Table(box=None, pad_edge=False, show_edge=False, title="Ranks", title_justify="left")
        for column in ("rank", "step A", "step B", "change", "comm A", "comm B", "comm verdict"):
            ranks.add_column(column)
        for rank in diff.ranks:
            ranks.add_row(str(rank.rank), value_text(rank.step_time.a, "s"), value_text(rank.step_time.b, "s"),
                          change_text(rank.step_time), value_text(rank.communication.a, "s"),
                          value_text(rank.communication.b, "s"), rank.communication.verdict)
        parts += [Text(""), ranks]
    parts += [Text(""), Text("What changed in the setup", style="bold underline")]
    if diff.setup:
        for change in diff.setup[:MAX_SETUP]:
            parts.append(Text(f"  {printable(change.what)}: {printable(change.a)} → {printable(change.b)}"))
        if len(diff.setup) > MAX_SETUP:
            parts.append(Text(f"  … and {len(diff.setup) - MAX_SETUP} more (--format json lists them all)",
                              style="bright_black"))
    else:
        parts.append(Text("  nothing stepscope records (same script, arguments, versions, loaders, threads, "
                          "environment)", style="bright_black"))
    parts += [Text(""), Text("Findings", style="bold underline")]
    for side, top in (("A", diff.top_a), ("B", diff.top_b)):
        parts.append(Text(f"  top finding of {side}: {printable(top) if top else 'none'}"))
    if diff.findings:
        for moved in diff.findings:
            severity = moved.severity_b or moved.severity_a or ""
            was = f" (was {moved.severity_a})" if moved.change in ("more severe", "less severe") else ""
            parts.append(Text(f"  {moved.change}: [{severity.upper()}] {printable(moved.title)}{was}"))
    else:
        parts.append(Text("  no finding appeared, disappeared or changed severity", style="bright_black"))
    for note in diff.notes:
        parts.append(Text(f"note: {printable(note)}", style="yellow"))
    parts += [Text(""), Text(headline(diff, metric), style="bold")]
    return Group(*parts)


def _op_label(op: OpDiff, width: int = 70) -> str:
    name = printable(op.name)
    return name if len(name) <= width else name[: width - 1] + "…"


def render_trace_diff(diff: TraceDiff, top: int = MAX_OPS) -> Group:
    parts: list[Any] = [Text(f"stepscope diff · A {printable(diff.a)} → B {printable(diff.b)}", style="bold"),
                        Text(f"iterations: A {list(diff.iterations_a)}, B {list(diff.iterations_b)} · device rows: "
                             f"{diff.device} · HTA TraceDiff rules (one trace per side: no noise bound)",
                             style="bright_black")]
    if diff.step_change is not None:
        parts.append(Text(f"ProfilerStep: {(diff.step_us_a or 0) / 1e3:.2f} ms → {(diff.step_us_b or 0) / 1e3:.2f} ms "
                          f"({diff.step_change:+.1%})", style="bold"))
    counts = diff.counts
    parts.append(Text(" · ".join(f"{count} {category}" for category, count in counts.items())))

    def table(title: str, rows: list[OpDiff]) -> Table:
        out = Table(box=None, pad_edge=False, show_edge=False, title=title, title_justify="left")
        for column, justify in (("name", "left"), ("calls A→B", "right"), ("total A", "right"), ("total B", "right"),
                                ("Δ total", "right"), ("per call", "right")):
            out.add_column(column, justify=justify)  # type: ignore[arg-type]
        for op in rows:
            per_call = "–" if op.per_call_change is None else f"{op.per_call_change:+.0%}"
            out.add_row(_op_label(op), f"{op.count_a}→{op.count_b}", f"{op.total_us_a / 1e3:.3f} ms",
                        f"{op.total_us_b / 1e3:.3f} ms", f"{op.diff_us / 1e3:+.3f} ms", per_call)
        return out

    for title, rows in (("Largest increases in total time", diff.largest_increases(top)),
                        ("Largest decreases in total time", diff.largest_decreases(top)),
                        ("Largest per-call slow-downs (≥ 10 µs in B)", diff.per_call_slowdowns(top)),
                        ("Added (only in B)", diff.added(top)), ("Deleted (only in A)", diff.deleted(top))):
        if rows:
            parts += [Text(""), table(title, rows)]
    return Group(*parts)


# -- HTML ------------------------------------------------------------------------------------------
def _phase_bar_html(shares: dict[str, float], label: str) -> str:
    from stepscope.report.render.html import text
    from stepscope.report.render.html_charts import PHASE_COLORS

    total = sum(max(0.0, shares.get(phase, 0.0)) for phase in PHASES) or 1.0
    cells = "".join(
        f'<div style="width:{max(0.0, shares.get(phase, 0.0)) / total * 100:.2f}%;background:{PHASE_COLORS[phase]}" '
        f'title="{text(phase)} {shares.get(phase, 0.0):.1%}"></div>'
        for phase in PHASES if shares.get(phase, 0.0) > 0)
    return (f'<div class="diff-bar-row"><span class="diff-bar-label">{text(label)}</span>'
            f'<div class="diff-bar">{cells}</div></div>')


def _histogram_svg(durations_a: np.ndarray, durations_b: np.ndarray, bins: int = 40) -> str:
    """Per-step time distributions of A and B as two overlaid step histograms (inline SVG)."""
    both = np.concatenate([durations_a, durations_b]) if len(durations_a) + len(durations_b) else np.zeros(1)
    low, high = float(np.percentile(both, 0.5)), float(np.percentile(both, 99.5))
    if high <= low:
        high = low + 1e-9
    edges = np.linspace(low, high, bins + 1)
    width, height = 600, 160
    shares = [np.histogram(np.clip(values, low, high), bins=edges)[0] / max(1, len(values))
              for values in (durations_a, durations_b)]
    top = max(1e-9, max(float(share.max()) for share in shares))
    paths = []
    for share, color in zip(shares, ("#4c78a8", "#e45756")):
        points = []
        for index, value in enumerate(share):
            x0, x1 = index * width / bins, (index + 1) * width / bins
            y = height - value / top * (height - 10)
            points += [f"{x0:.1f},{y:.1f}", f"{x1:.1f},{y:.1f}"]
        paths.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="0,{height} {" ".join(points)} '
                     f'{width},{height}"/>')
    axis = (f'<text x="0" y="{height + 14}" font-size="11">{low * 1e3:.2f} ms</text>'
            f'<text x="{width}" y="{height + 14}" font-size="11" text-anchor="end">{high * 1e3:.2f} ms</text>')
    return (f'<svg class="diff-hist" viewBox="0 0 {width} {height + 18}" width="{width}" height="{height + 18}" '
            f'role="img" aria-label="per-step time distributions">{"".join(paths)}{axis}</svg>')


_DIFF_CSS = """
.diff-bar-row{display:flex;align-items:center;gap:.5em;margin:.3em 0}
.diff-bar-label{width:2em;font-weight:bold}
.diff-bar{display:flex;height:1.4em;flex:1;max-width:40em;border:1px solid #ccc}
.diff-bar div{height:100%}
td.faster{color:#1a7f37}td.slower{color:#cf222e}td.noise{color:#6e7781}
.legend-a{color:#4c78a8}.legend-b{color:#e45756}
"""


def render_diff_html(diff: RunDiff | TraceDiff, *, record_a: RunRecord | None = None,
                     record_b: RunRecord | None = None) -> str:
    """The diff as one self-contained page (no network, scripts or styles from elsewhere)."""
    from stepscope.report.render.html import _asset, text

    sections = [f"<section class=\"header\"><h1>stepscope diff</h1><div class=\"sub\">A {text(diff.a)}</div>"
                f"<div class=\"sub\">B {text(diff.b)}</div></section>"]
    if isinstance(diff, RunDiff):
        sections.append(f"<section><h2>Verdict</h2><p><b>{text(headline(diff))}</b></p>"
                        f"<p class=\"sub\">{text(_basis(diff))}</p></section>")
        rows = []
        for row in diff.rows:
            d = row.diff
            css = {FASTER: "faster", SLOWER: "slower"}.get(d.verdict, "noise")
            rows.append(f"<tr><td>{text(row.label)}</td><td>{text(value_text(d.a, row.unit))}</td>"
                        f"<td>{text(value_text(d.b, row.unit))}</td><td>{text(change_text(d))}</td>"
                        f"<td>{text(interval_text(d))}</td><td class=\"{css}\">{text(d.verdict)}</td></tr>")
        sections.append("<section><h2>Figures</h2><table><thead><tr><th></th><th>A</th><th>B</th><th>change</th>"
                        "<th>95% interval</th><th>verdict</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>")
        shares_a = {row.metric: row.share_a or 0.0 for row in diff.rows if row.metric in PHASES}
        shares_b = {row.metric: row.share_b or 0.0 for row in diff.rows if row.metric in PHASES}
        from stepscope.report.render.html_charts import PHASE_COLORS

        legend = " ".join(f'<span style="color:{PHASE_COLORS[phase]}">■</span> {text(phase)}' for phase in PHASES
                          if shares_a.get(phase) or shares_b.get(phase))
        sections.append("<section><h2>Phases of the steady step</h2>" + _phase_bar_html(shares_a, "A")
                        + _phase_bar_html(shares_b, "B") + f"<p class=\"sub\">{legend}</p></section>")
        if record_a is not None and record_b is not None:
            from stepscope.analysis.run.steady import steady_mask

            da = record_a.steps.duration_ns[steady_mask(record_a)] / 1e9
            db = record_b.steps.duration_ns[steady_mask(record_b)] / 1e9
            sections.append("<section><h2>Per-step time distributions</h2>" + _histogram_svg(da, db)
                            + '<p class="sub"><span class="legend-a">■ A</span> <span class="legend-b">■ B</span> '
                              "share of steady steps per bin</p></section>")
        setup = "".join(f"<tr><td>{text(c.what)}</td><td>{text(c.a)}</td><td>{text(c.b)}</td></tr>" for c in diff.setup)
        sections.append("<section><h2>What changed in the setup</h2>" + (
            f"<table><thead><tr><th></th><th>A</th><th>B</th></tr></thead><tbody>{setup}</tbody></table>" if setup
            else "<p>nothing stepscope records</p>") + "</section>")
        findings = "".join(f"<li>{text(c.change)}: [{text((c.severity_b or c.severity_a or '').upper())}] "
                           f"{text(c.title)}</li>" for c in diff.findings)
        sections.append("<section><h2>Findings</h2>" + (f"<ul>{findings}</ul>" if findings
                                                          else "<p>the same findings in both runs</p>") + "</section>")
        for note in diff.notes:
            sections.append(f'<div class="notice">{text(note)}</div>')
    else:
        head = "".join(f"<th>{name}</th>" for name in ("name", "category", "calls A", "calls B", "total A (µs)",
                                                        "total B (µs)", "Δ total (µs)", "per call"))
        body = "".join(
            f"<tr><td>{text(op.name)}</td><td>{text(op.category)}</td><td>{op.count_a}</td><td>{op.count_b}</td>"
            f"<td>{op.total_us_a:.0f}</td><td>{op.total_us_b:.0f}</td><td>{op.diff_us:+.0f}</td>"
            f"<td>{'–' if op.per_call_change is None else f'{op.per_call_change:+.0%}'}</td></tr>"
            for op in diff.ops[:2000])
        sections.append(f"<section><h2>Operators and kernels</h2><p class=\"sub\">iterations A {text(list(diff.iterations_a))}, "
                        f"B {text(list(diff.iterations_b))}; {len(diff.ops)} names</p>"
                        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></section>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
            "style-src 'unsafe-inline'\">"
            f"<title>stepscope diff</title><style>{_asset('report.css')}{_DIFF_CSS}</style></head><body><main>"
            + "".join(sections)
            + f"<footer>stepscope {text(__version__)} · one self-contained file, no network</footer></main></body></html>\n")


def write_diff_html(diff: RunDiff | TraceDiff, path: str | Path, **records: Any) -> Path:
    """Render and write the page atomically (:func:`stepscope.safe_write.atomic_write`)."""
    from stepscope.safe_write import atomic_write

    return atomic_write(path, render_diff_html(diff, **records).encode("utf-8"))
