"""``stepscope diff --html``: the :class:`~stepscope.report.diff_view.DiffView` as one
self-contained page (no network, scripts or styles from elsewhere). Everything that came from a
record or a trace is escaped with :func:`stepscope.report.render.html.text`."""

from __future__ import annotations

from importlib import resources

from stepscope._version import __version__
from stepscope.report.diff_view import DiffView, Histogram, RunDiffView, TraceDiffView, change_text, interval_text, value_text
from stepscope.report.render.html import text
from stepscope.report.render.html_charts import PHASE_COLORS
from stepscope.report.render.output import Output
from stepscope.safe_write import atomic_write

TONE_CLASS = {"good": "faster", "bad": "slower"}

_DIFF_CSS = """
.diff-bar-row{display:flex;align-items:center;gap:.5em;margin:.3em 0}
.diff-bar-label{width:2em;font-weight:bold}
.diff-bar{display:flex;height:1.4em;flex:1;max-width:40em;border:1px solid #ccc}
.diff-bar div{height:100%}
td.faster{color:#1a7f37}td.slower{color:#cf222e}td.noise{color:#6e7781}
.legend-a{color:#4c78a8}.legend-b{color:#e45756}
"""


def render(view: DiffView, out: Output) -> list[str]:
    if out.path is None:
        raise ValueError("the diff page is written to a path")
    atomic_write(out.path, page(view).encode("utf-8"))
    return []


def _css() -> str:
    return resources.files("stepscope.report").joinpath("assets").joinpath("report.css").read_text(encoding="utf-8")


def _phase_bar(shares: dict[str, float], label: str) -> str:
    total = sum(max(0.0, share) for share in shares.values()) or 1.0
    cells = "".join(
        f'<div style="width:{max(0.0, share) / total * 100:.2f}%;background:{PHASE_COLORS[phase]}" '
        f'title="{text(phase)} {share:.1%}"></div>'
        for phase, share in shares.items() if share > 0)
    return (f'<div class="diff-bar-row"><span class="diff-bar-label">{text(label)}</span>'
            f'<div class="diff-bar">{cells}</div></div>')


def _histogram_svg(histogram: Histogram) -> str:
    """Per-step time distributions of A and B as two overlaid step histograms (inline SVG)."""
    width, height = 600, 160
    bins = len(histogram.shares_a)
    top = max(1e-9, max(max(histogram.shares_a, default=0.0), max(histogram.shares_b, default=0.0)))
    paths = []
    for shares, color in ((histogram.shares_a, "#4c78a8"), (histogram.shares_b, "#e45756")):
        points = []
        for index, value in enumerate(shares):
            x0, x1 = index * width / bins, (index + 1) * width / bins
            y = height - value / top * (height - 10)
            points += [f"{x0:.1f},{y:.1f}", f"{x1:.1f},{y:.1f}"]
        paths.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="0,{height} {" ".join(points)} '
                     f'{width},{height}"/>')
    axis = (f'<text x="0" y="{height + 14}" font-size="11">{histogram.low_s * 1e3:.2f} ms</text>'
            f'<text x="{width}" y="{height + 14}" font-size="11" text-anchor="end">{histogram.high_s * 1e3:.2f} ms</text>')
    return (f'<svg class="diff-hist" viewBox="0 0 {width} {height + 18}" width="{width}" height="{height + 18}" '
            f'role="img" aria-label="per-step time distributions">{"".join(paths)}{axis}</svg>')


