"""The terminal summary of a run: the verdict and its one best action first, then why, then the run.

Layout, for a ten-second read:

1. one header line — the script, its steps, its wall time, its exit status;
2. the verdict — the top finding's title, its cost and confidence; the one best action with what
   it is measured (``run --verify``) or expected to save; why (the finding's summary); its evidence;
   the other actions;
3. the next findings, one line each with their best action;
4. the run — throughput, step time, the phase bar, the DataLoaders, the machine — each row only when
   it has something to say (no MFU line for a run whose MFU measures the wait; no
   ``prefetch_factor=-``; no GPU line without a GPU);
5. warnings and where the run directory is.

Width: a terminal's own; a file or a pipe gets the content's full width (tables are never cut
to 80 columns) with paragraphs wrapped at :data:`PIPE_WIDTH`. Formatting only: every value comes
from the :class:`~stepscope.report.model.Report`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from stepscope.report.model import PHASES, Finding, Report
from stepscope.report.render.output import Output
from stepscope.report.render.lines import (account_line, compile_line, confidence_line, gain_line, loader_line,
                                           overridden_line, skipped_line, verification_line, withdrawn_line)
from stepscope.report.render.machine import machine_rows
from stepscope.text import printable
from stepscope.units import format_bytes, format_duration, format_ratio, format_value

if TYPE_CHECKING:  # the run's views annotate only: a trace's report builds none
    from stepscope.report.run_view import JobSummary, RunSummary

PHASE_STYLE = {
    "data_wait": ("data wait", "red"),
    "forward": ("forward", "cyan"),
    "backward": ("backward", "blue"),
    "optimizer": ("optimizer", "magenta"),
    "communication": ("communication", "yellow"),
    "other": ("other", "bright_black"),
    "compile": ("compile", "green"),
}
SEVERITY_STYLE = {"CRITICAL": "bold red", "HIGH": "red", "MEDIUM": "yellow", "LOW": "green", "INFO": "bright_black"}
#: How the summary says what delimited the steps (the optimizer, the default, goes unsaid).
STEP_SOURCE_LABEL = {"backward": "one per backward()", "forward": "one per model forward",
                     "batch": "one per batch", "explicit": "session.step()"}
NO_STEPS_MESSAGE = ("no steps were captured: nothing to diagnose. stepscope found no optimizer step, "
                    "backward(), model forward or DataLoader batch; mark each step yourself: "
                    "`with stepscope.profile() as session:` around the loop and `session.step()` at "
                    "the end of each iteration")
BAR_WIDTH = 40
#: Findings shown after the first (one line each); the rest are in report.json.
MORE_FINDINGS = 2
MAX_EVIDENCE = 4
MAX_WARNINGS = 3
#: Columns paragraphs wrap at when the summary goes to a file or a pipe (tables keep their width).
PIPE_WIDTH = 100
#: How a phase that was not measured reads (never "0.0%": nothing was there to measure).
NOT_MEASURED = "–"


def console_for(out: Output) -> Console:
    """The console the summary prints on (see the module docstring for the width). No ``:name:``
    emoji codes are replaced: the summary has none of its own, and a script's or a trace's text
    (a path, a name) must print as it is (it would also load rich's emoji table, a few ms)."""
    stream = out.stream
    if out.width is not None:
        return Console(file=stream, width=out.width, highlight=False, emoji=False)
    console = Console(file=stream, highlight=False, emoji=False)
    if console.is_terminal:
        return console
    return Console(file=stream, width=PIPE_WIDTH, highlight=False, color_system=None, emoji=False)


def print_wide(console: Console, renderable: RenderableType) -> None:
    """Print; when the console is not a terminal, uncropped (a table's ``no_wrap`` cells run past the
    console's width whole: a file keeps them) and without the padding spaces at line ends.

    Nothing is measured first: ``Console.print`` renders at most at the console's width whatever
    width it is asked for, so a measure could only say what the uncropped print does anyway (and
    was half the time of ``analyze``'s text output).
    """
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable, crop=False)
    console.file.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


# -- findings --------------------------------------------------------------------------------------
def cost_text(finding: Finding) -> str:
    if finding.impact_measured:
        return f"costs ~{format_ratio(finding.impact)} of step time"
    return f"ranked as ~{format_ratio(finding.impact)} ({finding.impact_basis})"


def head_line(finding: Finding, number: int, cost: bool = False) -> Text:
    """``1. [CRITICAL] title`` (and, with ``cost``, ``  costs ~91% of the step · confidence 96%``)."""
    level = finding.severity.name
    head = Text()
    head.append(f"{number}. ", style="bold")
    head.append(f"[{level}] ", style=SEVERITY_STYLE.get(level, ""))
    head.append(printable(finding.title), style="bold")
    if cost:
        head.append(f"  {cost_line(finding)}", style="bright_black")
    return head


def cost_line(finding: Finding) -> str:
    where = f" · rank {finding.rank}" if finding.rank is not None and finding.family != "straggler" else ""
    path = f" · owns {format_ratio(finding.path_share)} of the critical path" if finding.path_share is not None else ""
    return f"{cost_text(finding)}{path} · {finding.family} · {confidence_line(finding)}{where}"


