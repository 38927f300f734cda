"""torch.compile, diagnosed from synthetic compile facts: what each rule says and what it does not."""

from __future__ import annotations

from dataclasses import replace

import pytest

from diagnosis_records import ctx_of, make_record
from stepscope.analysis.run.compile_summary import changing_input, summarize_compile
from stepscope.capture.compile_watch import break_reason, compile_facts
from stepscope.diagnosis.engine import run_rules
from stepscope.diagnosis.rules.compile import compile_time, graph_breaks, recompile_limit, recompiling
from stepscope.record.run import CaptureFacts, Compilation, CompileFacts, GraphBreak, RecompileLimitHit

SHAPE = "0/{n}: tensor 'L['tokens']' size mismatch at index 1. expected {a}, actual {b}"


def compiled_record(compilations, breaks=(), hits=(), steps=40, step_s=0.01, compile_s_per=0.15):
    record = make_record(steps=steps, step_s=step_s)
    start = record.steps.start_ns
    facts = CompileFacts(sources=("test",), compilations=tuple(
        Compilation(f"0/{index}", "0", "forward", "/m/model.py", 12, int(start[index]) + 1000,
                    int(compile_s_per * 1e9), trigger) for index, trigger in enumerate(compilations)),
        graph_breaks=tuple(breaks), limit_hits=tuple(hits), recompile_limit=8)
    columns = record.steps.columns()
    columns["compile_ns"] = columns["compile_ns"].copy()
    for index in range(len(compilations)):
        columns["compile_ns"][index] = int(compile_s_per * 1e9)
        columns["duration_ns"][index] += int(compile_s_per * 1e9)
    from stepscope.record.run import StepTable

    return replace(record, steps=StepTable.from_columns(columns),
                   facts=replace(CaptureFacts(), compile=facts))


def storm(count=8, hit=True):
    triggers = [""] + [SHAPE.format(n=index, a=20 + index, b=21 + index) for index in range(count - 1)]
    record = compiled_record(triggers)
    hits = [RecompileLimitHit(int(record.steps.start_ns[count]) + 10, "forward", "/m/model.py", 12, 8,
                              SHAPE.format(n=count - 1, a=70, b=120))] if hit else []
    return replace(record, facts=replace(record.facts, compile=replace(record.facts.compile, limit_hits=tuple(hits))))


def test_the_changing_input_and_dimension_come_from_the_failed_guards():
    assert changing_input((SHAPE.format(n=0, a=1, b=2), SHAPE.format(n=1, a=2, b=3))) == "tokens, dim 1"
    assert changing_input(("0/0: tensor 'x' stride mismatch at index 0. expected 4, actual 8",)) == "x, dim 0"
    assert changing_input(("0/0: ___check_obj_id(L['self'].mode, 140)",)) is None


def test_a_frame_that_hit_the_limit_is_said_to_run_eager_from_that_step():
    summary = summarize_compile(storm())
    (frame,) = summary.frames
    assert frame.compilations == 8 and frame.recompiles == 7 and frame.limit_hit_step == 8
    assert frame.changing == "tokens, dim 1" and summary.limit_hits == (frame,)
    finding = recompile_limit(ctx_of(storm()))
    assert finding.severity.name in ("HIGH", "CRITICAL") and "at step 8" in finding.title
    assert "tokens, dim 1" in finding.title and "recompile limit (8)" in finding.title
    actions = " ".join(item.action for item in finding.prescriptions)
    assert "dynamic=True" in actions and "mark_dynamic(tokens, 1)" in actions and "BucketBatchSampler" in actions
    assert recompiling(ctx_of(storm())) is None  # the limit finding says it
    assert compile_time(ctx_of(storm())) is None  # ... with the compile time


def test_recompiling_below_the_limit_and_the_expected_second_compile():
    finding = recompiling(ctx_of(storm(count=5, hit=False)))
    assert finding is not None and "recompiles forward() 4 times: tokens, dim 1 changes" in finding.title
    assert finding.impact_basis.startswith("measured over all the run's steps")
    # one dynamic recompile after the first shape is dynamo's normal reaction: not recompiling
    assert recompiling(ctx_of(storm(count=2, hit=False))) is None