def _runs(runs: RunDiffView) -> list[str]:
    sections = [f"<section><h2>Verdict</h2><p><b>{text(runs.headline)}</b></p>"
                f"<p class=\"sub\">{text(runs.basis)}</p>"
                + (f"<p>{text(runs.origin)}</p>" if runs.origin else "") + "</section>"]
    rows = []
    for row in runs.rows:
        d = row.figure
        css = TONE_CLASS.get(d.tone, "noise")
        rows.append(f"<tr><td>{text(row.label)}</td><td>{text(value_text(d.a, row.unit))}</td>"
                    f"<td>{text(value_text(d.b, row.unit))}</td><td>{text(change_text(d))}</td>"
                    f"<td>{text(interval_text(d))}</td><td class=\"{css}\">{text(d.verdict)}</td></tr>")
    sections.append("<section><h2>Figures</h2><table><thead><tr><th></th><th>A</th><th>B</th><th>change</th>"
                    "<th>95% interval</th><th>verdict</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></section>")
    legend = " ".join(f'<span style="color:{PHASE_COLORS[phase]}">■</span> {text(phase)}' for phase in runs.shares_a
                      if runs.shares_a.get(phase) or runs.shares_b.get(phase))
    sections.append("<section><h2>Phases of the steady step</h2>" + _phase_bar(runs.shares_a, "A")
                    + _phase_bar(runs.shares_b, "B") + f"<p class=\"sub\">{legend}</p></section>")
    if runs.histogram is not None:
        sections.append("<section><h2>Per-step time distributions</h2>" + _histogram_svg(runs.histogram)
                        + '<p class="sub"><span class="legend-a">■ A</span> <span class="legend-b">■ B</span> '
                          "share of steady steps per bin</p></section>")
    setup = "".join(f"<tr><td>{text(c.what)}</td><td>{text(c.a)}</td><td>{text(c.b)}</td></tr>" for c in runs.setup)
    sources = (f"<p><b>local source changed: {text(', '.join(runs.sources_changed))}</b></p>"
               if runs.sources_changed else "")
    sections.append("<section><h2>What changed in the setup</h2>" + sources + (
        f"<table><thead><tr><th></th><th>A</th><th>B</th></tr></thead><tbody>{setup}</tbody></table>" if setup
        else "<p>nothing stepscope records</p>") + "</section>")
    findings = "".join(f"<li>{text(c.change)}: [{text(c.severity)}] {text(c.title)}</li>" for c in runs.findings)
    sections.append("<section><h2>Findings</h2>" + (f"<ul>{findings}</ul>" if findings
                                                      else "<p>the same findings in both runs</p>") + "</section>")
    for note in runs.notes:
        sections.append(f'<div class="notice">{text(note)}</div>')
    return sections


def _traces(traces: TraceDiffView) -> list[str]:
    head = "".join(f"<th>{name}</th>" for name in ("name", "category", "calls A", "calls B", "total A (µs)",
                                                    "total B (µs)", "Δ total (µs)", "per call"))
    body = "".join(
        f"<tr><td>{text(op.name)}</td><td>{text(op.category)}</td><td>{op.count_a}</td><td>{op.count_b}</td>"
        f"<td>{op.total_us_a:.0f}</td><td>{op.total_us_b:.0f}</td><td>{op.diff_us:+.0f}</td>"
        f"<td>{'–' if op.per_call_change is None else f'{op.per_call_change:+.0%}'}</td></tr>"
        for op in traces.ops)
    return [f"<section><h2>Operators and kernels</h2><p class=\"sub\">iterations A {text(list(traces.iterations_a))}, "
            f"B {text(list(traces.iterations_b))}; {traces.op_count} names</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></section>"]


def page(view: DiffView) -> str:
    """The diff as one self-contained page."""
    sections = [f"<section class=\"header\"><h1>stepscope diff</h1><div class=\"sub\">A {text(view.a)}</div>"
                f"<div class=\"sub\">B {text(view.b)}</div></section>"]
    if view.runs is not None:
        sections += _runs(view.runs)
    elif view.traces is not None:
        sections += _traces(view.traces)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
            "style-src 'unsafe-inline'\">"
            f"<title>stepscope diff</title><style>{_css()}{_DIFF_CSS}</style></head><body><main>"
            + "".join(sections)
            + f"<footer>stepscope {text(__version__)} · one self-contained file, no network</footer></main></body></html>\n")
