"""torch.compile under capture, for real (CPU, backend aot_eager): capture changes no compilation and
no loss, and the zoo's compiled scenarios get the verdicts their planted cause calls for.

Compile findings rest on what dynamo itself reports, not on CPU timing, so these run with the
parallel tests; a machine crowded by the other tests may put ``foreign_load`` first, which the
verdict tests accept as the zoo tests do."""

from __future__ import annotations

import json

import pytest
from support import run_cli, run_python, write_script
from stepscope.record.store import load_record

STORM = """
    import random, sys, torch
    from torch import nn
    torch.manual_seed(0)
    lengths = random.Random(0)
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(500, 16)
            self.head = nn.Linear(16, 1)
        def forward(self, tokens):
            return self.head(self.emb(tokens).mean(1))
    model = torch.compile(Model(), dynamic=False, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(14):
        tokens = torch.randint(0, 500, (4, lengths.randint(8, 64)))
        opt.zero_grad()
        loss = model(tokens).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
    from torch._dynamo.utils import counters
    print("graphs", counters["stats"]["unique_graphs"], "losses", " ".join(losses))
"""


def test_capture_changes_no_compilation_and_no_loss(tmp_path):
    write_script(tmp_path, "storm.py", STORM)
    bare = run_python(["storm.py"], tmp_path, timeout=240, warm=True)
    assert bare.returncode == 0, bare.stderr[-2000:]
    captured = run_cli(["run", "--no-summary", "-o", "out", "storm.py"], tmp_path, timeout=240, warm=True)
    assert captured.returncode == 0, captured.stderr[-2000:]
    assert captured.stdout == bare.stdout  # as many compiled graphs, bit-identical losses
    assert "global hooks" not in captured.stderr  # no warning of ours in the script's stderr
    graphs = int(bare.stdout.split()[1])
    facts = load_record(tmp_path / "out").facts.compile
    compiled = [item for item in facts.compilations if item.failure is None]
    assert len(compiled) == graphs == 8  # dynamo's limit, with and without capture
    assert compiled[0].function == "forward" and compiled[0].trigger == ""
    assert "size mismatch at index 1" in compiled[1].trigger
    assert facts.limit_hits and facts.limit_hits[0].function == "forward"
    steps = load_record(tmp_path / "out").steps
    assert steps.compile_ns[:8].min() > 0 and (steps.compile_ns[9:] == 0).all()
    total = steps.data_wait_ns + steps.forward_ns + steps.backward_ns + steps.optimizer_ns + \
        steps.communication_ns + steps.other_ns + steps.compile_ns
    assert (total == steps.duration_ns).all()  # the compile phase is its own part of the step


def demo(name: str, tmp_path, summary: bool = False, warm: bool = False):
    """``warm``: forked from the test's warm interpreter, which has imported dynamo: for the checks of
    what dynamo reports, not of how long the first compilation took."""
    result = run_cli(["demo", name, "-o", name, *(() if summary else ("--no-summary",))], tmp_path, timeout=240,
                     env={"COLUMNS": "140"}, warm=warm)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / name / "report.json").read_text())
    return (report, result.stderr) if summary else report


def top_or_crowded(report: dict) -> dict | None:
    top = report["findings"][0]
    if top["family"] == "foreign_load":
        return next((item for item in report["findings"] if item["family"] == "compile"), None)
    return top


def test_a_recompile_storm_names_the_changing_dimension_and_the_limit(tmp_path):
    report, summary = demo("compile-recompiles", tmp_path, summary=True, warm=True)
    assert "Compile" in summary and "runs eager since step" in summary  # the summary's compile row
    top = top_or_crowded(report)
    assert top["rule_id"] == "compile.recompile_limit", [item["title"] for item in report["findings"]]
    assert "tokens, dim 1" in top["title"] and "recompile limit (8)" in top["title"]
    families = {item["family"] for item in report["findings"]}
    assert not families & {"launch_overhead", "periodic_stall"}  # its slow steps are the compilations


def test_a_graph_break_is_named_at_its_line(tmp_path):
    report = demo("compile-graph-break", tmp_path)  # its compile time is a finding here, timed cold
    found = next(item for item in report["findings"] if item["rule_id"] == "compile.graph_breaks")
    assert "compile_graph_break.py:24" in found["title"] and "item()" in found["title"]
    assert " inside " not in found["title"]  # the break is in the user's own code
    assert any("torch.where" in item["action"] for item in found["prescriptions"])
    # not priced by the compile time (a finding of its own): its steady-state cost is not timed
    assert found["impact_basis"].startswith("not priced"), found["impact_basis"]
    timed = next(item for item in report["findings"] if item["rule_id"] == "compile.compile_time")
    assert found["impact"] < timed["impact"]


