"""The one-screen terminal summary (rich). Formats a :class:`~stepscope.report.model.Report`; computes nothing."""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from stepscope.diagnosis.findings import Finding, Severity
from stepscope.record.run import PHASES, LoaderInfo
from stepscope.report.lines import (compile_line, gain_line, overridden_line, skipped_line, verification_line,
                                    withdrawn_line)
from stepscope.report.model import Report
from stepscope.text import printable
from stepscope.units import format_bytes, format_duration, format_duration_ns, format_ratio, format_value

PHASE_STYLE = {
    "data_wait": ("data wait", "red"),
    "forward": ("forward", "cyan"),
    "backward": ("backward", "blue"),
    "optimizer": ("optimizer", "magenta"),
    "communication": ("communication", "yellow"),
    "other": ("other", "bright_black"),
    "compile": ("compile", "green"),
}
SEVERITY_STYLE = {
    Severity.CRITICAL: "bold red",
    Severity.HIGH: "red",
    Severity.MEDIUM: "yellow",
    Severity.LOW: "green",
    Severity.INFO: "bright_black",
}
#: How the summary says what delimited the steps (the optimizer, the default, goes unsaid).
STEP_SOURCE_LABEL = {"backward": "one per backward()", "forward": "one per model forward",
                     "batch": "one per batch", "explicit": "session.step()"}
NO_STEPS_MESSAGE = ("no steps were captured: nothing to diagnose. stepscope found no optimizer step, "
                    "backward(), model forward or DataLoader batch; mark each step yourself: "
                    "`with stepscope.profile() as session:` around the loop and `session.step()` at "
                    "the end of each iteration")
BAR_WIDTH = 40
MAX_FINDINGS = 3
MAX_WARNINGS = 3


#: How a phase that was not measured reads (never "0.0%": nothing was there to measure).
NOT_MEASURED = "–"


def phase_bar(shares: dict[str, float], width: int = BAR_WIDTH) -> Text:
    """A stacked bar of phase shares (largest-remainder rounding keeps the width exact)."""
    total = sum(max(0.0, shares.get(phase, 0.0)) for phase in PHASES)
    if total <= 0:
        return Text()
    raw = [(phase, max(0.0, shares.get(phase, 0.0)) / total * width) for phase in PHASES]
    cells = {phase: int(value) for phase, value in raw}
    for phase, _ in sorted(raw, key=lambda item: item[1] - int(item[1]), reverse=True)[: width - sum(cells.values())]:
        cells[phase] += 1
    bar = Text()
    for phase in PHASES:
        bar.append("█" * cells[phase], style=PHASE_STYLE[phase][1])
    return bar


def _phase_legend(shares: dict[str, float], measured: tuple[str, ...] | None = None) -> Text:
    legend = Text()
    shown = [phase for phase in PHASES if phase not in ("communication", "compile") or shares.get(phase, 0.0) > 0]
    for index, phase in enumerate(shown):
        label, style = PHASE_STYLE[phase]
        if index:
            legend.append(" · ")
        legend.append("■ ", style=style)
        value = format_ratio(shares.get(phase, 0.0)) if measured is None or phase in measured else NOT_MEASURED
        legend.append(f"{label} {value}")
    return legend


