"""torch.compile over a run: what compiled, when, why, for how long, and what it bought.

Pure functions of a :class:`~stepscope.record.run.RunRecord` (its ``facts.compile`` and its steps);
no torch. :func:`summarize_compile` gives, per compiled frame, its compilations (the first one and
each recompilation with the guard that failed), whether it hit the recompile limit (it then runs
eager: from which step), and for the run the compile time, its share, the graph breaks with their
reason, the user's line that reaches it and the library frame it is in, what of the breaks' cost a
record shows (the frames they add and those frames' recompilations; the eager code between the
graphs and the added guard checks are not timed per step: dynamo's ``guard_latency_us`` is one
check after a cache flush at compile time, summed over the compile, not a per-step cost), whether the compile caches were cold or warm
and what a warm run would still pay, and — when both were measured — compiled steps vs the eager ones (before the first
compilation, or after a frame fell back to eager) — the speed-up it bought — and the break-even
step count.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.record.run import CompileFacts, RunRecord, steps_of

#: "tensor 'L['tokens']' size mismatch at index 1. expected 62, actual 85" -> the input and dimension
_SIZE_GUARD = re.compile(r"tensor '(?P<name>[^']*(?:'[^']*'[^']*)*?)' (?:size|stride) mismatch at index (?P<dim>\d+)")
#: dynamo's name for the code after a graph break, compiled as a frame of its own
RESUME_PREFIX = "torch_dynamo_resume_in_"
#: L['x'] / L['self'].x -> x
_LOCAL = re.compile(r"^L\[['\"](?P<name>[^'\"]+)['\"]\]")


@dataclass(frozen=True)
class FrameCompiles:
    """One compiled frame (a function dynamo compiled), over the run."""

    frame: str  # dynamo's frame id
    function: str
    file: str
    line: int
    compilations: int  # the first one and every recompilation
    recompiles: int
    compile_s: float
    first_step: int  # the step of its first compilation (-1: before the steps)
    triggers: tuple[str, ...]  # each recompilation's guard failure, in order
    changing: str | None  # the input and dimension the guards say changes ("tokens, dim 1")
    limit_hit_step: int | None  # the step from which the frame runs eager (recompile limit hit)
    limit: int | None
    guard_latency_us: float | None  # mean guard-check cost per call, when measured
    #: every guard that failed before a recompilation, by count over the frame's recompilations
    guard_counts: tuple[tuple[str, int], ...] = ()

    @property
    def resume(self) -> bool:
        """A frame dynamo made for the code after a graph break (``torch_dynamo_resume_in_…``)."""
        return self.function.startswith(RESUME_PREFIX)

    @property
    def label(self) -> str:
        import os

        return f"{os.path.basename(self.file)}:{self.line} {self.function}()"


@dataclass(frozen=True)
class BreakSummary:
    file: str
    line: int
    reason: str
    count: int
    user_file: str = ""  # the deepest frame in the user's files (the break's own when it is in them)
    user_line: int = 0
    user_code: str = ""
    function: str = ""  # the function the break is in

    @property
    def in_library(self) -> bool:
        return bool(self.user_file) and (self.user_file, self.user_line) != (self.file, self.line)

    @property
    def label(self) -> str:
        """Where the user acts: the user's line (``model.py:142``), else the break's own."""
        import os

        if self.user_file:
            return f"{os.path.basename(self.user_file)}:{self.user_line}"
        return f"{os.path.basename(self.file)}:{self.line}"

    @property
    def library_label(self) -> str:
        """The break's own place, as a package path (``torch/nn/modules/transformer.py:1245``)."""
        return f"{package_path(self.file)}:{self.line}" + (f" ({self.function})" if self.function else "")


def package_path(path: str) -> str:
    """``…/site-packages/torch/nn/modules/transformer.py`` -> ``torch/nn/modules/transformer.py``."""
    parts = path.replace("\\", "/").split("/")
    for marker in ("site-packages", "dist-packages"):
        if marker in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(marker):])
    if "torch" in parts:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("torch"):])
    return parts[-1]


@dataclass(frozen=True)
class BreakCost:
    """What a run record shows of the graph breaks' steady-state cost: the frames they add and
    those frames' recompilations. The per-step cost (the eager code between the graphs, the added
    guard checks) is timed by a trace (:mod:`stepscope.analysis.trace.compiled_regions`), not by
    the record."""

    resume_frames: int  # frames dynamo made for the code after a break
    resume_recompiles: int  # recompilations of those frames
    resume_recompile_s: float


