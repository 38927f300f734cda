"""The HTML report: one self-contained file that opens offline (``--html``).

:func:`render_html` formats a :class:`~stepscope.report.model.Report` (runs and traces alike) into
one page: the verdict on top, the steps over time, the machine's timelines on the same time axis,
and the trace views when there are traces. It computes nothing beyond layout and display
down-sampling (:mod:`stepscope.report.render.html_charts`). The order is the terminal's: the
verdict first, then the run, then the charts.

Why hand-drawn SVG and no charting library: the charts are static (drawn here, in Python, with
<title> tooltips), so the page needs only ~5 KB of its own script for the tables; a vendored
library (uPlot is ~50 KB minified) would add weight to every report and a licence to carry for
charts SVG draws as well. The file has no external reference at all: styles and script are
inlined, heatmaps are embedded PNGs.

Safety: every string that comes from a script, a trace or the machine is escaped
(:func:`html.escape`, control characters made visible); table data travels as JSON inside
``<script type="application/json">`` with ``<``, ``>`` and ``&`` (and U+2028/U+2029) escaped, and
the page's script inserts it with ``textContent`` only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from stepscope._version import __version__
from stepscope.report.model import PHASES, Finding, Report, TraceRankView, TraceViews
from stepscope.report.run_view import RunSummary, StepSeries
from stepscope.report.render.output import Output
from stepscope.report.render import html_charts as charts
from stepscope.report.render.lines import (account_line, compile_line, confidence_line, gain_line, loader_line,
                                           overridden_line, skipped_line, withdrawn_line)
from stepscope.safe_write import atomic_write
from stepscope.units import format_bytes, format_duration, format_duration_ns, format_ratio, format_value

#: Step bars drawn at most; more steps are grouped (see html_charts.step_bars).
MAX_STEP_BARS = 1500
#: Trace steps drawn individually in the overview chart at most (the first ones).
MAX_TRACE_STEPS = 200
MAX_FINDINGS = 12
MAX_TEXT = 300


@dataclass
class HtmlPage:
    """The rendered page and what was down-sampled for display (also shown on the page)."""

    text: str
    notices: list[str] = field(default_factory=list)


# -- escaping --------------------------------------------------------------------------------------
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")


def text(value: Any, limit: int = MAX_TEXT) -> str:
    """Escaped text for HTML: control characters (ANSI escapes) made visible, long text cut."""
    raw = _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", str(value))
    if len(raw) > limit:
        raw = raw[: limit - 1] + "…"
    return escape(raw, quote=True)


def json_for_script(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">``: no ``<``, ``>``, ``&`` can end it."""
    encoded = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()
    for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"),
                       ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        encoded = encoded.replace(char, code)
    return encoded


def _asset(name: str) -> str:
    return resources.files("stepscope.report").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


# -- the page --------------------------------------------------------------------------------------
def render_html(report: Report, *, run_dir: str | None = None, max_step_bars: int = MAX_STEP_BARS) -> HtmlPage:
    """The report as one self-contained HTML page."""
    page = HtmlPage("")
    tables: dict[str, Any] = {}
    sections = [_header(report, run_dir), _verdict(report)]
    if report.summary is not None:
        sections += [_run(report.summary), _steps(report, page, max_step_bars), _ranks(report), _system(report, page)]
    sections += _trace_sections(report, tables, page)
    if report.warnings:
        sections.append("<section><h2>Warnings</h2><ul>"
                        + "".join(f'<li class="warning">{text(item)}</li>' for item in report.warnings)
                        + "</ul></section>")
    notices = "".join(f'<div class="notice">{text(item)}</div>' for item in page.notices)
    script = _asset("report.js")
    if "</script" in script.lower():  # the asset is ours; this guards an edit that would break the page
        raise RuntimeError("report.js must not contain '</script'")
    title = text(f"stepscope · {_target(report)}")
    page.text = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">"
        f"<title>{title}</title><style>{_asset('report.css')}</style></head>"
        f"<body><main>{notices}{''.join(part for part in sections if part)}"
        f"<footer>stepscope {text(__version__)} · one self-contained file, no network</footer></main>"
        f'<script type="application/json" id="stepscope-data">{json_for_script({"tables": tables})}</script>'
        f"<script>{script}</script></body></html>\n")
    return page


