"""``stepscope try`` on the terminal: the trials' table, the best change (or why there is none), what
failed, the prescriptions not tried and the notes. Formats a
:class:`~stepscope.report.command_views.TryView`; JSON is :mod:`.command_json`."""

from __future__ import annotations

from rich import box
from rich.table import Table
from rich.text import Text

from stepscope.report.command_views import TrialRow, TryView
from stepscope.report.render.output import Output
from stepscope.report.render.terminal import console_for, print_wide
from stepscope.text import printable

#: Why no change is best, by the view's ``no_best``.
_NO_BEST = {"no_trial": "no trial was measured", "no_baseline": "no baseline trial was measured",
            "no_candidate": "no candidate trial was measured",
            "within_noise": "no change beat the baseline beyond noise"}


def _range(low: float | None, high: float | None, fmt: str) -> str:
    if low is None or high is None:
        return "-"
    return f"{fmt.format(low)}–{fmt.format(high)}"


def _cells(row: TrialRow) -> tuple[str, str, str, str, str]:
    time_text = "-" if row.step_time_s is None else (
        f"{row.step_time_s * 1e3:.1f} ms\n({(row.step_time_min_s or 0) * 1e3:.1f}–{(row.step_time_max_s or 0) * 1e3:.1f})")
    rate = "-" if row.throughput is None else (
        f"{row.throughput:,.0f}\n({_range(row.throughput_min, row.throughput_max, '{:,.0f}')})")
    speed = "-" if row.speedup is None or row.baseline else (
        f"×{row.speedup:.2f}\n({_range(row.speedup_low, row.speedup_high, '{:.2f}')})")
    expected = f"×{row.expected_speedup:.2f}" if row.expected_speedup is not None else "-"
    verdict = row.verdict + (f" ({row.failed} failed)" if row.failed and row.verdict != "failed" else "")
    return time_text, rate, speed, expected, verdict


def render(view: TryView, out: Output) -> list[str]:
    console = console_for(out)  # a pipe or a file gets whole cells
    table = Table(title=Text(f"stepscope try · {printable(view.target)} · {view.steps} steps per trial"),
                  title_justify="left", box=box.SIMPLE_HEAD,
                  caption=f"median (min–max) of {view.repeats} trial(s) each, interleaved; speed-up bounds: "
                          "slowest trial against the fastest baseline trial and the reverse",
                  caption_justify="left")
    table.add_column("setting", no_wrap=True)
    for column in ("step time", view.unit, "speed-up", "expected", "verdict"):
        table.add_column(column, justify="left" if column == "verdict" else "right")
    for row in view.rows:
        table.add_row(Text(printable(row.name)), *_cells(row))
    if view.rows:
        print_wide(console, table)
    best = view.best
    if best is not None:
        command = " ".join(f"--set {key}={value}" for key, value in best.settings)
        console.print(f"best: {printable(best.name)} — ×{best.speedup or 0:.2f} {view.unit} "
                      f"(bounds ×{best.speedup_low or 0:.2f}–×{best.speedup_high or 0:.2f}); "
                      f"stepscope run {command} …", markup=False, soft_wrap=True)
    elif view.no_best is not None:
        why = view.failed if view.no_best == "no_trial" and view.failed else _NO_BEST[view.no_best]
        if view.no_best in ("no_baseline", "no_candidate") and view.failed:
            why += f"; {view.failed}"
        console.print(printable(f"best: none — {why}"), markup=False, soft_wrap=True)
    if view.show_failed:
        console.print(printable(f"failed: {view.failed}"), markup=False, soft_wrap=True)
    for action, source in view.code_changes:
        console.print(printable(f"not tried (no --set for it): {action} [{source}]"), markup=False, soft_wrap=True)
    for note in view.notes:
        console.print(f"note: {printable(note)}", style="bright_black", markup=False, soft_wrap=True)
    return []