@pytest.mark.serial  # the healthy verdict: a loaded machine adds findings above the compile note
def test_compile_time_dominates_a_short_job_and_is_a_note_in_a_long_one(tmp_path):
    short = top_or_crowded(demo("compile-short", tmp_path))
    assert short["rule_id"] == "compile.compile_time" and short["severity"] in ("high", "critical")
    healthy = demo("compile-healthy", tmp_path)
    notes = [item for item in healthy["findings"] if item["family"] == "compile"]
    assert all(item["severity"] in ("low", "info") for item in notes), notes
    assert healthy["findings"][0]["family"] in ("healthy", "foreign_load"), [
        (item["title"], item["severity"]) for item in healthy["findings"]]
    text = json.dumps(healthy["findings"])
    assert "model = torch.compile(model)" not in text  # it is compiled


ENCODER = """
    import os, torch
    from torch import nn
    torch.manual_seed(0)
    CAUSAL = os.environ.get("IS_CAUSAL") == "1"
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 16)
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0)
            self.encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)
            self.head = nn.Linear(16, 100)
        def forward(self, src, mask):
            h = self.emb(src)
            h = self.encoder(h, mask=mask, is_causal=True) if CAUSAL else self.encoder(h, mask=mask)
            return self.head(h)
    model = Model()
    model.compile(backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10):
        src = torch.randint(0, 100, (12, 2))
        loss = model(src, nn.Transformer.generate_square_subsequent_mask(12)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == 4:  # an evaluation: no grad and another length, as word_language_model's
            with torch.no_grad():
                model(torch.randint(0, 100, (9, 2)), nn.Transformer.generate_square_subsequent_mask(9))
    from torch._dynamo.utils import counters
    print("breaks", sum(counters["graph_break"].values()))
"""


def test_a_graph_break_in_torch_is_named_at_the_users_line_with_the_library_frame_as_detail(tmp_path):
    """nn.TransformerEncoder with a causal mask breaks inside torch (transformer.py,
    _detect_is_causal_mask); torch 2.13's logged traceback even drops the user's forward (it merges
    consecutive frames named ``forward``). The finding names the user's call, the library frame as
    detail, and the fix there (is_causal=True), which removes the break for real."""
    write_script(tmp_path, "model.py", ENCODER)
    line = next(number for number, text in enumerate((tmp_path / "model.py").read_text().splitlines(), 1)
                if "self.encoder(h, mask=mask" in text)
    result = run_cli(["run", "--trace", "--no-summary", "-o", "out", "model.py"], tmp_path, timeout=300, warm=True)
    assert result.returncode == 0, result.stderr[-2000:]
    facts = load_record(tmp_path / "out").facts.compile
    (brk,) = facts.graph_breaks
    assert brk.file.replace("\\", "/").endswith("torch/nn/modules/transformer.py") and brk.function == \
        "_detect_is_causal_mask"
    assert (brk.user_file, brk.user_line) == (str(tmp_path / "model.py"), line), brk
    assert "self.encoder(h, mask=mask" in brk.user_code
    # every guard that failed before the evaluation's recompilation, not only dynamo's first
    guards = [guard for item in facts.compilations for guard in item.guard_failures]
    assert "global state: grad_mode" in guards, guards
    assert "src: size (dim 0) 12 -> 9" in guards, guards
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    finding = next(item for item in report["findings"] if item["rule_id"] == "compile.graph_breaks")
    assert f"model.py:{line} inside torch/nn/modules/transformer.py:" in finding["title"], finding["title"]
    assert "is_causal=True" in finding["prescriptions"][0]["action"]
    assert f"model.py:{line}" in finding["prescriptions"][0]["action"]
    assert "torch.where" not in json.dumps(finding["prescriptions"])  # no rewrite of torch's own code
    # priced by what it costs in the steady state — the traced time between the graphs — never by
    # the compile time
    assert finding["impact_basis"].startswith("measured in the profiled steps"), finding["impact_basis"]
    between = next(item for item in finding["evidence"] if item["metric"] == "between_graphs_us_per_step")
    assert between["value"] > 0 and "a step runs between the graphs" in finding["title"]
    # the prescription is right: with is_causal=True the same model compiles without a break
    fixed = run_python(["model.py"], tmp_path, env={"IS_CAUSAL": "1"}, timeout=300, warm=True)
    assert fixed.returncode == 0 and fixed.stdout.split() == ["breaks", "0"], fixed.stdout + fixed.stderr[-2000:]