def _overview(report: Report) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    steady = report.steady
    rate = f"{steady.steps_per_s:.2f} steps/s" if steady.steps_per_s else "-"
    if steady.samples_per_s:
        rate += f" · {steady.samples_per_s:,.0f} samples/s"
        if report.samples_per_step:
            rate += f" · batch {report.samples_per_step}"
    kind = "inference, " if report.inference else ""
    source = report.meta.step_source if report.meta is not None else "none"
    how = f", {STEP_SOURCE_LABEL[source]}" if source in STEP_SOURCE_LABEL else ""
    table.add_row("Throughput", Text(f"{rate}  ({kind}steady state: {steady.count} steps{how})"))
    table.add_row("Step time", Text(f"median {format_duration(steady.median_s)} · p90 "
                                    f"{format_duration(steady.p90_s)} · max {format_duration(steady.max_s)}"))
    if report.warmup_steps:
        warm = report.warmup
        table.add_row("Warm-up", Text(f"{report.warmup_steps} step(s), {format_duration(warm.total_s)} "
                                      f"(mean {format_duration(warm.mean_s)}) — shown apart"))
    if report.total_steps:
        table.add_row("Phases", Group(phase_bar(steady.phase_shares),
                                      _phase_legend(steady.phase_shares, report.measured_phases)))
    else:
        table.add_row("Phases", Text("not measured (no steps)"))
    mfu = report.evidence.mfu
    if mfu is not None:
        table.add_row("MFU", Text(f"{format_ratio(mfu.value)} (range {format_ratio(mfu.low)}–{format_ratio(mfu.high)}) "
                                  f"of the {printable(mfu.peak_source)}"))
    compiled = report.evidence.compile
    if compiled is not None:
        table.add_row("Compile", Text(printable(compile_line(compiled))))
    gc = report.evidence.gc
    if gc is not None and gc.count:
        largest = f", largest {format_duration(gc.largest.duration_s)}" if gc.largest is not None else ""
        per_step = f"{gc.pauses_per_step:.1f}" if gc.pauses_per_step is not None else "-"
        table.add_row("GC pauses", Text(f"{format_ratio(gc.share_of_step_time)} of step time · "
                                        f"{per_step} per step{largest}"))
    for loader in report.loaders:
        table.add_row("DataLoader", Text(_loader_line(loader)))
    overrides = report.evidence.facts.overrides if report.evidence.facts is not None else None
    if overrides is not None:
        table.add_row("Overridden", Text(printable(overridden_line(overrides))))
    if report.skipped_samples is not None:
        table.add_row("Skipped samples", Text(printable(skipped_line(report.skipped_samples)),
                                              style="yellow" if report.skipped_samples.total else ""))
    return table


def _loader_line(loader: LoaderInfo) -> str:
    dataset = printable(loader.dataset_type.rsplit(".", 1)[-1])
    prefetch = loader.prefetch_factor if loader.prefetch_factor is not None else "-"
    return (f"#{loader.loader_id} {dataset}: batch_size={loader.batch_size} "
            f"num_workers={loader.num_workers} pin_memory={loader.pin_memory} "
            f"prefetch_factor={prefetch} persistent_workers={loader.persistent_workers} "
            f"drop_last={loader.drop_last} · {loader.batches} batches, "
            f"wait {format_duration_ns(loader.wait_ns)}")


def finding_block(finding: Finding, rank: int) -> Group:
    """One finding: title, cost, evidence and prescriptions (shared by every terminal view)."""
    style = SEVERITY_STYLE.get(finding.severity, "")
    head = Text()
    head.append(f"{rank}. ", style="bold")
    head.append(f"[{finding.severity.name}] ", style=style)
    head.append(printable(finding.title), style="bold")
    head.append(f"  {_cost(finding)} · {finding.family} · confidence {format_ratio(finding.confidence)}",
                style="bright_black")
    body: list[Any] = []
    if finding.summary:
        body.append(Text(printable(finding.summary)))
    for item in finding.evidence[:4]:
        body.append(Text(printable(f"• {item.metric} = {format_value(item.value, item.unit)}"
                                   + (f" (threshold {format_value(item.threshold, item.unit)})" if item.threshold is not None else "")
                                   + (f" [{item.source}]" if item.source else "")), style="bright_black"))
    shown = [item for item in finding.prescriptions if not item.withdrawn]
    for prescription in shown[:3]:
        line = Text("→ ", style="green")
        line.append(printable(prescription.action), style="green")
        gain = gain_line(prescription)
        if gain:
            line.append(f" ({gain})", style="green")
        if prescription.why:
            line.append(f" — {printable(prescription.why)}", style="bright_black")
        if prescription.cost:
            line.append(f"; cost: {printable(prescription.cost)}", style="bright_black")
        body.append(line)
    for prescription in finding.prescriptions:
        if prescription.withdrawn:
            body.append(Text(printable(withdrawn_line(prescription)), style="bright_black"))
    return Group(head, Padding(Group(*body), (0, 0, 0, 3)))


