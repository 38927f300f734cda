"""`stepscope analyze` shows what bounds the step: the critical path in the terminal, JSON, HTML and
a Perfetto trace; hostile names stay text everywhere."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from stepscope.cli.main import main

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "traces" / "reference"
EVENT_SYNC = REFERENCE / "hta" / "critical_path" / "cuda_event_sync" / "event_sync_trace.json.gz"


def _hostile(tmp_path: Path) -> Path:
    """The event-sync trace with its heaviest operator renamed to markup and a script tag."""
    doc = json.loads(gzip.decompress(EVENT_SYNC.read_bytes()))
    for event in doc["traceEvents"]:
        if event.get("name") == "aten::empty":
            event["name"] = "<script>alert(1)</script>[bold]x[/bold]"
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps(doc))
    return path


def test_terminal_shows_what_bounds_the_step(capsys):
    assert main(["analyze", str(EVENT_SYNC)]) == 0
    out = capsys.readouterr().out
    assert "What bounds the step: its critical path (1 step," in out
    assert "the path waited: cudaEventSynchronize waited for stream 7" in out
    assert "Top critical-path segments" in out and "aten::empty" in out


def test_json_has_the_path_and_findings_carry_their_share(capsys):
    assert main(["analyze", str(EVENT_SYNC), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    path = doc["trace_analysis"]["ranks"][0]["critical_path"]
    assert abs(sum(path["bound_share"].values()) - 1) < 1e-9
    assert path["segments"][0]["name"] == "aten::empty" and path["shown_step"] == "ProfilerStep#100"
    assert "cudaEventSynchronize waited for stream 7" in path["syncs"]
    shares = doc["ranks"][0]["trace"]["critical_path"]
    assert shares["cpu"] == path["bound_share"]["cpu"]
    for finding in doc["findings"]:
        assert finding["path_share"] is None or 0 <= finding["path_share"] <= 1


def test_html_draws_the_path_and_escapes_trace_names(tmp_path):
    trace = _hostile(tmp_path)
    out = tmp_path / "page.html"
    assert main(["analyze", str(trace), "--html", "-o", str(out)]) == 0
    page = out.read_text()
    assert "What bounds the step: the critical path" in page and 'aria-label="critical path of one step"' in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_perfetto_marks_the_path_beside_the_trace(tmp_path, capsys):
    trace = _hostile(tmp_path)
    out = tmp_path / "path.json.gz"
    assert main(["analyze", str(trace), "--perfetto", str(out), "-o", str(tmp_path / "text.txt")]) == 0
    assert "critical path of ProfilerStep#100" in capsys.readouterr().err
    doc = json.loads(gzip.decompress(out.read_bytes()))
    original = json.loads(trace.read_text())["traceEvents"]
    events = doc["traceEvents"]
    assert events[: len(original)] == original  # the trace's own events, unchanged, first
    added = events[len(original):]
    stretches = [e for e in added if e["ph"] == "X"]
    flows = [e for e in added if e["ph"] in ("s", "f")]
    tracks = {e["args"]["name"] for e in added if e["ph"] == "M"}
    assert "[stepscope] critical path (stream 7)" in tracks
    assert len(flows) == 2 * (len(stretches) - 1) and {e["bp"] for e in flows if e["ph"] == "f"} == {"e"}
    assert {e["args"]["bound by"] for e in stretches} >= {"CPU (Python / framework)", "GPU compute"}
    assert all(e["pid"] in {o["pid"] for o in original} for e in stretches)  # beside the trace's own tracks


def test_perfetto_output_may_not_be_the_input(tmp_path, capsys):
    trace = _hostile(tmp_path)
    assert main(["analyze", str(trace), "--perfetto", str(trace)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is one of the input files" in err


def test_bad_path_steps_and_perfetto_targets_are_one_line_errors(tmp_path, capsys):
    assert main(["analyze", str(EVENT_SYNC), "--path-steps", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == "stepscope: error: --path-steps must be >= 0 (0: every step)\n"
    assert main(["analyze", str(EVENT_SYNC), "--perfetto", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a directory" in err
    assert main(["analyze", str(EVENT_SYNC), "--perfetto", str(tmp_path / "missing" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err


def test_perfetto_without_a_path_says_so_and_writes_nothing(tmp_path, capsys):
    """A CPU-only trace without operators that HTA would keep: no path, one line, no file."""
    cpu_only = REFERENCE / "hta" / "cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"
    out = tmp_path / "path.json"
    assert main(["analyze", str(cpu_only), "--perfetto", str(out), "-o", str(tmp_path / "text.txt")]) == 0
    assert "no critical path to mark" in capsys.readouterr().err and not out.exists()


def test_the_drawn_step_s_stretches_become_rows_only_where_an_output_draws_them():
    """The view holds the path's stretches as columns: the text and JSON outputs never make the rows
    (a long step's path holds ~80,000), and the rows, once made, are the summary's spans with their
    labels, in order; pickled (a view built in a child process) they are the same."""
    import pickle

    from stepscope.analysis.trace.critical_path import path_summary
    from stepscope.pipeline.trace_views import critical_path_view
    from stepscope.report.model import PathStretch
    from stepscope.traces.load import load_trace

    summary = path_summary(load_trace(EVENT_SYNC).events, steps=1)
    assert summary is not None and len(summary.spans) > 10
    view = critical_path_view(summary)
    assert view is not None
    stretches = view.stretches
    assert len(stretches) == len(summary.spans) and stretches._rows is None  # counted, not made
    expected = tuple(PathStretch(span.name, span.bound, summary.label(span.bound), span.ts_us, span.end_us, span.pid,
                                 span.tid, span.stream) for span in summary.spans)
    again = pickle.loads(pickle.dumps(view))
    assert again.stretches._rows is None
    assert tuple(stretches) == expected and stretches[0] == expected[0] and stretches[-2:] == expected[-2:]
    assert again.stretches == stretches == expected and hash(again.stretches) == hash(expected)
    assert any(span.name == "aten::empty" for span in stretches)


def test_text_and_json_outputs_never_make_the_stretch_rows(monkeypatch, capsys):
    from stepscope.report.model import PathStretches

    def refuse(self):
        raise AssertionError("an output made the stretch rows")

    monkeypatch.setattr(PathStretches, "rows", refuse)
    assert main(["analyze", str(EVENT_SYNC)]) == 0
    assert main(["analyze", "--format", "json", str(EVENT_SYNC)]) == 0
    assert "What bounds the step" in capsys.readouterr().out