def test_a_graph_break_names_its_line_and_the_rewrite_its_reason_calls_for():
    record = compiled_record(["", ""], breaks=[GraphBreak("/m/model.py", 24, "Unsupported Tensor.item() call with "
                                                          "capture_scalar_outputs=False", 1, 0)])
    finding = graph_breaks(ctx_of(record))
    assert "model.py:24" in finding.title and "Tensor.item()" in finding.title
    assert any("torch.where" in item.action and "torch.cond" in item.action for item in finding.prescriptions)
    assert any("fullgraph=True" in item.action for item in finding.prescriptions)
    printing = replace(record, facts=replace(record.facts, compile=replace(
        record.facts.compile, graph_breaks=(GraphBreak("/m/model.py", 30, "Unsupported builtin print", 2, 0),))))
    assert "print/logging" in graph_breaks(ctx_of(printing)).prescriptions[0].action


def test_compile_time_is_a_low_note_unless_it_takes_a_large_share():
    short = compile_time(ctx_of(compiled_record([""], compile_s_per=1.5)))
    long = compile_time(ctx_of(compiled_record([""], steps=400, compile_s_per=0.3)))
    assert short.severity.name in ("HIGH", "CRITICAL") and "save_cache_artifacts" in str(short.prescriptions)
    assert long.severity.name == "LOW"
    assert compile_time(ctx_of(make_record())) is None  # nothing compiled


def test_a_compiled_model_is_not_told_to_compile_and_the_storm_is_not_launch_overhead():
    findings = run_rules(ctx_of(storm())).findings
    assert findings[0].family == "compile"
    assert "torch.compile(model)" not in " ".join(item.action for finding in findings for item in finding.prescriptions)


def test_break_reasons_keep_the_specific_line():
    text = ("Encountered graph break when attempting to trace CALL: a function call, e.g. f(x, y):\n\n"
            "Unsupported Tensor.item() call with capture_scalar_outputs=False\n  Explanation: …")
    assert break_reason(text) == "Unsupported Tensor.item() call with capture_scalar_outputs=False"
    assert break_reason("Data-dependent jump\n") == "Data-dependent jump"


def test_compile_facts_join_dynamo_metrics_with_the_callbacks_timing():
    raw = {"sources": ["x"], "spans": [[100, 400, "0/0", "dynamo"], [900, 950, "0/1", "dynamo"]],
           "compilations": [{"compile_id": "0/0", "co_name": "forward", "co_filename": "/m.py", "co_firstlineno": 3,
                             "entire_frame_compile_time_s": 9.0, "recompile_reason": None},
                            {"compile_id": "0/1", "co_name": "forward", "co_filename": "/m.py", "co_firstlineno": 3,
                             "recompile_reason": "0/0: tensor 'x' size mismatch at index 0. expected 1, actual 2"},
                            {"compile_id": "0/2", "co_name": None, "fail_type": "Unsupported",
                             "fail_reason": "Dynamo recompile limit exceeded", "entire_frame_compile_time_s": 0.001}],
           "graph_breaks": [[5, "/m.py", 7, "Unsupported print"], [6, "/m.py", 7, "Unsupported print"]],
           "limit_hits": [[990, "'forward' (/m.py:3)", 8, "0/1: tensor 'x' size mismatch"]],
           "counters": {}, "recompile_limit": 8}
    facts = compile_facts(raw)
    first, second, failed = facts.compilations
    assert (first.start_ns, first.duration_ns, first.trigger) == (100, 300, "")  # our clock wins over dynamo's
    assert second.trigger.startswith("0/0: tensor 'x'") and failed.failure.startswith("Unsupported")
    assert failed.duration_ns == 1_000_000 and failed.start_ns == -1
    assert facts.graph_breaks == (GraphBreak("/m.py", 7, "Unsupported print", 2, 5),)
    (hit,) = facts.limit_hits
    assert (hit.function, hit.line, hit.limit) == ("forward", 3, 8)
    assert compile_facts(None) is None


@pytest.mark.parametrize("rule", [recompile_limit, recompiling, graph_breaks, compile_time])
def test_nothing_compiled_is_no_compile_finding(rule):
    assert rule(ctx_of(make_record())) is None