@dataclass(frozen=True)
class CompileSummary:
    frames: tuple[FrameCompiles, ...]
    compilations: int
    recompiles: int
    compile_s: float
    run_s: float  # wall time of the steps
    compile_share: float  # compile time over the steps' wall time
    graph_breaks: tuple[BreakSummary, ...]
    graph_break_count: int
    graphs_per_step: float | None  # compiled graphs entered per step, when traced
    eager_step_s: float | None  # median eager step (before the first compile, or after a limit hit), when measured
    compiled_step_s: float | None  # median compiled step without a compilation
    speedup: float | None  # eager / compiled
    break_even_steps: float | None  # steps for the speed-up to pay the compile time back
    last_compile_step: int
    sources: tuple[str, ...]
    break_cost: BreakCost | None = None
    #: the compile caches (inductor's FX graph cache, AOTAutograd's): "cold" (misses only), "warm"
    #: (hits only), "partly warm", or None when no cache was consulted (e.g. backend aot_eager)
    cache_state: str | None = None
    cache_hits: int = 0
    cache_misses: int = 0
    backend_s: float | None = None  # the backends' share of the compile time (None: not reported)

    @property
    def warm_compile_s(self) -> float | None:
        """What a warm-cache run would still pay, at least: the compile time less the backend's
        (a cache hit loads the backend's output instead of compiling it; dynamo traces again)."""
        if self.cache_state is None or self.backend_s is None:
            return None
        return max(0.0, self.compile_s - self.backend_s)

    @property
    def limit_hits(self) -> tuple[FrameCompiles, ...]:
        return tuple(frame for frame in self.frames if frame.limit_hit_step is not None)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["frames"] = [{**asdict(frame), "label": frame.label} for frame in self.frames]
        data["graph_breaks"] = [{**asdict(item), "label": item.label, "library_label": item.library_label}
                                for item in self.graph_breaks]
        data["warm_compile_s"] = self.warm_compile_s
        return data


def changing_input(reasons: tuple[str, ...]) -> str | None:
    """The input and dimension most recompilations name (``"tokens, dim 1"``), or None."""
    found: dict[str, int] = {}
    for reason in reasons:
        match = _SIZE_GUARD.search(reason)
        if match is None:
            continue
        name = match["name"]
        local = _LOCAL.match(name)
        name = local["name"] if local is not None else name
        key = f"{name}, dim {match['dim']}"
        found[key] = found.get(key, 0) + 1
    return max(found, key=lambda key: found[key]) if found else None


def summarize_compile(record: RunRecord) -> CompileSummary | None:
    """The run's compilations (None when nothing was compiled)."""
    facts: CompileFacts | None = record.facts.compile
    if facts is None or not facts.compilations:
        return None
    steps = record.steps
    starts = np.asarray([item.start_ns for item in facts.compilations], dtype=np.int64)
    step_of = steps_of(starts, steps) if len(steps) else np.full(len(starts), -1)
    frames: dict[str, list[tuple[Any, int]]] = {}
    for item, step in zip(facts.compilations, step_of.tolist()):
        frames.setdefault(item.frame, []).append((item, step))
    out = []
    for frame, all_items in frames.items():
        # an attempt dynamo gave up on (the recompile limit, an unsupported construct) compiled nothing
        items = [entry for entry in all_items if entry[0].failure is None] or all_items
        first, first_step = items[0]
        triggers = tuple(item.trigger for item, _ in items[1:] if item.trigger)
        hit = next((limit for limit in facts.limit_hits if limit.function == first.function
                    and (not limit.file or limit.file == first.file)), None)
        hit_step = None
        if hit is not None:
            hit_step = int(steps_of(np.asarray([hit.ts_ns]), steps)[0]) if len(steps) else -1
            triggers = (*triggers, hit.last_reason)
        latencies = [item.guard_latency_us for item, _ in items if item.guard_latency_us is not None]
        counts: dict[str, int] = {}
        for item, _ in items[1:]:
            for guard in item.guard_failures or ((item.trigger.split(": ", 1)[-1],) if item.trigger else ()):
                counts[guard] = counts.get(guard, 0) + 1
        out.append(FrameCompiles(
            frame=frame, function=first.function, file=first.file, line=first.line,
            compilations=len(items), recompiles=len(items) - 1,
            compile_s=sum(item.duration_ns for item, _ in items) / 1e9, first_step=first_step,
            triggers=triggers, changing=changing_input(triggers),
            limit_hit_step=hit_step if hit is not None else None, limit=hit.limit if hit is not None else None,
            guard_latency_us=float(np.mean(latencies)) if latencies else None,
            guard_counts=tuple(sorted(counts.items(), key=lambda pair: (-pair[1], pair[0])))))
    out.sort(key=lambda item: -item.compile_s)
    compile_s = sum(item.compile_s for item in out)
    run_s = float(steps.duration_ns.sum()) / 1e9 if len(steps) else 0.0
    breaks = tuple(BreakSummary(item.file, item.line, item.reason, item.count, item.user_file, item.user_line,
                                item.user_code, item.function) for item in facts.graph_breaks)
    last = int(step_of.max()) if len(step_of) else -1
    hits = [item.limit_hit_step for item in out if item.limit_hit_step is not None and item.limit_hit_step >= 0]
    eager, compiled, speedup, break_even = _speedup(record, step_of, compile_s, min(hits) if hits else None)
    return CompileSummary(
        frames=tuple(out), compilations=sum(item.compilations for item in out),
        recompiles=sum(item.recompiles for item in out),
        compile_s=compile_s, run_s=run_s, compile_share=compile_s / run_s if run_s > 0 else 0.0,
        graph_breaks=breaks, graph_break_count=sum(item.count for item in breaks), graphs_per_step=None,
        eager_step_s=eager, compiled_step_s=compiled, speedup=speedup, break_even_steps=break_even,
        last_compile_step=last, sources=facts.sources,
        break_cost=_break_cost(out) if breaks or any(item.resume for item in out) else None,
        **_caches(facts))