def write_html(report: Report, path: str | Path, *, run_dir: str | None = None) -> HtmlPage:
    """Render and write the page (atomically: a temporary file beside it, then renamed)."""
    page = render_html(report, run_dir=run_dir)
    atomic_write(Path(path), page.text.encode("utf-8"))
    return page


def render(report: Report, out: Output) -> list[str]:
    """The page to ``out.path``; the notices say what was down-sampled."""
    assert out.path is not None, "the HTML report is written to a file"
    return write_html(report, out.path, run_dir=out.run_dir).notices


def _target(report: Report) -> str:
    if report.summary is not None and report.summary.target:
        return report.summary.target
    if report.traces is not None and report.traces.ranks:
        return Path(report.traces.ranks[0].path).name
    return "run"


# -- header, verdict, run --------------------------------------------------------------------------
def _header(report: Report, run_dir: str | None) -> str:
    summary = report.summary
    where = f'<div class="sub">run directory {text(run_dir)}</div>' if run_dir else ""
    argv = f'<div class="sub">{text(" ".join(summary.argv))}</div>' if summary is not None and summary.argv else ""
    facts: list[tuple[str, str]] = []
    if summary is not None:
        facts += [("steps", f"{summary.total_steps:,}"), ("wall", format_duration(summary.wall_s)),
                  ("exit", str(summary.exit_code if summary.exit_code is not None else "-"))]
        if summary.world_size > 1:
            facts.append(("ranks", f"rank {summary.rank} of {summary.world_size}"))
    elif report.traces is not None:
        facts.append(("ranks", ", ".join(str(item.rank) for item in report.traces.ranks)))
    items = "".join(f"<span>{text(name)} <b>{text(value)}</b></span>" for name, value in facts)
    return (f'<section class="header"><h1>stepscope · {text(_target(report))}</h1>{argv}{where}'
            f'<div class="facts">{items}</div></section>')


def _run(summary: RunSummary) -> str:
    steady = summary.steady
    facts: list[tuple[str, str]] = []
    if steady.steps_per_s:
        facts.append(("throughput", f"{steady.steps_per_s:.2f} steps/s"
                      + (f" · {steady.samples_per_s:,.0f} samples/s" if steady.samples_per_s else "")))
    if summary.total_steps:
        facts += [("step time", f"median {format_duration(steady.median_s)} · p90 {format_duration(steady.p90_s)}"
                                f" · max {format_duration(steady.max_s)}"),
                  ("warm-up", f"{summary.warmup_steps} step(s)")]
    if summary.mfu is not None and summary.mfu_shown:
        mfu = summary.mfu
        facts.append(("MFU", f"{format_ratio(mfu.value)} ({format_ratio(mfu.low)}–{format_ratio(mfu.high)}, "
                             f"{mfu.dtype})"))
    lines = "".join(f'<div class="sub">DataLoader {text(loader_line(loader))}</div>' for loader in summary.loaders[:4])
    if summary.overrides is not None:
        lines += f'<div class="sub">overridden: {text(overridden_line(summary.overrides))}</div>'
    if summary.skipped is not None:
        lines += f'<div class="sub warning">skipped samples: {text(skipped_line(summary.skipped))}</div>'
    if summary.compile is not None:
        lines += f'<div class="sub">torch.compile: {text(compile_line(summary.compile))}</div>'
    if summary.account is not None:
        lines += f'<div class="sub">training thread: {text(account_line(summary.account))}</div>'
    items = "".join(f"<span>{text(name)} <b>{text(value)}</b></span>" for name, value in facts)
    return f'<section id="run"><h2>The run</h2><div class="facts">{items}</div>{lines}</section>'


def _verdict(report: Report) -> str:
    if not report.findings:
        message = ("no steps were captured: nothing to diagnose"
                   if report.summary is not None and report.summary.total_steps == 0 else "no bottleneck rule fired")
        if not report.diagnosis_complete:
            message = "diagnosis incomplete (see the warnings): no verdict"
        return f'<section id="verdict"><h2>Verdict</h2><p class="sub">{text(message)}</p></section>'
    blocks = "".join(_finding(finding, index + 1) for index, finding in enumerate(report.findings[:MAX_FINDINGS]))
    more = len(report.findings) - MAX_FINDINGS
    tail = f'<p class="sub">+{more} more in report.json</p>' if more > 0 else ""
    risk = report.risk
    head = f'<p class="risk"><strong>Risk:</strong> {text(risk.text())}</p>' if risk is not None else ""
    return f'<section id="verdict"><h2>Verdict</h2>{head}{blocks}{tail}</section>'