def test_a_trace_of_compiled_code_shows_its_graph_breaks_and_recompiled_variants():
    from pathlib import Path

    from stepscope.analysis.trace.trace_evidence import analyze_traces
    from records import report_of

    path = Path(__file__).resolve().parents[2] / "data" / "traces" / "cpu_compiled_graph_break.pt.trace.json.gz"
    report = report_of(traces=analyze_traces(str(path)))
    regions = report.traces.analysis.ranks[0].compiled
    assert regions.graphs_per_step == 2.0 and regions.variants == ("0/0", "1/1")
    assert regions.recompiled_frames == ("1",) and regions.cache_lookup_us_per_step > 0
    finding = next(item for item in report.findings if item.family == "compile")
    assert "2 compiled graphs per step" in finding.title and "frame(s) 1" in finding.title
    # priced by the time between the graphs of each compiled call: (1142.1 - 1007.7) + (3468.1 - 3360.6)
    # + (5473.7 - 5380.9) µs over 3 steps, the eager .item() and the resume frame's guard check
    assert regions.between_graphs_us_per_step == pytest.approx(111.5, abs=0.2)
    assert finding.impact == pytest.approx(111.5 / regions.step_us, rel=0.01)
    assert finding.impact_basis.startswith("measured in the profiled steps") and "112 µs a step" in finding.title


TORCH_FILE = "/venv/lib/python3.11/site-packages/torch/nn/modules/transformer.py"


def test_a_break_in_library_code_is_named_at_the_users_line_with_the_fix_there():
    brk = GraphBreak(TORCH_FILE, 1245, "Unsupported Tensor.item() call with capture_scalar_outputs=False", 2, 0,
                     "/m/model.py", 142, "output = self.encoder(src, mask=self.src_mask)", "_detect_is_causal_mask")
    finding = graph_breaks(ctx_of(compiled_record(["", ""], breaks=[brk])))
    assert "model.py:142 inside torch/nn/modules/transformer.py:1245 (_detect_is_causal_mask)" in finding.title
    first = finding.prescriptions[0]
    assert first.action.startswith("At model.py:142 (`output = self.encoder(src, mask=self.src_mask)`): pass "
                                   "is_causal=True")
    assert "torch.where" not in " ".join(item.action for item in finding.prescriptions)  # torch's code is not the user's
    other = replace(brk, file="/venv/lib/python3.11/site-packages/lib/x.py", line=9, function="check")
    action = graph_breaks(ctx_of(compiled_record(["", ""], breaks=[other]))).prescriptions[0].action
    assert action.startswith("Change the call at model.py:142") and "lib/x.py:9 (check)" in action


def test_a_graph_break_is_priced_by_its_steady_state_cost_never_by_the_compile_time():
    brk = GraphBreak("/m/model.py", 24, "Unsupported Tensor.item() call", 1, 0, "/m/model.py", 24)
    record = compiled_record(["", ""], breaks=[brk], compile_s_per=2.0)  # compiling: most of the run
    finding = graph_breaks(ctx_of(record))
    assert finding.impact == 0 and finding.impact_basis.startswith("not priced")
    assert "not priced" in finding.title and finding.severity.name == "LOW"
    assert compile_time(ctx_of(record)) is not None  # the compile time is its own finding
    # the frames a break adds are named, but dynamo's guard latency (one check after a cache flush,
    # at compile time) is not a per-step cost: still not priced
    facts = record.facts.compile
    resume = Compilation("1/0", "1", "torch_dynamo_resume_in_forward_at_24", "/m/model.py", 24,
                         int(record.steps.start_ns[1]) + 1000, 1000, "", guard_latency_us=2000.0)
    added = replace(record, facts=replace(record.facts, compile=replace(
        facts, compilations=(*facts.compilations, resume))))
    finding = graph_breaks(ctx_of(added))
    assert summarize_compile(added).break_cost.resume_frames == 1
    assert finding.impact == 0 and finding.impact_basis.startswith("not priced")
    assert any(item.metric == "frames_after_breaks" and item.value == 1 for item in finding.evidence)


def test_every_failed_guard_is_listed_by_count_not_only_dynamos_first():
    triggers = ["", "0/0: GLOBAL_STATE changed: grad_mode", "0/1: tensor 'src' size mismatch at index 0",
                "0/2: tensor 'src' size mismatch at index 0"]
    guards = [(), ("global state: grad_mode", "src: size (dim 0) 12 -> 9", "mask: size (dim 0) 12 -> 9"),
              ("src: size (dim 0) 12 -> 10",), ("global state: grad_mode", "src: size (dim 0) 12 -> 9")]
    record = compiled_record(triggers)
    facts = record.facts.compile
    record = replace(record, facts=replace(record.facts, compile=replace(facts, compilations=tuple(
        replace(item, guard_failures=found) for item, found in zip(facts.compilations, guards)))))
    (frame,) = summarize_compile(record).frames
    assert frame.guard_counts[0] == ("global state: grad_mode", 2)
    assert dict(frame.guard_counts) == {"global state: grad_mode": 2, "src: size (dim 0) 12 -> 9": 2,
                                        "mask: size (dim 0) 12 -> 9": 1, "src: size (dim 0) 12 -> 10": 1}
    finding = recompiling(ctx_of(record))
    shown = [item.value for item in finding.evidence if item.metric == "failed_guard"]
    assert "global state: grad_mode" in shown and "mask: size (dim 0) 12 -> 9" in shown
    assert "global state: grad_mode (2×)" in finding.summary
    assert "2 of the recompilations came with a switch between training and evaluation" in finding.summary