def action_line(prescription: Any, first: bool) -> Text:
    line = Text("→ " if first else "also: ", style="bold green" if first else "green")
    line.append(printable(prescription.action), style="bold green" if first else "green")
    gain = gain_line(prescription)
    if gain:
        line.append(f" — {gain}", style="green")
    return line


def finding_block(finding: Finding, number: int, detail: bool = True) -> Group:
    """A finding: its title, its cost, its best action; with ``detail``, why (its summary), the
    evidence, how the action's gain was worked out, and the other actions (shared by the run and
    trace summaries)."""
    shown = [item for item in finding.prescriptions if not item.withdrawn]
    body: list[RenderableType] = []
    if detail:
        body.append(Text(cost_line(finding), style="bright_black"))
    if shown:
        body.append(action_line(shown[0], True))
    if not detail:
        return Group(head_line(finding, number, cost=True), _indent(body))
    if finding.summary:
        body.append(Text(printable(finding.summary)))
    for item in finding.evidence[:MAX_EVIDENCE]:
        threshold = f" (threshold {format_value(item.threshold, item.unit)})" if item.threshold is not None else ""
        source = f" [{item.source}]" if item.source else ""
        body.append(Text(printable(f"• {item.metric} = {format_value(item.value, item.unit)}{threshold}{source}"),
                         style="bright_black"))
    if shown and (shown[0].why or shown[0].cost):
        reason = printable(shown[0].why) + (f"; cost: {printable(shown[0].cost)}" if shown[0].cost else "")
        body.append(Text(f"About the action: {reason}", style="bright_black"))
    for prescription in shown[1:3]:
        line = action_line(prescription, False)
        if prescription.why:
            line.append(f" ({printable(prescription.why)})", style="bright_black")
        body.append(line)
    for prescription in finding.prescriptions:
        if prescription.withdrawn:
            body.append(Text(printable(withdrawn_line(prescription)), style="bright_black"))
    return Group(head_line(finding, number), _indent(body))


def _indent(body: list[RenderableType]) -> Padding:
    return Padding(Group(*body), (0, 0, 0, 3), expand=False)


def verdict(report: Report) -> list[RenderableType]:
    if not report.findings:
        summary = report.summary
        message = "no bottleneck rule fired"
        if summary is not None and summary.total_steps == 0:
            message = NO_STEPS_MESSAGE
        if summary is not None and summary.training_in_children:
            message = "not diagnosed: the training ran in child processes (see the warning)"
        if not report.diagnosis_complete:
            message = "diagnosis incomplete (see the warnings): no verdict"
        return [Text(message, style="bright_black")]
    parts: list[RenderableType] = [finding_block(report.findings[0], 1)]
    risk = report.risk
    if risk is not None:
        parts.append(Text(f"Risk: {printable(risk.text())}", style="bold yellow"))
    for number, finding in enumerate(report.findings[1:1 + MORE_FINDINGS], start=2):
        parts.append(finding_block(finding, number, detail=False))
    hidden = len(report.findings) - 1 - MORE_FINDINGS
    if hidden > 0:
        parts.append(Text(f"(+{hidden} more in report.json)", style="bright_black"))
    return parts


# -- the run ---------------------------------------------------------------------------------------
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


def phase_legend(shares: dict[str, float], measured: tuple[str, ...] | None = None) -> Text:
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


def run_rows(summary: RunSummary) -> Table:
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    steady = summary.steady
    rate = []
    if steady.steps_per_s:
        rate.append(f"{steady.steps_per_s:.2f} steps/s")
    if steady.samples_per_s:
        rate.append(f"{steady.samples_per_s:,.0f} samples/s")
    if summary.samples_per_step:
        rate.append(f"batch {summary.samples_per_step}")
    kind = "inference, " if summary.inference else ""
    how = f", {STEP_SOURCE_LABEL[summary.step_source]}" if summary.step_source in STEP_SOURCE_LABEL else ""
    warm = ""
    if summary.warmup_steps:
        warm = (f"; {summary.warmup_steps} warm-up step(s) shown apart, "
                f"{format_duration(summary.warmup_s)}")
    if summary.total_steps:
        table.add_row("Run", Text(" · ".join(rate) + f"  ({kind}{steady.count} steady steps{how}{warm})"))
        table.add_row("Step time", Text(f"median {format_duration(steady.median_s)} · p90 "
                                        f"{format_duration(steady.p90_s)} · max {format_duration(steady.max_s)}"))
        table.add_row("Phases", Group(phase_bar(steady.phase_shares),
                                      phase_legend(steady.phase_shares, summary.measured_phases)))
    if summary.account is not None and summary.account.shown:
        table.add_row("Thread", Text(account_line(summary.account)))
    if summary.mfu is not None and summary.mfu_shown:
        mfu = summary.mfu
        table.add_row("MFU", Text(f"{format_ratio(mfu.value)} (range {format_ratio(mfu.low)}–{format_ratio(mfu.high)}) "
                                  f"of the {printable(mfu.peak_source)}"))
    if summary.compile is not None:
        table.add_row("Compile", Text(printable(compile_line(summary.compile))))
    gc = summary.gc
    if gc is not None and gc.share_of_step_time:
        largest = f", largest {format_duration(gc.largest_s)}" if gc.largest_s is not None else ""
        per_step = f" · {gc.pauses_per_step:.1f} per step" if gc.pauses_per_step else ""
        table.add_row("GC pauses", Text(f"{format_ratio(gc.share_of_step_time)} of step time{per_step}{largest}"))
    for loader in summary.loaders:
        table.add_row("DataLoader", Text(printable(loader_line(loader))))
    if summary.overrides is not None:
        table.add_row("Overridden", Text(printable(overridden_line(summary.overrides))))
    if summary.skipped is not None:
        table.add_row("Skipped", Text(printable(skipped_line(summary.skipped)),
                                      style="yellow" if summary.skipped.total else ""))
    for label, text in machine_rows(summary):
        table.add_row(label, text)
    return table