def _finding(finding: Finding, number: int) -> str:
    level = finding.severity.name.lower()
    cost = (f"costs ~{format_ratio(finding.impact)} of step time" if finding.impact_measured
            else f"ranked as ~{format_ratio(finding.impact)} ({text(finding.impact_basis)})")
    where = f" · rank {text(finding.rank)}" if finding.rank is not None else ""
    if finding.path_share is not None:
        cost += f" · owns {format_ratio(finding.path_share)} of the critical path"
    evidence = "".join(
        f"<li>{text(item.metric)} = {text(format_value(item.value, item.unit))}"
        + (f" (threshold {text(format_value(item.threshold, item.unit))})" if item.threshold is not None else "")
        + (f" [{text(item.source)}]" if item.source else "") + "</li>" for item in finding.evidence)
    prescriptions = "".join(
        f"<li>→ {text(item.action)}"
        + (f" <b>({text(gain_line(item))})</b>" if gain_line(item) else "")
        + (f' <span class="why">— {text(item.why)}</span>' if item.why else "")
        + (f' <span class="why">; cost: {text(item.cost)}</span>' if item.cost else "") + "</li>"
        for item in finding.prescriptions if not item.withdrawn) + "".join(
        f'<li class="why">{text(withdrawn_line(item))}</li>' for item in finding.prescriptions if item.withdrawn)
    summary = f"<div>{text(finding.summary, 2000)}</div>" if finding.summary else ""
    return (f'<div class="finding {level}"><div class="title"><span class="badge {level}">{level.upper()}</span>'
            f"{number}. {text(finding.title)}</div>"
            f'<div class="cost">{cost} · {text(finding.family)} · {text(confidence_line(finding))}'
            f"{where}</div>{summary}"
            + (f'<ul class="evidence">{evidence}</ul>' if evidence else "")
            + (f'<ul class="prescription">{prescriptions}</ul>' if prescriptions else "") + "</div>")




