"""torch.compile, diagnosed: the recompile limit, recompilations, graph breaks, compile time.

Evidence: :class:`~stepscope.analysis.run.compile_summary.CompileSummary` (``ev.compile``),
built from what capture read of dynamo itself (compilation callbacks and metrics, graph-break and
recompile-limit log records; :mod:`stepscope.capture.compile_watch`), and the steps.

- ``compile.recompile_limit``: a frame hit ``torch._dynamo.config.recompile_limit`` and runs eager
  from then on — HIGH whatever it costs, because the user believes the model is compiled.
- ``compile.recompiling``: a frame compiled more than twice: which input and dimension the failed
  guards name, and the time it cost.
- ``compile.graph_breaks``: the compiled code broke into several graphs: each break's reason, the
  line of the user's code that reaches it (a break inside torch or another library is named at
  the deepest frame in the user's files, the library frame as detail) and the rewrite of *that*
  line its reason calls for. Its price would be what it costs in the steady state — the eager code
  between the graphs, the added guard checks, the recompilations of the code after it; a run record
  times none of them per step (dynamo's ``guard_latency_us`` is a one-shot check after a cache
  flush at compile time, not a per-step cost), so the finding is LOW and says "not priced", with the
  frames and recompilations it adds as evidence. Compile time is never its price: removing a break
  does not remove the compilation (on word_language_model, removing one made the epoch slower).
- ``compile.compile_time``: compiling took a large share of this run (≥ 20 %: a short job or many
  compilations); a LOW note below that. It says whether the compile caches were cold or warm and
  what a warm run would still pay (the compile time less the backend's, which a hit loads).

The engine's precedence lets a recompiling or eager-falling-back run not also be called
launch-bound, stalling or healthy (``SUPERSEDES``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stepscope.analysis.bundle import RunEvidence
from stepscope.diagnosis.family import FamilyEntry
from stepscope.diagnosis.findings import Evidence, Finding, Prescription, Severity, severity_for_impact
from stepscope.diagnosis.rules import _common as common

if TYPE_CHECKING:  # a run record's compile facts only (`analyze` of a trace loads none)
    from stepscope.analysis.run.compile_summary import BreakSummary, CompileSummary, FrameCompiles

#: More compilations than this for one frame is recompiling (the first compile and one dynamic
#: recompile, dynamo's default reaction to a second shape, are expected).
RECOMPILES_NORMAL = 1
#: Compile time above this share of the run is worth acting on (a high finding at 20 %: XProf's
#: HIGH level for any one category).
COMPILE_SHARE_HIGH = 0.20
COMPILE_SHARE_NOTE = 0.02
#: Compile time is spent in the first steps, which the steady state leaves out: its share is of the
#: whole run's step time (shown so, and not capped by the steady state's phases).
RUN_BASIS = "measured over all the run's steps (compiling happens in the first ones, outside the steady state)"
#: Risk weight of a frame that fell back to eager when its eager cost was not measured.
EAGER_IMPACT = 0.2


def _summary(ev: RunEvidence) -> CompileSummary | None:
    return ev.compile


def recompile_limit(ev: RunEvidence) -> Finding | None:
    summary = _summary(ev)
    if summary is None or not summary.limit_hits:
        return None
    frame = summary.limit_hits[0]
    step = frame.limit_hit_step if frame.limit_hit_step is not None and frame.limit_hit_step >= 0 else None
    evidence = [Evidence("compilations", frame.compilations, frame.limit, "compile", "count",
                         f"{frame.label}, recompile limit {frame.limit}"),
                Evidence("eager_since_step", step if step is not None else "before the first step", None,
                         "compile", "step", frame.label)]
    if frame.triggers:
        evidence.append(Evidence("last_guard_failure", frame.triggers[-1], None, "compile", "text", frame.label))
    for guard, count in frame.guard_counts[:6]:
        evidence.append(Evidence("failed_guard", guard, None, "compile", "text",
                                 f"{count} of {frame.recompiles} recompilations"))
    impact, basis = EAGER_IMPACT, "estimate: the frame's eager cost was not measured against its compiled steps"
    share = frame.compile_s / summary.run_s if summary.run_s > 0 else 0.0
    if share > impact:  # the compilations it made before giving up cost more than the estimate
        impact, basis = share, RUN_BASIS
    evidence.append(Evidence("compile_s", round(frame.compile_s, 3), None, "compile", "s",
                             f"{frame.compilations} compilations, {common.pct(share)} of the run's step time"))
    extra = ""
    if summary.speedup is not None and summary.eager_step_s is not None and summary.compiled_step_s is not None:
        eager_cost = max(0.0, 1.0 - summary.compiled_step_s / summary.eager_step_s)
        if eager_cost >= impact:
            impact, basis = eager_cost, "measured"
        extra = (f" Its eager steps take {common.ms(summary.eager_step_s)} against {common.ms(summary.compiled_step_s)} "
                 f"compiled (×{summary.speedup:.2f}).")
        evidence.append(Evidence("eager_over_compiled", round(summary.speedup, 3), None, "steps", "x",
                                 "median step after the fall-back over the compiled steps before it"))
    changing = f" the guards say {frame.changing} changes" if frame.changing else ""
    at = f" at step {step}" if step is not None else ""
    title = (f"torch.compile gave up on {frame.function}(){at}: {frame.compilations} compilations"
             + (f" as {frame.changing} changed" if frame.changing else "")
             + f" hit the recompile limit ({frame.limit}), new input shapes run eager; compiling took "
             f"{common.ms(frame.compile_s)} ({common.pct(share)} of the run)")
    summary_text = (f"Dynamo compiled {frame.label} {frame.compilations} times —{changing or ' each for a new guard failure'} "
                    f"— until it hit torch._dynamo.config.recompile_limit ({frame.limit}); from then on a call whose "
                    f"guards match none of the {frame.compilations} compiled variants runs without compilation, while "
                    f"the script still looks compiled.{extra}")
    return common.finding("compile.recompile_limit", "compile", title, impact, 0.9, evidence,
                          _shape_prescriptions(frame), summary_text, severity=max(Severity.HIGH,
                                                                                  severity_for_impact(impact)),
                          impact_basis=basis, claims=("compute",))


def recompiling(ev: RunEvidence) -> Finding | None:
    summary = _summary(ev)
    if summary is None:
        return None
    frames = [item for item in summary.frames if item.recompiles > RECOMPILES_NORMAL and item.limit_hit_step is None]
    if not frames:
        return None
    frame = max(frames, key=lambda item: item.recompiles)
    recompile_s = frame.compile_s * frame.recompiles / max(frame.compilations, 1)
    share = frame.compile_s / summary.run_s if summary.run_s > 0 else 0.0
    evidence = [Evidence("recompilations", frame.recompiles, RECOMPILES_NORMAL, "compile", "count", frame.label),
                Evidence("recompile_s", round(recompile_s, 3), None, "compile", "s", "estimated: the frame's compile "
                         "time × its recompilations' share of its compilations")]
    for guard, count in frame.guard_counts[:6]:
        evidence.append(Evidence("failed_guard", guard, None, "compile", "text",
                                 f"{count} of {frame.recompiles} recompilations"))
    if not frame.guard_counts:
        for reason in frame.triggers[:3]:
            evidence.append(Evidence("guard_failure", reason, None, "compile", "text", frame.label))
    evidence += _cache_evidence(summary)
    changing = f": {frame.changing} changes" if frame.changing else ""
    title = (f"torch.compile recompiles {frame.function}() {frame.recompiles} times{changing}: compiling it took "
             f"{common.ms(frame.compile_s)}, {common.pct(share)} of the run")
    text = (f"Each new value of a guarded input compiles {frame.label} again. "
            + (f"The failed guards name {frame.changing}." if frame.changing else
               f"The failed guards: {'; '.join(frame.triggers[:2])}.")
            + (f" Every guard that failed, by recompilations: {guards_text(frame)}." if frame.guard_counts else "")
            + _mode_text(frame) + _cache_text(summary))
    return common.finding("compile.recompiling", "compile", title, share, 0.85, evidence, _shape_prescriptions(frame),
                          text, claims=("compile",), impact_basis=RUN_BASIS)


def graph_breaks(ev: RunEvidence) -> Finding | None:
    summary = _summary(ev)
    if summary is None or not summary.graph_breaks:
        return None
    top = max(summary.graph_breaks, key=lambda item: item.count)
    evidence = [Evidence("graph_breaks", summary.graph_break_count, 0, "compile", "count", "breaks recorded")]
    for item in summary.graph_breaks[:3]:
        detail = f"{item.count}×" + (f", inside {item.library_label}" if item.in_library else "")
        evidence.append(Evidence("graph_break", f"{item.label}: {item.reason}", None, "compile", "text", detail))
    where = top.label
    inside = f" inside {top.library_label}" if top.in_library else ""
    graphs = len(summary.frames) + sum(item.recompiles for item in summary.frames)
    cost = summary.break_cost
    impact, basis = 0.0, ("not priced: a graph break costs the eager code between the graphs, the guard checks of "
                          "the frames it adds and their recompilations in the steady state, which a run record does "
                          "not time per step; the compile time is not its price")
    priced = "; its steady-state cost is not priced (run with --trace to time it)"
    traced = between_graphs(ev)
    if traced is not None:
        between_us, step_us = traced
        impact, basis = between_us / step_us, TRACED_BASIS
        priced = (f"; in the traced steps {_us(between_us)} a step runs between the graphs "
                  f"({common.pct(impact)} of the step)")
        evidence.append(Evidence("between_graphs_us_per_step", round(between_us, 1), None, "trace", "us",
                                 "time between consecutive graphs of one compiled call, per profiled step"))
    if cost is not None and cost.resume_frames:
        evidence.append(Evidence("frames_after_breaks", cost.resume_frames, None, "compile", "count",
                                 "frames dynamo compiled for the code after a break (each with its own guards)"))
    if cost is not None and cost.resume_recompiles:
        evidence.append(Evidence("recompiles_after_break", cost.resume_recompiles, None, "compile", "count",
                                 f"recompilations of the code after the breaks ({common.ms(cost.resume_recompile_s)})"))
    title = (f"torch.compile breaks the graph at {where}{inside} ({_short(top.reason)})"
             + (f" and {len(summary.graph_breaks) - 1} more place(s)" if len(summary.graph_breaks) > 1 else "")
             + f": {graphs} graphs" + priced)
    code = f" (`{top.user_code}`)" if top.user_code else ""
    text = ("A graph break splits the compiled code into several graphs and runs the code between them eagerly; "
            "a data-dependent one (.item(), a Python branch on a tensor) also waits for the value, and every value "
            "of it the guards specialise on compiles the code after the break again."
            + (f" This one is in library code ({top.library_label}), reached from {where}{code}: that call is what "
               "can change." if top.in_library else "")
            + f" Compiling took {common.ms(summary.compile_s)} ({common.pct(summary.compile_share)} of the run); "
            "removing the break does not remove that — it is not the break's price.")
    evidence.append(Evidence("compile_share", round(summary.compile_share, 4), None, "compile", "ratio",
                             "all compilations, over the run's steps (not the break's cost)"))
    severity = Severity.LOW if impact < 0.02 or basis.startswith("not priced") else None
    return common.finding("compile.graph_breaks", "compile", title, impact, 0.85, evidence,
                          [*_break_prescriptions(top),
                           Prescription("torch.compile(model, fullgraph=True) while fixing them",
                                        "turns every graph break into an error with its line, so none is missed")],
                          text, impact_basis=basis, claims=("compile",), severity=severity)


def compile_time(ev: RunEvidence) -> Finding | None:
    summary = _summary(ev)
    if summary is None or summary.compile_s <= 0 or summary.compile_share < COMPILE_SHARE_NOTE:
        return None
    if summary.limit_hits or any(item.recompiles > RECOMPILES_NORMAL for item in summary.frames):
        return None  # the recompiling finding holds the compile time, with its cause
    share = summary.compile_share
    evidence = [Evidence("compile_s", round(summary.compile_s, 3), None, "compile", "s",
                         f"{summary.compilations} compilation(s)"),
                Evidence("compile_share", round(share, 4), COMPILE_SHARE_HIGH, "compile", "ratio", "of the steps' time")]
    bought = ""
    if summary.break_even_steps is not None and summary.speedup is not None:
        bought = (f" It bought ×{summary.speedup:.2f} per step (measured), which pays the compile time back after "
                  f"~{summary.break_even_steps:.0f} steps.")
        evidence.append(Evidence("break_even_steps", round(summary.break_even_steps), None, "steps", "count",
                                 "compile time over the time a compiled step saves"))
    evidence += _cache_evidence(summary)
    cache = f" with {summary.cache_state} compile caches" if summary.cache_state else ""
    title = f"Compiling took {common.ms(summary.compile_s)}{cache}, {common.pct(share)} of this run"
    prescriptions = [
        Prescription("Keep the compile caches between runs: a persistent TORCHINDUCTOR_CACHE_DIR (and the FX graph "
                     "cache, on by default) on a disk that outlives the job",
                     "a warm cache turns most of the next run's compilation into loads"),
        Prescription("For short jobs on fresh machines: torch.compiler.save_cache_artifacts() after a run and "
                     "load_cache_artifacts() before the next (the 'mega-cache')",
                     "ships the compiled artifacts with the job instead of compiling them again"),
    ]
    severe = share >= COMPILE_SHARE_HIGH
    return common.finding("compile.compile_time", "compile", title, share, 0.9, evidence, prescriptions,
                          "Compilation ran inside the steps (the compile phase)." + bought + _cache_text(summary),
                          severity=None if severe else Severity.LOW, claims=("compile",), impact_basis=RUN_BASIS)


#: How a graph break is priced from a trace.
TRACED_BASIS = ("measured in the profiled steps: the time between consecutive graphs of each call into compiled "
                "code (the eager code between them, the resume frame's guard check and entry); fusion lost across "
                "the break is not timed")


def _us(value: float) -> str:
    return f"{value:.0f} µs" if value < 1000 else common.ms(value / 1e6)


def between_graphs(ev: RunEvidence) -> tuple[float, float] | None:
    """(µs between the graphs per step, µs per step) from the trace, when it has broken graphs."""
    compiled = ev.trace.compiled if ev.trace is not None else None
    if compiled is None or compiled.graphs_per_step <= 1.0 or not compiled.step_us \
            or compiled.between_graphs_us_per_step <= 0:
        return None
    return compiled.between_graphs_us_per_step, compiled.step_us


def trace_regions(ev: RunEvidence) -> Finding | None:
    """A bare trace (no run record): what its compiled regions say — several graphs per step
    (graph breaks), recompiled variants of a frame."""
    if ev.compile is not None or ev.trace is None or ev.trace.compiled is None:
        return None
    compiled = ev.trace.compiled
    graphs, recompiled = compiled.graphs_per_step, compiled.recompiled_frames
    if graphs <= 1.0 and not recompiled:
        return None
    evidence = [Evidence("compiled_graphs_per_step", round(graphs, 2), 1.0, "trace", "count",
                         "CompiledFunction events per profiled step")]
    parts = []
    if graphs > 1.0:
        parts.append(f"runs as {graphs:.0f} compiled graphs per step (graph breaks)")
    if recompiled:
        evidence.append(Evidence("recompiled_variants", ", ".join(item for item in compiled.variants
                                                                  if not item.endswith("/0")), None, "trace", "text",
                                 "Torch-Compiled Region F/N with N > 0"))
        parts.append(f"calls recompiled variants of frame(s) {', '.join(recompiled)}")
    title = "The compiled code " + " and ".join(parts)
    impact, basis = 0.05, "estimate: a trace alone does not time what the breaks or recompilations cost"
    traced = between_graphs(ev)
    if traced is not None:
        impact, basis = traced[0] / traced[1], TRACED_BASIS
        title += f": {_us(traced[0])} a step between the graphs ({common.pct(impact)})"
        evidence.append(Evidence("between_graphs_us_per_step", round(traced[0], 1), None, "trace", "us",
                                 "time between consecutive graphs of one compiled call, per profiled step"))
    return common.finding(
        "compile.trace_regions", "compile", title, impact, 0.6, evidence,
        [Prescription("Run the script under `stepscope run` (or with TORCH_LOGS=graph_breaks,recompiles) to see "
                      "each break's line and each recompilation's guard",
                      "a trace shows that the code is split or recompiled, not where or why"),
         Prescription("torch.compile(model, fullgraph=True) while fixing breaks",
                      "turns every graph break into an error with its line")],
        "Torch-Compiled Region events with a variant number above 0 are recompiled code; more than one "
        "CompiledFunction per step is a frame broken into several graphs.",
        impact_basis=basis, claims=("compile",))


def guards_text(frame: FrameCompiles) -> str:
    """``global state: grad_mode (3×); src: size (dim 0) 16 -> 12 (2×)``."""
    return "; ".join(f"{guard} ({count}×)" for guard, count in frame.guard_counts[:6])


def _mode_text(frame: FrameCompiles) -> str:
    """What the grad-mode and training-flag guards say: evaluation compiles its own variants."""
    mode = max((count for guard, count in frame.guard_counts if "grad_mode" in guard or ".training" in guard),
               default=0)
    if not mode:
        return ""
    return (f" {mode} of the recompilations came with a switch between training and evaluation (grad mode, "
            "module.training): each mode compiles its own variants once, and they count toward the recompile limit.")


def _cache_evidence(summary: CompileSummary) -> list[Evidence]:
    if summary.cache_state is None:
        return []
    out = [Evidence("compile_caches", summary.cache_state, None, "compile", "text",
                    f"{summary.cache_hits} hit(s), {summary.cache_misses} miss(es): inductor FX graph and "
                    "AOTAutograd caches")]
    if summary.warm_compile_s is not None:
        out.append(Evidence("warm_compile_s", round(summary.warm_compile_s, 3), None, "compile", "s",
                            "compile time less the backend's (what a warm-cache run still pays, at least)"))
    return out


def _cache_text(summary: CompileSummary) -> str:
    if summary.cache_state is None:
        return " No compile cache was consulted (a backend without one, such as aot_eager)." \
            if summary.backend_s is not None else ""
    text = (f" The compile caches were {summary.cache_state} ({summary.cache_hits} hit(s), "
            f"{summary.cache_misses} miss(es)).")
    if summary.warm_compile_s is not None and summary.backend_s is not None and summary.cache_state != "warm":
        text += (f" Of {common.ms(summary.compile_s)}, the backend compiled for {common.ms(summary.backend_s)}, which "
                 f"a warm cache turns into loads: a warm run pays about {common.ms(summary.warm_compile_s)} plus "
                 "the loads.")
    elif summary.cache_state == "warm":
        text += " This is what a warm run pays."
    return text


def _short(reason: str) -> str:
    text = reason.strip().split("\n")[0]
    return text if len(text) <= 90 else text[:87] + "…"


def _shape_prescriptions(frame: FrameCompiles) -> list[Prescription]:
    changing = frame.changing
    name, _, dim = (changing or "").partition(", dim ")
    mark = (f"torch._dynamo.mark_dynamic({name}, {dim}) before the call" if changing
            else "torch._dynamo.mark_dynamic(tensor, dim) on the input whose size changes")
    return [
        Prescription("torch.compile(model, dynamic=True)",
                     "one graph for every size of the changing dimension instead of one per size"
                     + (f" ({changing})" if changing else "")),
        Prescription(mark, "marks only that dimension dynamic; the rest stays specialised"),
        Prescription("Bucket or pad the lengths to a few sizes: stepscope.data.BucketBatchSampler with pad_collate",
                     "a handful of shapes compile once each and then hit the cache"),
        Prescription("torch._dynamo.mark_static(tensor, dim) where a value should not vary",
                     "a size that varies by accident is better fixed than compiled for"),
    ]


#: Graph breaks inside torch whose fix is an argument of the user's call: (file suffix, function)
#: -> (the change, why). Checked on torch 2.13: ``nn.TransformerEncoder(src, mask=causal)`` breaks
#: in ``_detect_is_causal_mask`` (``bool((mask == causal).all())``: a ``.item()``); with
#: ``is_causal=True`` the check is skipped and the forward compiles without a break.
LIBRARY_FIXES = {
    ("torch/nn/modules/transformer.py", "_detect_is_causal_mask"): (
        "pass is_causal=True with the causal mask",
        "without it, the Transformer module checks on the host whether the mask is causal "
        "(bool((mask == causal).all()): a .item() dynamo cannot trace) at every call; is_causal=True "
        "tells it, and the check — and the break — go"),
}


def _break_prescriptions(top: BreakSummary) -> list[Prescription]:
    where = top.label
    code = f" (`{top.user_code}`)" if top.user_code else ""
    if top.in_library:
        from stepscope.analysis.run.compile_summary import package_path

        path = package_path(top.file)
        fix = next((value for (suffix, function), value in LIBRARY_FIXES.items()
                    if path.endswith(suffix) and top.function == function), None)
        if fix is not None:
            action, why = fix
            return [Prescription(f"At {where}{code}: {action}", why)]
        return [Prescription(f"Change the call at {where}{code}: the break is inside {top.library_label}, which "
                             "is not yours to edit — pass the argument that keeps the library off the path that "
                             "breaks, or move the call out of the compiled code",
                             f"dynamo does not trace it: {_short(top.reason)}")]
    lowered = top.reason.lower()
    if "item" in lowered or "data-dependent" in lowered or "data dependent" in lowered or "generic_jump" in lowered \
            or "bool" in lowered:
        return [Prescription(f"Keep the branch at {where} on the device: torch.where(cond, a, b), or torch.cond for "
                             "two code paths, instead of a Python if on tensor.item()",
                             "a Python branch on a tensor's value needs the value on the host: a sync and a break")]
    if "print" in lowered or "logging" in lowered or "logger" in lowered:
        return [Prescription(f"Move the print/logging at {where} out of forward (log outside the compiled code, "
                             "every N steps)", "dynamo cannot trace I/O: each call breaks the graph")]
    return [Prescription(f"Rewrite or move out of the compiled region the call at {where}",
                         f"dynamo does not trace it: {_short(top.reason)}")]


__all__ = ["compile_time", "graph_breaks", "recompile_limit", "recompiling", "trace_regions"]


FAMILY = FamilyEntry(
    "compile", (recompile_limit, recompiling, graph_breaks, compile_time, trace_regions,),
    diagnoses="torch.compile recompiles, breaks its graphs, gives up at the recompile limit, or compiles longer than it saves",
    evidence="Compilations with their failed guards, graph breaks with their line, the recompile limit, compile time against the run; a trace's compiled regions",
    supersedes=frozenset({"launch_overhead", "periodic_stall", "compute"}))
