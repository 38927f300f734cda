"""torch.compile under capture, for real (CPU, backend aot_eager): capture changes no compilation and
no loss, and the zoo's compiled scenarios get the verdicts their planted cause calls for.

Compile findings rest on what dynamo itself reports, not on CPU timing, so these run with the
parallel tests; a machine crowded by the other tests may put ``foreign_load`` first, which the
verdict tests accept as the zoo tests do."""

from __future__ import annotations

import json


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
    bare = run_python(["storm.py"], tmp_path, timeout=240)
    assert bare.returncode == 0, bare.stderr[-2000:]
    captured = run_cli(["run", "--no-summary", "-o", "out", "storm.py"], tmp_path, timeout=240)
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


def demo(name: str, tmp_path, summary: bool = False):
    result = run_cli(["demo", name, "-o", name, *(() if summary else ("--no-summary",))], tmp_path, timeout=240,
                     env={"COLUMNS": "140"})
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads((tmp_path / name / "report.json").read_text())
    return (report, result.stderr) if summary else report


def top_or_crowded(report: dict) -> dict | None:
    top = report["findings"][0]
    if top["family"] == "foreign_load":
        return next((item for item in report["findings"] if item["family"] == "compile"), None)
    return top


def test_a_recompile_storm_names_the_changing_dimension_and_the_limit(tmp_path):
    report, summary = demo("compile-recompiles", tmp_path, summary=True)
    assert "Compile" in summary and "runs eager since step" in summary  # the summary's compile row
    top = top_or_crowded(report)
    assert top["rule_id"] == "compile.recompile_limit", [item["title"] for item in report["findings"]]
    assert "tokens, dim 1" in top["title"] and "recompile limit (8)" in top["title"]
    families = {item["family"] for item in report["findings"]}
    assert not families & {"launch_overhead", "periodic_stall"}  # its slow steps are the compilations


def test_a_graph_break_is_named_at_its_line(tmp_path):
    report = demo("compile-graph-break", tmp_path)
    top = top_or_crowded(report)
    assert top["rule_id"] == "compile.graph_breaks", [item["title"] for item in report["findings"]]
    assert "compile_graph_break.py:24" in top["title"] and "item()" in top["title"]
    assert any("torch.where" in item["action"] for item in top["prescriptions"])


def test_compile_time_dominates_a_short_job_and_is_a_note_in_a_long_one(tmp_path):
    short = top_or_crowded(demo("compile-short", tmp_path))
    assert short["rule_id"] == "compile.compile_time" and short["severity"] in ("high", "critical")
    healthy = demo("compile-healthy", tmp_path)
    notes = [item for item in healthy["findings"] if item["family"] == "compile"]
    assert all(item["severity"] in ("low", "info") for item in notes), notes
    assert healthy["findings"][0]["family"] in ("healthy", "foreign_load")
    text = json.dumps(healthy["findings"])
    assert "model = torch.compile(model)" not in text  # it is compiled