# -- steps -----------------------------------------------------------------------------------------
def time_axis(report: Report) -> charts.TimeAxis | None:
    """The run's time axis: the steps' span (1 % margin), or the samples' span without steps.

    Start-up before the first step (imports, data set loading) is left out so the steps fill the
    width; the system timelines are cut to the same span.
    """
    steps = report.steps
    if steps is not None and len(steps):
        start, end = int(steps.start_ns[0]), int((steps.start_ns + steps.duration_ns).max())
        margin = max((end - start) // 100, 1)
        return charts.TimeAxis(start - margin, end + margin)
    timelines = report.timelines
    if timelines is not None and len(timelines) > 1:
        return charts.TimeAxis(int(timelines.t_ns[0]), int(timelines.t_ns[-1]))
    return None


def _steps(report: Report, page: HtmlPage, max_bars: int) -> str:
    axis = time_axis(report)
    steps = report.steps
    if steps is None or not len(steps) or axis is None or report.summary is None:
        chart = '<p class="sub">no steps were captured</p>'
    else:
        chart = _step_chart(report.summary, steps, axis, page, max_bars)
    split = _phase_split(report.summary) if report.summary is not None else ""
    return f'<section id="steps"><h2>Step time over the run</h2>{chart}{split}</section>'


def _step_chart(summary: RunSummary, steps: StepSeries, axis: charts.TimeAxis, page: HtmlPage, max_bars: int) -> str:
    bars = charts.step_bars(steps.start_ns, steps.duration_ns, steps.phases, max_bars)
    if bars.per_bar > 1:
        page.notices.append(f"{len(steps):,} steps are drawn as {len(bars.start_ns):,} bars of {bars.per_bar} "
                            "steps each: a bar stacks the mean phase times, its tick marks the slowest step")
    ends = steps.start_ns + steps.duration_ns
    marks = []
    if steps.warmup_steps:
        marks.append((int(steps.start_ns[0]), int(ends[steps.warmup_steps - 1]), "warmup", "warm-up"))
    for index in steps.excluded:
        marks.append((int(steps.start_ns[index]), int(ends[index]), "excluded", f"excluded step {index}"))
    shares = summary.steady.phase_shares
    legend = _legend({**{charts.PHASE_LABELS[name]: charts.PHASE_COLORS[name] for name in PHASES},
                      "warm-up": "#9aa5b1", "excluded (measured)": "#6c4bb4"},
                     {charts.PHASE_LABELS[name]: f"{shares.get(name, 0.0):.1%}" for name in PHASES})
    excluded = (f"; excluded steps {', '.join(str(i) for i in steps.excluded[:12])}" if steps.excluded else "")
    return (f'<p class="sub">Each bar is a step at its place in time, stacked by phase; the shaded bands are '
            f"warm-up ({steps.warmup_steps} step(s)) and steps left out of the statistics{text(excluded)}.</p>"
            f"{legend}{charts.step_chart(bars, axis, marks)}{charts.axis_svg(axis)}")


def _phase_split(summary: RunSummary) -> str:
    steady = summary.steady
    if not steady.count:
        return ""
    shares = steady.phase_shares
    means = steady.phase_mean_s
    rows = "".join(f"<tr><td>{charts.PHASE_LABELS[name]} {format_ratio(shares.get(name))}</td>"
                   f"<td class=\"num\">{format_duration(means.get(name))}</td></tr>" for name in PHASES)
    return (f"<h3>Phase split of the steady state ({steady.count:,} steps)</h3>"
            f"{charts.share_bar(shares, charts.PHASE_COLORS, charts.PHASE_LABELS)}"
            f'<table class="plain" style="max-width:420px"><tr><th>phase · share</th>'
            f'<th class="num">mean per step</th></tr>{rows}</table>')


def _legend(colors: dict[str, str], values: dict[str, str] | None = None) -> str:
    return '<div class="legend">' + "".join(
        f'<span><i style="background:{color}"></i>{text(name)}'
        + (f" {text(values[name])}" if values and name in values else "") + "</span>"
        for name, color in colors.items()) + "</div>"


def _ranks(report: Report) -> str:
    """Per-rank steady phase times of a multi-rank run (from each rank's steady state)."""
    others = report.rank_steady
    if len(others) < 2:
        return ""
    names = [f"rank {item.rank}" for item in others]
    parts = [{name: item.phase_mean_s.get(name, 0.0) for name in PHASES} for item in others]
    chart = charts.stacked_columns(names, parts, charts.PHASE_COLORS, lambda s: format_duration(s), height=170,
                                   label="mean steady step per rank")
    rows = "".join(f"<tr><td>rank {item.rank}</td><td class=\"num\">{format_duration(item.mean_s)}</td>"
                   + "".join(f"<td class=\"num\">{format_ratio(item.phase_shares.get(name))}</td>"
                             for name in PHASES) + "</tr>" for item in others)
    head = "".join(f'<th class="num">{charts.PHASE_LABELS[name]}</th>' for name in PHASES)
    return (f'<section id="ranks"><h2>Ranks</h2><p class="sub">Mean steady step of each rank, by phase.</p>'
            f"{_legend({charts.PHASE_LABELS[name]: charts.PHASE_COLORS[name] for name in PHASES})}{chart}"
            f'<table class="plain"><tr><th>rank</th><th class="num">mean step</th>{head}</tr>{rows}</table></section>')


# -- system timelines ------------------------------------------------------------------------------
def _system(report: Report, page: HtmlPage) -> str:
    timelines = report.timelines
    axis = time_axis(report)
    if timelines is None or axis is None:
        return ('<section id="system"><h2>Machine</h2><p class="sub">no sampler data (run without '
                "--no-monitor to see CPU, memory, disk and GPU over time)</p></section>")
    t = timelines.t_ns
    if len(t) > 2 * charts.WIDTH:
        page.notices.append(f"{len(t):,} sampler intervals are drawn as each pixel column's minimum and maximum "
                            "(peaks kept); the CPU heatmap averages them into columns")
    parts = ['<section id="system" class="timeline"><h2>Machine, on the same time axis</h2>']
    labels = [f"cpu{cpu}" for cpu in timelines.cpu_ids]
    parts.append(f"<h3>CPU busy per core ({len(labels)} cores; white idle → dark red saturated)</h3>")
    parts.append(charts.heatmap(t, timelines.core_busy, axis, labels, label="CPU busy per core"))
    cpu_lines = [charts.Line("main process", t, timelines.main_cpu, charts.SERIES_COLORS[0])]
    if timelines.has_workers:
        cpu_lines.append(charts.Line("DataLoader workers", t, timelines.workers_cpu, charts.SERIES_COLORS[1]))
    parts.append("<h3>Process CPU (cores)</h3>" + _legend({line.label: line.color for line in cpu_lines}))
    parts.append(charts.line_chart(cpu_lines, axis, lambda v: f"{v:.2g}", label="process CPU"))
    disk = [charts.Line("read", t, timelines.disk_read, charts.SERIES_COLORS[0]),
            charts.Line("write", t, timelines.disk_write, charts.SERIES_COLORS[1])]
    parts.append("<h3>Disk</h3>" + _legend({line.label: line.color for line in disk}))
    parts.append(charts.line_chart(disk, axis, lambda v: format_bytes(v) + "/s", label="disk read and write"))
    memory = [charts.Line("machine used", t, timelines.mem_used, charts.SERIES_COLORS[2]),
              charts.Line("main RSS", t, timelines.main_rss, charts.SERIES_COLORS[3])]
    total = float(timelines.mem_total_bytes) if timelines.mem_total_bytes > 0 else None
    parts.append(f"<h3>Memory{f' (of {format_bytes(total)})' if total else ''}</h3>"
                 + _legend({line.label: line.color for line in memory}))
    parts.append(charts.line_chart(memory, axis, format_bytes, ymax=total, label="memory"))
    if timelines.has_gpu:
        names = timelines.gpu_names or tuple(f"GPU {i}" for i in range(timelines.gpu_util.shape[1]))
        gpus = [charts.Line(f"GPU {i} {name}", t, timelines.gpu_util[:, i],
                            charts.SERIES_COLORS[i % len(charts.SERIES_COLORS)]) for i, name in enumerate(names)]
        parts.append("<h3>GPU utilisation</h3>" + _legend({line.label: line.color for line in gpus}))
        parts.append(charts.line_chart(gpus, axis, lambda v: f"{v:.0%}", ymax=1.0, label="GPU utilisation",
                                       area=len(gpus) == 1))
        totals = [float(v) for v in timelines.gpu_mem_total_bytes if v > 0]
        gmem = [charts.Line(line.label, t, timelines.gpu_mem_used[:, i], line.color) for i, line in enumerate(gpus)]
        parts.append("<h3>GPU memory</h3>")
        parts.append(charts.line_chart(gmem, axis, format_bytes, ymax=max(totals) if totals else None,
                                       label="GPU memory"))
    else:
        parts.append('<h3>GPU</h3><p class="sub">no GPU metrics in this run</p>')
    parts.append(charts.axis_svg(axis))
    parts.append("</section>")
    return "".join(parts)


# -- trace views -----------------------------------------------------------------------------------
def _trace_sections(report: Report, tables: dict[str, Any], page: HtmlPage) -> list[str]:
    views = report.traces
    if views is None:
        return []
    out = []
    if len(views.ranks) > 1:
        out.append(_comparison(views))
    for item in views.ranks:
        out.append(_trace_rank(item, tables, page, several=len(views.ranks) > 1))
    return out


def _comparison(views: TraceViews) -> str:
    rows = "".join(
        f"<tr><td>rank {rank}</td><td class=\"num\">{_us(step_us)}</td>"
        f"<td class=\"num\">{format_ratio(idle)}</td><td class=\"num\">{format_ratio(compute)}"
        f"</td><td>{'straggler' if rank in views.stragglers else ''}</td></tr>"
        for rank, step_us, idle, compute in views.comparison)
    names = [f"rank {item.rank}" for item in views.ranks]
    parts = [{category: mean_us or 0.0 for category, mean_us, _ in item.categories} for item in views.ranks]
    chart = charts.stacked_columns(names, parts, charts.CATEGORY_COLORS, _us, label="mean step per rank")
    return (f'<section id="trace-ranks"><h2>Trace: ranks compared</h2>{_legend(charts.CATEGORY_COLORS)}{chart}'
            f'<table class="plain"><tr><th>rank</th><th class="num">step time</th><th class="num">GPU idle</th>'
            f'<th class="num">compute</th><th></th></tr>{rows}</table></section>')


def _us(value: float | None) -> str:
    return format_duration(None if value is None else value / 1e6)


def _trace_rank(item: TraceRankView, tables: dict[str, Any], page: HtmlPage, several: bool) -> str:
    name = f"rank {item.rank}" if several else "trace"
    shown = list(item.per_step_us)[:MAX_TRACE_STEPS]
    if len(item.per_step_us) > MAX_TRACE_STEPS:
        page.notices.append(f"{name}: the overview draws the first {MAX_TRACE_STEPS} of {len(item.per_step_us)} "
                            "trace steps")
    overview = ""
    if shown:
        overview = (_legend(charts.CATEGORY_COLORS)
                    + charts.stacked_columns([label for label, _ in shown], [values for _, values in shown],
                                             charts.CATEGORY_COLORS, _us, label="step time breakdown per step"))
    mean_rows = "".join(f"<tr><td>{text(category)}</td><td class=\"num\">{_us(mean_us)}</td>"
                        f"<td class=\"num\">{format_ratio(share)}</td></tr>"
                        for category, mean_us, share in item.categories)
    key = f"r{item.rank}"
    tables[f"ops-{key}"] = _operator_table(item, page, name)
    tables[f"kernels-{key}"] = _kernel_table(item, page, name)
    memory = _memory(item)
    device = f" · {text(item.device_name)}" if item.device_name else ""
    kernels = (f'<h3>Kernels</h3><div data-table="kernels-{key}"></div>' if item.kernels
               else '<h3>Kernels</h3><p class="sub">no GPU kernels in this trace</p>')
    return (f'<section id="trace-{key}" class="trace"><h2>Trace views: {text(name)}{device}</h2>'
            f'<p class="sub">{text(item.path)}</p>'
            f"<h3>Overview: step time breakdown per step</h3>{overview}"
            f'<table class="plain" style="max-width:460px"><tr><th>category</th><th class="num">mean per step</th>'
            f'<th class="num">share</th></tr>{mean_rows}</table>'
            f"{_critical_path(item)}"
            f'<h3>Operators</h3><div data-table="ops-{key}"></div>{kernels}{memory}</section>')


def _critical_path(view: TraceRankView) -> str:
    """What bounds the steps: the path's shares, what it waited on, its longest segments, and one
    step's path drawn on its threads and streams."""

    path = view.critical
    if path is None or path.length_us <= 0:
        return ""
    steps = path.steps
    shares = {kind: share for kind, _, share in path.shares}
    legend = _legend({label: charts.PATH_COLORS[kind] for kind, label, _ in path.shares},
                     {label: format_ratio(share) for _, label, share in path.shares})
    waits = "".join(f"<li>{text(item)}</li>" for item in path.syncs[:5])
    idle = (f'<p>device idle while the path is on the host right after a sync: {format_ratio(path.after_sync_share)}'
            "</p>" if path.after_sync_us > 0 else "")
    rows = "".join(
        f"<tr><td>{text(seg.name)}</td><td>{'CPU' if seg.stream < 0 else f'stream {seg.stream}'}</td>"
        f"<td>{text(seg.label)}</td><td class=\"num\">{_us(seg.per_step_us)}</td>"
        f"<td class=\"num\">{format_ratio(seg.share)}</td><td class=\"num\">{seg.count}</td>"
        f"<td>{text(seg.why)}</td></tr>" for seg in path.segments)
    spans = [(f"{span.pid}/{span.tid}" if span.stream < 0 else f"stream {span.stream}", span.bound, span.name,
              span.ts_us, span.end_us) for span in path.stretches]
    timeline = charts.path_timeline(spans, _us, path.labels)
    notes = "".join(f'<p class="sub">note: {text(note)}</p>' for note in path.notes)
    return (f"<h3>What bounds the step: the critical path ({steps} step{'s' if steps != 1 else ''}, "
            f"{_us(path.per_step_us)} per step)</h3>{legend}"
            + charts.share_bar(shares, charts.PATH_COLORS, path.labels)
            + (f"<p>The path waited:</p><ul>{waits}</ul>" if waits else "") + idle
            + '<table class="plain"><tr><th>segment</th><th>where</th><th>bound by</th><th class="num">per step</th>'
            f'<th class="num">share</th><th class="num">count</th><th>why on the path</th></tr>{rows}</table>'
            + (f"<h4>The path of {text(path.shown_step)} on its threads and streams</h4>{timeline}" if timeline else "")
            + notes)


def _shown(rows: tuple[Any, ...], shown: tuple[Any, ...], page: HtmlPage, what: str) -> tuple[Any, ...]:
    """The rows the view keeps for the table, with a notice when it keeps fewer than there are."""
    if len(shown) < len(rows):
        page.notices.append(f"{what}: the {len(shown):,} largest of {len(rows):,} rows are in the table")
    return shown


def _operator_table(view: TraceRankView, page: HtmlPage, name: str) -> dict[str, Any]:
    rows = _shown(view.operators, view.operators_shown, page, f"{name} operators")
    columns = [("name", "operator", "text"), ("calls", "calls", "int"), ("host_self_us", "host self", "us"),
               ("host_total_us", "host total", "us"), ("device_self_us", "device self", "us"),
               ("device_total_us", "device total", "us")]
    if view.operators_by_shape:
        columns.insert(1, ("input_shape", "input shape", "text"))
    return {"noun": "operators", "total": len(view.operators), "sort": 3 + int(view.operators_by_shape),
            "columns": [{"key": key, "label": label, "kind": kind} for key, label, kind in columns],
            "rows": [[getattr(row, key) for key, _, _ in columns] for row in rows]}


def _kernel_table(view: TraceRankView, page: HtmlPage, name: str) -> dict[str, Any]:
    rows = _shown(view.kernels, view.kernels_shown, page, f"{name} kernels")
    columns = [("name", "kernel", "text"), ("calls", "calls", "int"), ("total_us", "total", "us"),
               ("mean_us", "mean", "us"), ("min_us", "min", "us"), ("max_us", "max", "us"),
               ("blocks_per_sm", "blocks/SM", "num"), ("occupancy_pct", "occupancy", "pct"),
               ("tensor_cores", "Tensor Cores", "bool")]
    return {"noun": "kernels", "total": len(view.kernels), "sort": 2,
            "columns": [{"key": key, "label": label, "kind": kind} for key, label, kind in columns],
            "rows": [[getattr(row, key) for key, _, _ in columns] for row in rows]}


def _memory(view: TraceRankView) -> str:
    parts = []
    for device in view.memory:
        if not device.curve_ts_us:
            continue
        ts = np.asarray(device.curve_ts_us, dtype=np.float64) * 1000
        axis = charts.TimeAxis(int(ts.min()), int(ts.max()) if ts.max() > ts.min() else int(ts.min()) + 1)
        lines = [charts.Line("allocated", ts, np.asarray(device.curve_allocated_bytes, dtype=np.float64),
                             charts.SERIES_COLORS[0])]
        reserved = np.array([np.nan if v is None else v for v in device.curve_reserved_bytes], dtype=np.float64)
        if len(reserved) == len(ts) and (np.nan_to_num(reserved) > 0).any():
            lines.append(charts.Line("reserved", ts, reserved, charts.SERIES_COLORS[1]))
        parts.append(f"<h3>Memory: {text(device.device)} (peak {format_bytes(device.peak_allocated_bytes)} "
                     f"at {format_duration_ns(device.peak_at_us * 1000)})</h3>"
                     + _legend({line.label: line.color for line in lines})
                     + charts.line_chart(lines, axis, format_bytes, label=f"memory {device.device}")
                     + charts.axis_svg(axis))
    if view.allocators:
        rows = "".join(f"<tr><td>{text(op.name)}</td><td class=\"num\">{op.allocations}</td>"
                       f"<td class=\"num\">{format_bytes(op.allocated_bytes)}</td></tr>" for op in view.allocators[:10])
        parts.append('<h3>Top allocating operators</h3><table class="plain"><tr><th>operator</th>'
                     f'<th class="num">allocations</th><th class="num">allocated</th></tr>{rows}</table>')
    return "".join(parts)
