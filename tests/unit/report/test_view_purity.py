"""Renderers read only the view: real reports render to the same bytes in every format once the
fields kept for library users (``view_rules.LIBRARY_ONLY``: the evidence, the diagnosis, the
record's meta, the trace analysis) are replaced by an object that fails on any use.

The reports are the pipeline's own, of the saved zoo runs (a job among them), synthetic records
(a run without steps, hence without a verdict; a sampled run with its machine timelines; a run's
profiler window; ``run --set`` and skipped samples) and the vendored reference traces (one rank
with its critical path, and two ranks). ``test_layers.py`` checks the same rule in the
annotations; this checks what the renderers do.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from html_records import synthetic_run
from records import make_record
from records import report_of as build_report
from stepscope.pipeline.diagnose import ReportOptions, diagnose
from stepscope.pipeline.inputs import load_run, load_traces
from stepscope.record.run import Override, Overrides, RunMeta, RunRecord, SkippedSamples, StepTable
from stepscope.report.render import Output, render
from view_rules import LIBRARY_ONLY, PASSED_THROUGH, VIEWS

DATA = Path(__file__).resolve().parents[2] / "data"
TRACES = DATA / "traces"
HTA = TRACES / "reference" / "hta"
#: TensorBoard scalars are written with the (optional) tensorboard package.
TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


class Unreadable:
    """Stands for a field no renderer may read: every use fails, naming the field."""

    def __init__(self, where: str) -> None:
        object.__setattr__(self, "_where", where)

    def __getattribute__(self, name: str) -> Any:
        if name in ("_where", "__class__"):
            return object.__getattribute__(self, name)
        raise AssertionError(f"a renderer read .{name} of {object.__getattribute__(self, '_where')}")

    def _refuse(self, *args: Any) -> Any:
        raise AssertionError(f"a renderer used {object.__getattribute__(self, '_where')}")

    __bool__ = __len__ = __iter__ = __getitem__ = __eq__ = __hash__ = __str__ = __repr__ = __format__ = _refuse


def walled(value: Any, path: str = "Report") -> tuple[Any, set[str]]:
    """``value`` with every ``LIBRARY_ONLY`` field of its views (nested ones too) made
    :class:`Unreadable`, and the fields that were."""
    if isinstance(value, tuple):
        parts = [walled(item, f"{path}[]") for item in value]
        return tuple(item for item, _ in parts), set().union(*(found for _, found in parts))
    if not dataclasses.is_dataclass(value) or isinstance(value, type) or type(value).__module__ not in VIEWS:
        return value, set()
    changes: dict[str, Any] = {}
    found: set[str] = set()
    for item in dataclasses.fields(value):
        name = f"{type(value).__name__}.{item.name}"
        if name in LIBRARY_ONLY:
            changes[item.name] = Unreadable(f"{path}.{item.name}")
            found.add(name)
        else:
            changes[item.name], inner = walled(getattr(value, item.name), f"{path}.{item.name}")
            found |= inner
    return replace(value, **changes), found


def foreign(value: Any, path: str = "Report") -> list[str]:
    """Where a view holds an object of stepscope's outside the views (but for the types passed on
    as they are): what the annotations do not show (a ``dict[str, Any]`` holding an analysis)."""
    kind = type(value)
    if kind.__module__.split(".")[0] == "stepscope" and kind.__module__ not in VIEWS:
        return [] if kind.__name__ in PASSED_THROUGH else [f"{path}: {kind.__name__}"]
    if isinstance(value, (tuple, list)):
        return [where for index, item in enumerate(value) for where in foreign(item, f"{path}[{index}]")]
    if isinstance(value, dict):
        return [where for key, item in value.items() for where in foreign(item, f"{path}[{key!r}]")]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [where for item in dataclasses.fields(value)
                for where in foreign(getattr(value, item.name), f"{path}.{item.name}")]
    return []


def outputs(report: Any, tmp_path: Path) -> dict[str, bytes]:
    """Every output of ``report``: the terminal text (a terminal's width and a pipe's), JSON, HTML,
    and the folded stacks, Perfetto timeline and TensorBoard scalars (with the package) when it has
    them."""
    out: dict[str, bytes] = {}
    streamed = [("text", 120), ("text", None), ("json", None)] + ([("flame", None)] if report.flame is not None else [])
    for name, width in streamed:
        stream = io.StringIO()
        render(report, name, Output(stream=stream, width=width, run_dir="runs/x", top=5))
        out[f"{name} {width}"] = stream.getvalue().encode()
    written = {"html": tmp_path / "report.html"}
    if report.perfetto is not None:
        written["perfetto"] = tmp_path / "trace.json"
    if report.steps is not None and TENSORBOARD:
        written["tensorboard"] = tmp_path / "tb"
    for name, target in written.items():
        notes = render(report, name, Output(path=target, run_dir="runs/x"))
        files = sorted(target.iterdir()) if target.is_dir() else [target]
        out[name] = b"".join(path.read_bytes() for path in files) + repr(notes).encode()
        for path in files:
            path.unlink()
    return out


def empty_run():
    """No steps: no finding, so the verdict says why there is none."""
    return build_report(RunRecord(meta=RunMeta(target="empty.py"), steps=StepTable.empty()))


def sampled_run():
    return build_report(synthetic_run(300), perfetto=True)


def run_with_a_window():
    from stepscope.analysis.trace.trace_evidence import analyze_traces
    from stepscope.pipeline.trace_views import trace_views

    window = trace_views(analyze_traces(TRACES / "cpu_train.pt.trace.json.gz"), from_window=True)
    return replace(build_report(synthetic_run(120)), traces=window)


def overridden_and_skipping_run():
    record = make_record(40)
    overrides = Overrides((Override("dataloader.num_workers", 2, applied=1),
                           Override("dataloader.pin_memory", True, applied=0, skipped=("no loader",))), 30, True)
    facts = replace(record.facts, overrides=overrides, skipped_samples=(SkippedSamples("shards", 7, (1, 4, 2)),))
    return build_report(replace(record, facts=facts))


def saved_job():
    return diagnose(load_run(DATA / "runs" / "straggler-two-ranks"), ReportOptions(perfetto=True))


def saved_run_with_stacks():
    return diagnose(load_run(DATA / "runs" / "small-batch-minor-input-wait"), ReportOptions(flame="forward"))


def traced_rank():
    return diagnose(load_traces(sorted((HTA / "critical_path" / "alexnet").glob("*.json.gz"))[0]))


def two_traced_ranks():
    return diagnose(load_traces([next((HTA / name).glob("*.json.gz")) for name in ("cpu_only", "large_integer_trace")]))


REPORTS = [empty_run, sampled_run, run_with_a_window, overridden_and_skipping_run, saved_job, saved_run_with_stacks,
           traced_rank, two_traced_ranks]


@pytest.fixture
def fixed_clock(monkeypatch):
    """TensorBoard stamps its first event with the time of writing."""
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)


@pytest.mark.parametrize("factory", REPORTS)
def test_every_output_is_the_same_without_the_library_only_fields(factory, tmp_path, fixed_clock):
    report = factory()
    blind, found = walled(report)
    assert {"Report.evidence", "Report.diagnosis"} <= found
    assert not foreign(blind), foreign(blind)
    expected = outputs(report, tmp_path)
    assert outputs(blind, tmp_path) == expected


def test_every_library_only_field_is_made_unreadable_in_some_report():
    """The reports above reach each of them (a multi-rank report, a trace report, a run's meta)."""
    found = set().union(*(walled(factory())[1] for factory in (saved_job, traced_rank)))
    assert found == LIBRARY_ONLY


def test_a_renderer_reading_a_view_field_made_unreadable_fails(tmp_path):
    """The check has teeth: the summary is read by every output of a run."""
    report = build_report(make_record(20))
    with pytest.raises(AssertionError, match=r"Report\.summary"):
        outputs(replace(report, summary=Unreadable("Report.summary")), tmp_path)


def test_an_analysis_object_in_an_untyped_view_field_is_found():
    report = build_report(make_record(20))
    leaked, _ = walled(replace(report, verification={"trials": (report.evidence,)}))
    assert foreign(leaked) == ["Report.verification['trials'][0]: RunEvidence"]


def test_the_arrays_of_a_view_are_its_own_values():
    """numpy arrays and builtins are plain values: nothing in them to find."""
    assert foreign(np.zeros(3)) == [] and foreign({"a": (1, "b")}) == []