def rank_table(job: JobSummary) -> Group:
    """The job's per-rank table, its spread and its missing ranks."""
    table = Table(box=None, padding=(0, 1), show_edge=False)
    names = ("rank", *(("node",) if job.several_nodes else ()), "step", "data", "compute", "comm", "overlap", "CPU",
             "RSS")
    for name in names:
        table.add_column(name, justify="left" if name == "rank" else "right", no_wrap=True)

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1e3:.1f}ms"

    for row in job.rows:
        table.add_row(str(row.rank), *((str(row.node),) if job.several_nodes else ()), ms(row.step_time_s),
                      ms(row.data_wait_s), ms(row.compute_s), ms(row.communication_s), ms(row.overlapped_s),
                      f"{row.cpu_util:.0%}" if row.cpu_util is not None else "-",
                      format_bytes(row.rss_bytes) if row.rss_bytes else "-")
    parts: list[RenderableType] = [Text(f"Ranks ({len(job.rows)} of {job.world_size}), per step; comm: waiting in "
                                        "collectives, overlap: hidden under backward", style="bold"), table]
    if job.spread is not None:
        spread = job.spread
        parts.append(Text(f"spread: step time {format_duration(spread.step_time_min_s)}–"
                          f"{format_duration(spread.step_time_max_s)} ({format_ratio(spread.step_time_spread)}); "
                          f"most own work (step − comm): rank {spread.slowest_rank}", style="bright_black"))
    for item in job.missing:
        parts.append(Text(printable(f"rank {item.rank} missing: {item.reason}"), style="yellow"))
    if job.failure is not None:
        parts.append(Text(printable(f"The job failed: {job.failure}"), style="bold red"))
    return Group(*parts)


def header(report: Report) -> Text:
    summary = report.summary
    if summary is None:
        return Text("stepscope", style="bold")
    ranks = f" · rank {summary.rank} of {summary.world_size}" if summary.world_size > 1 else ""
    text = Text("stepscope", style="bold")
    text.append(f" · {printable(summary.target or 'run')}{ranks} · {summary.total_steps} steps in "
                f"{format_duration(summary.wall_s)}{ending(report)}")
    return text


def ending(report: Report) -> str:
    """How the run ended, for the header: ``exit 0``, ``exit 143 (SIGTERM)``, or — without an exit
    status — what that means: the process was killed by a signal that cannot be caught (SIGKILL,
    the OOM killer), so its record is the last checkpoint. Nothing for a library session (no exit)."""
    summary = report.summary
    if summary is not None and summary.exit_code is not None:
        by = summary.interrupted_by
        return f" · exit {summary.exit_code}" + (f" ({printable(by)})" if by else "")
    if summary is not None and summary.mode == "api":
        return ""
    return " · killed: no exit status (SIGKILL?)"


def renderables(report: Report, run_dir: str | None = None) -> list[RenderableType]:
    """The summary, top to bottom."""
    parts: list[RenderableType] = [header(report), Text(""), *verdict(report)]
    if (verification := report.verification_view) is not None:
        parts.append(Text(printable(verification_line(verification)), style="bright_black"))
    parts.append(Text(""))
    if report.summary is not None:
        parts.append(run_rows(report.summary))
    warnings = report.warnings
    if report.job is not None:
        parts += [Text(""), rank_table(report.job)]
        # the rank table says which ranks are missing and why: not a second time among the warnings
        shown = {f"rank {item.rank} missing: {item.reason}" for item in report.job.missing}
        warnings = tuple(message for message in warnings if message not in shown)
    for message in warnings[:MAX_WARNINGS]:
        parts.append(Text(f"warning: {printable(message)}", style="yellow"))
    if len(warnings) > MAX_WARNINGS:
        parts.append(Text(f"(+{len(warnings) - MAX_WARNINGS} more warnings in report.json)", style="yellow"))
    if run_dir:
        parts.append(Text(f"Run directory: {printable(run_dir)}  (report.json; `stepscope report DIR --html` "
                          "for the HTML report)", style="bright_black"))
    return parts


def render(report: Report, out: Output) -> list[str]:
    console = console_for(out)
    for part in renderables(report, out.run_dir):
        print_wide(console, part)
    return []
