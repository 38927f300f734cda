"""diff's pipeline (stepscope.pipeline.compare): the history floor from quiet runs only, findings read
typed from report.json, one view for every output."""

from __future__ import annotations

import io
import json
import time

from stepscope.analysis.run.diff import setup_key
from stepscope.pipeline.compare import compare_runs, history_floor, saved_report
from stepscope.record.run_index import add_run
from stepscope.record.store import save_record
from stepscope.report.render import Output, render
from records import noisy_record


def _row(run_dir, key: str, step_time: float, busy: float | None) -> dict:
    return {"run_dir": str(run_dir), "started_at": time.time(), "script": "train.py", "argv": "", "tags": "[]",
            "setup_key": key, "step_time_s": step_time, "busy_share": busy}


def test_the_history_floor_leaves_out_runs_taken_beside_other_processes(tmp_path):
    """Three quiet repeats agree to 1 %; three more ran while the machine was busy (×1.5 apart): the
    floor is the quiet runs' (a real 25 % gain stays callable), and the loaded ones are said."""
    record = noisy_record(50, 1e6, 3e6, 1)
    key, index = setup_key(record), tmp_path / "index.sqlite"
    for number, (step, busy) in enumerate([(0.100, 0.02), (0.101, 0.0), (0.099, 0.05),
                                           (0.100, 0.45), (0.150, 0.60), (0.070, 0.31)]):
        add_run(_row(tmp_path / f"r{number}", key, step, busy), index)
    floor, source = history_floor(record, index)
    assert floor is not None and floor < 0.1, floor
    assert "measured on 3 identical runs" in source and "3 run(s) beside other processes left out" in source
    only_loaded = tmp_path / "loaded.sqlite"
    for number, (step, busy) in enumerate([(0.100, 0.45), (0.150, 0.60), (0.070, 0.31)]):
        add_run(_row(tmp_path / f"l{number}", key, step, busy), only_loaded)
    assert history_floor(record, only_loaded) == (None, None)


def test_findings_are_read_typed_from_report_json_and_every_output_comes_from_one_view(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, compute, seed in ((a, 3e6, 1), (b, 9e6, 2)):
        folder.mkdir()
        save_record(noisy_record(120, 1e6, compute, seed), folder / "record.rank0.json.gz")
    finding = {"rule_id": "gc.pauses", "family": "gc", "title": "GC <pauses>", "severity": "high", "impact": 0.2,
               "confidence": 0.9, "evidence": [], "prescriptions": [], "summary": ""}
    (b / "report.json").write_text(json.dumps({"findings": [finding], "evidence": {"mfu": {"value": 0.25},
                                                                                 "foreign": {"cpu_share": 0.02}}}))
    findings, mfu, busy = saved_report(b)
    assert [item.rule_id for item in findings] == ["gc.pauses"] and findings[0].severity.name == "HIGH"
    assert (mfu, busy) == (0.25, 0.02)
    findings_a, _, _ = saved_report(a)  # no report.json: diagnosed here (a typed Report)
    assert all(hasattr(item, "severity") for item in findings_a)
    view = compare_runs([a], [b], index=None, gate_threshold=0.1, histogram=True)
    assert view.row("step_time").verdict == "slower" and view.gate is not None and view.gate.failed
    text = io.StringIO()
    render(view, "text", Output(stream=text, width=120))
    document = io.StringIO()
    render(view, "json", Output(stream=document))
    page = tmp_path / "diff.html"
    render(view, "html", Output(path=page))
    data = json.loads(document.getvalue())
    assert data["gate"]["status"] == "failed" and data["rows"][0]["verdict"] == "slower"
    assert "gate: FAILED" in text.getvalue() and "appeared: [HIGH] GC <pauses>" in text.getvalue()
    assert "GC &lt;pauses&gt;" in page.read_text() and "diff-hist" in page.read_text()
