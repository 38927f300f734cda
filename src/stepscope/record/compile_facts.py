"""What capture saw of torch.compile, as the run record keeps it (``record.facts.compile``; see
:mod:`stepscope.capture.compile_watch`). Plain frozen data, re-exported by :mod:`stepscope.record.run`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Compilation:
    """One compilation of a frame by torch.compile (dynamo), as dynamo's own metrics report it."""

    compile_id: str  # "frame/attempt", e.g. "0/3": frame 0's fourth compilation
    frame: str
    function: str
    file: str
    line: int
    start_ns: int  # monotonic clock (the compile callbacks'), -1 unknown
    duration_ns: int
    trigger: str  # "" for a frame's first compilation, else the guard that failed
    graph_breaks: int | None = None
    guard_latency_us: float | None = None  # guard-check cost per call of this variant
    failure: str | None = None  # what made dynamo give up on this attempt
    #: every guard of the cached variants that failed before this recompilation (dynamo's
    #: ``trigger`` names the first of one variant only): ``"src: size (dim 0) 16 -> 12"``
    guard_failures: tuple[str, ...] = ()
    backend_ns: int | None = None  # the backend's compile time (inductor, AOTAutograd), lazy backward included
    cache_hits: int | None = None  # FX graph and AOTAutograd cache hits (None: no cache consulted)
    cache_misses: int | None = None


@dataclass(frozen=True)
class GraphBreak:
    """One distinct graph break torch.compile logged: where it is, why, and how often it was met."""

    file: str
    line: int
    reason: str
    count: int  # times the break was logged (once per compilation that met it)
    first_ns: int
    #: the deepest frame in the user's files on the way to a break in library code (dynamo's user
    #: stack), with its source line; the break's own file and line when it is in the user's code
    user_file: str = ""
    user_line: int = 0
    user_code: str = ""
    function: str = ""  # the function the break is in (a library break's, e.g. _detect_is_causal_mask)


@dataclass(frozen=True)
class RecompileLimitHit:
    """A frame hit ``torch._dynamo.config.recompile_limit``: it runs eager from then on."""

    ts_ns: int
    function: str
    file: str
    line: int
    limit: int
    last_reason: str


@dataclass(frozen=True)
class CompileFacts:
    """What capture saw of torch.compile (see :mod:`stepscope.capture.compile_watch`)."""

    sources: tuple[str, ...] = ()  # what this torch version gave
    compilations: tuple[Compilation, ...] = ()
    graph_breaks: tuple[GraphBreak, ...] = ()
    limit_hits: tuple[RecompileLimitHit, ...] = ()
    recompile_limit: int | None = None
    counters: dict[str, Any] = field(default_factory=dict)  # dynamo's counters (graph_break, stats)