def _break_cost(frames: list[FrameCompiles]) -> BreakCost:
    resume = [item for item in frames if item.resume]
    recompile_s = sum(item.compile_s * item.recompiles / max(item.compilations, 1) for item in resume)
    return BreakCost(len(resume), sum(item.recompiles for item in resume), recompile_s)


def _caches(facts: CompileFacts) -> dict[str, Any]:
    """Cold or warm: dynamo's cache counters, else the compilations' own counts."""
    counters = (facts.counters or {}).get("caches") or {}
    hits = int(counters.get("fx_hit", 0)) + int(counters.get("aot_hit", 0))
    misses = int(counters.get("fx_miss", 0)) + int(counters.get("aot_miss", 0))
    if not counters:
        hits = sum(item.cache_hits or 0 for item in facts.compilations)
        misses = sum(item.cache_misses or 0 for item in facts.compilations)
    state = None
    if hits or misses:
        state = "warm" if not misses else "cold" if not hits else "partly warm"
    backend = [item.backend_ns for item in facts.compilations if item.backend_ns is not None]
    return {"cache_state": state, "cache_hits": hits, "cache_misses": misses,
            "backend_s": sum(backend) / 1e9 if backend else None}


def _speedup(record: RunRecord, step_of: np.ndarray, compile_s: float, eager_from: int | None
             ) -> tuple[float | None, float | None, float | None, float | None]:
    """(eager step, compiled step, speed-up, break-even steps), each None when not measured.

    Compiled steps: steps without a compilation after the first one (and before the frame fell
    back to eager). Eager steps: steps before the first compilation (a script that compiles late),
    or the steps after a frame hit the recompile limit (``eager_from``: it runs eager from there).
    """
    steps = record.steps
    if not len(steps):
        return None, None, None, None
    durations = steps.duration_ns.astype(np.float64) / 1e9
    compiled_at = {int(step) for step in step_of.tolist() if step >= 0}
    first = min(compiled_at) if compiled_at else 0
    index = np.arange(len(steps))
    end = eager_from if eager_from is not None else len(steps)
    compiled_mask = (index > first) & (index < end) & ~np.isin(index, list(compiled_at))
    eager_mask = (index > eager_from) if eager_from is not None else (index < first)
    eager_mask &= ~np.isin(index, list(compiled_at))
    compiled = float(np.median(durations[compiled_mask])) if compiled_mask.sum() >= 3 else None
    eager = float(np.median(durations[eager_mask])) if eager_mask.sum() >= 3 else None
    if compiled is None or eager is None or compiled <= 0:
        return eager, compiled, None, None
    saved = eager - compiled
    return eager, compiled, eager / compiled, (compile_s / saved if saved > 0 else None)


__all__ = ["BreakCost", "BreakSummary", "package_path", "CompileSummary", "FrameCompiles", "changing_input", "summarize_compile"]