def test_the_compile_caches_are_said_cold_or_warm_with_what_a_warm_run_pays():
    record = compiled_record([""], compile_s_per=1.5)
    facts = record.facts.compile
    cold = replace(record, facts=replace(record.facts, compile=replace(
        facts, counters={"caches": {"fx_miss": 2, "aot_miss": 1}},
        compilations=tuple(replace(item, backend_ns=1_200_000_000) for item in facts.compilations))))
    summary = summarize_compile(cold)
    assert (summary.cache_state, summary.cache_misses) == ("cold", 3)
    assert summary.warm_compile_s == pytest.approx(0.3)
    finding = compile_time(ctx_of(cold))
    assert "with cold compile caches" in finding.title and "a warm run pays about 300.0 ms" in finding.summary
    warm = replace(cold, facts=replace(cold.facts, compile=replace(cold.facts.compile,
                                                                    counters={"caches": {"fx_hit": 2}})))
    assert summarize_compile(warm).cache_state == "warm"
    assert "This is what a warm run pays" in compile_time(ctx_of(warm)).summary
    assert summarize_compile(record).cache_state is None  # no cache consulted (aot_eager)


def test_compile_facts_keep_the_user_frame_and_give_it_to_duplicates_logged_without_a_stack():
    raw = {"sources": [], "spans": [], "compilations": [
        {"compile_id": "0/0", "co_name": "forward", "co_filename": "/m.py", "co_firstlineno": 3,
         "backend_compile_time_s": 1.0, "cache_hits": 0, "cache_misses": 1},
        {"compile_id": "0/0", "co_name": "forward", "backend_compile_time_s": 0.5, "cache_hits": 0, "cache_misses": 1},
        {"compile_id": "0/1", "co_name": "forward", "co_filename": "/m.py", "co_firstlineno": 3,
         "recompile_reason": "0/0: GLOBAL_STATE changed: grad_mode"}],
        "guard_failures": {"0/1": ["global state: grad_mode", "x: size (dim 0) 4 -> 5"]},
        "graph_breaks": [[5, TORCH_FILE, 1245, "Unsupported Tensor.item()", "/m.py", 9, "self.encoder(x, mask=m)",
                          "_detect_is_causal_mask"],
                         [6, TORCH_FILE, 1245, "Unsupported Tensor.item()", "", 0, "", ""]],
        "limit_hits": [], "counters": {}, "recompile_limit": 8}
    facts = compile_facts(raw)
    first, second = facts.compilations
    assert (first.backend_ns, first.cache_misses) == (1_500_000_000, 2)  # the lazy backward's entry joins it
    assert second.guard_failures == ("global state: grad_mode", "x: size (dim 0) 4 -> 5")
    (brk,) = facts.graph_breaks
    assert (brk.count, brk.user_file, brk.user_line, brk.function) == (2, "/m.py", 9, "_detect_is_causal_mask")


def test_library_files_and_the_users_deepest_frame():
    from stepscope.capture.compile_watch import is_library_file, user_frame

    assert is_library_file(TORCH_FILE) and is_library_file("<frozen runpy>")
    assert not is_library_file("/home/me/project/model.py")
    stack = [("/home/me/project/train.py", 30, "<module>", "out = model(x)"),
             ("/home/me/project/model.py", 142, "forward", "output = self.encoder(src, mask=m)"),
             (TORCH_FILE, 535, "forward", "is_causal = _detect_is_causal_mask(mask, is_causal, seq_len)"),
             (TORCH_FILE, 1245, "_detect_is_causal_mask", "make_causal = bool(...)")]
    assert user_frame(TORCH_FILE, 1245, "", stack) == ("/home/me/project/model.py", 142,
                                                       "output = self.encoder(src, mask=m)", "_detect_is_causal_mask")
    assert user_frame("/home/me/project/model.py", 24, "") == ("/home/me/project/model.py", 24, "", "")
    assert user_frame(TORCH_FILE, 1245, "Graph break (user stack suppressed …)") is None