def _cost(finding: Finding) -> str:
    if finding.impact_measured:
        return f"costs ~{format_ratio(finding.impact)} of step time"
    return f"ranked as ~{format_ratio(finding.impact)} ({finding.impact_basis})"




def _verdict(report: Report) -> Group:
    if not report.findings:
        message = (NO_STEPS_MESSAGE if report.total_steps == 0 else "no bottleneck rule fired")
        if report.training_in_children:
            message = "not diagnosed: the training ran in child processes (see the warning)"
        if not report.diagnosis.complete:
            message = "diagnosis incomplete (see the warnings): no verdict"
        return Group(Text(message, style="bright_black"))
    shown = report.findings[:MAX_FINDINGS]
    parts: list[RenderableType] = [finding_block(finding, index + 1) for index, finding in enumerate(shown)]
    if len(report.findings) > MAX_FINDINGS:
        parts.append(Text(f"(+{len(report.findings) - MAX_FINDINGS} more in report.json)", style="bright_black"))
    return Group(*parts)


def rank_table(job: Any) -> Group:
    """The job's per-rank table, its spread and its missing ranks."""
    table = Table(box=None, padding=(0, 1), show_edge=False)
    nodes = len({row.node for row in job.rows}) > 1
    names = ("rank", *(("node",) if nodes else ()), "step", "data", "compute", "comm", "overlap", "CPU", "RSS")
    for name in names:
        table.add_column(name, justify="left" if name == "rank" else "right", no_wrap=True)

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.1f}ms"

    for row in job.rows:
        cells = [str(row.rank), *((str(row.node),) if nodes else ()), ms(row.step_time_s), ms(row.data_wait_s),
                 ms(row.compute_s), ms(row.communication_s), ms(row.overlapped_s),
                 f"{row.cpu_util:.0%}" if row.cpu_util is not None else "-",
                 format_bytes(row.rss_bytes) if row.rss_bytes else "-"]
        table.add_row(*cells)
    parts: list[Any] = [Text(f"Ranks ({len(job.rows)} of {job.world_size}), per step; comm: waiting in "
                             "collectives, overlap: hidden under backward", style="bold"), table]
    if job.spread is not None:
        spread = job.spread
        parts.append(Text(f"spread: step time {format_duration(spread.step_time_min_s)}–"
                          f"{format_duration(spread.step_time_max_s)} ({format_ratio(spread.step_time_spread)}); "
                          f"most own work (step − comm): rank {spread.slowest_rank}", style="bright_black"))
    for item in job.missing:
        parts.append(Text(printable(f"rank {item.rank} missing: {item.reason}"), style="yellow"))
    return Group(*parts)


def render(report: Report, run_dir: str | None = None, macro: Any = None) -> Panel:
    """The summary panel."""
    meta = report.meta
    target = (meta.target if meta is not None else "") or "run"
    wall = meta.wall_s if meta is not None else None
    exit_code = meta.exit_code if meta is not None else None
    ranks = f" · rank {meta.rank} of {meta.world_size}" if meta is not None and meta.world_size > 1 else ""
    title = (f"stepscope · {printable(target)}{ranks} · {report.total_steps} steps · {format_duration(wall)} "
             f"· exit {exit_code}")
    parts: list[Any] = [_overview(report)]
    if macro is not None:
        parts += [Text(""), macro]
    if report.job is not None:
        parts += [Text(""), rank_table(report.job)]
    parts += [Text(""), Text("Verdict", style="bold underline"), _verdict(report)]
    if report.verification is not None:
        parts.append(Text(printable(verification_line(report.verification)), style="bright_black"))
    for message in report.warnings[:MAX_WARNINGS]:
        parts.append(Text(f"warning: {printable(message)}", style="yellow"))
    if run_dir:
        parts.append(Text(f"Run directory: {printable(run_dir)}  (report.json, record.rank*.json.gz)", style="bright_black"))
    return Panel(Group(*parts), title=Text(title), title_align="left", expand=False)


def print_summary(report: Report, run_dir: str | None = None, console: Console | None = None) -> None:
    console = console or Console(stderr=True)
    macro = None
    if report.signals is not None:
        from stepscope.report.macro_view import render_macro

        macro = render_macro(report.signals)
    console.print(render(report, run_dir, macro))
