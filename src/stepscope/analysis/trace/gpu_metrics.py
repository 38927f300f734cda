"""The plugin's GPU summary: utilization, est. SM efficiency, est. achieved occupancy, Tensor Cores.

Per device (kernel ``pid``), over the steps window ``W = [first step start, last step end]``:

- **GPU utilization** = |union of kernel intervals ∩ W| / |W| (kernels only, no memcpy/memset);
- **est. SM efficiency** = Σ over time slices of min(1, Σ ``blocks per SM`` of the kernels running
  in the slice) × slice length, ∩ W, / |W| (kernels with ``blocks per SM <= 0`` or missing are
  left out);
- **est. achieved occupancy** = Σ(occupancy × kernel time in W) / Σ(kernel time in W) over kernels
  with an ``est. achieved occupancy %`` >= 0 (a kernel-time-weighted mean, in percent as Kineto
  writes it; we report 0..1);
- **Tensor Core kernel share** = kernel time of kernels whose name marks Tensor Core use / all
  kernel time. ``tc_share_plugin`` uses the plugin's allowlist verbatim (Volta/Turing era names);
  ``tc_share`` adds the names of current GPUs (Ampere/Hopper/Blackwell ``sm80_``/``sm90_``
  xmma/gmma, CUTLASS ``tensorop``, ``wgmma``, FlashAttention/FMHA kernels).
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from stepscope.traces import intervals
from stepscope.analysis.trace.step_breakdown import TraceSteps
from stepscope.traces.links import KERNEL, EventLinks, unique_ints

PLUGIN_TC_ALLOWLIST = (
    "h884", "s884", "h1688", "s1688", "hmma", "i8816", "16816", "dgrad_1x1_stride_2x2",
    "first_layer_wgrad_kernel", "conv1x1", "conv2d_c1_k1", "direct_group", "xmma_implicit_gemm",
    "xmma_sparse_conv", "xmma_warp_specialized_implicit_gemm", "xmma_gemm", "xmma_sparse_gemm", "c1688",
)
_MODERN_TC = re.compile(
    r"sm\d+_xmma|xmma_|gmma|wgmma|tensorop|tensor_op|hmma|imma|_16816|_1688|_884|"
    r"(ampere|hopper|turing|volta|blackwell)_(h|fp16|bf16|tf32|i8|e4m3)|"
    r"flash_fwd|flash_bwd|fmha|cutlass_80|cutlass_90|cutlass3x|nvjet|sm90_|sm100_",
    re.IGNORECASE,
)


@functools.lru_cache(maxsize=4096)
def uses_tensor_cores_plugin(name: str) -> bool:
    return any(token in name for token in PLUGIN_TC_ALLOWLIST)


# every match of _MODERN_TC contains one of these (lower case): a cheap test before the regex
_MODERN_TC_TOKENS = (
    "xmma", "gmma", "tensorop", "tensor_op", "hmma", "imma", "_16816", "_1688", "_884", "ampere_", "hopper_",
    "turing_", "volta_", "blackwell_", "flash_fwd", "flash_bwd", "fmha", "cutlass_80", "cutlass_90", "cutlass3x",
    "nvjet", "sm90_", "sm100_",
)


@functools.lru_cache(maxsize=4096)
def uses_tensor_cores(name: str) -> bool:
    if uses_tensor_cores_plugin(name):
        return True
    lower = name.lower()
    return any(token in lower for token in _MODERN_TC_TOKENS) and bool(_MODERN_TC.search(name))


@dataclass(frozen=True)
class DeviceSummary:
    """One GPU's utilisation, SM efficiency, occupancy and Tensor Core share over the trace."""

    device: int
    utilization: float | None
    sm_efficiency: float | None
    achieved_occupancy: float | None
    tc_share: float | None
    tc_share_plugin: float | None
    kernel_us: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sm_efficiency(s: np.ndarray, e: np.ndarray, value: np.ndarray, lo: float, hi: float) -> float:
    points = np.concatenate((s, e))
    order = np.argsort(points, kind="stable")
    points = points[order]
    level = np.concatenate((value, -value))[order]
    del order
    np.cumsum(level, out=level)  # the level after each point; in place, one column at a time
    width = np.clip(points[1:], lo, hi)
    width -= np.clip(points[:-1], lo, hi)
    del points
    np.clip(level[:-1], 0.0, 1.0, out=level[:-1])
    width *= level[:-1]
    return float(np.sum(width) / (hi - lo))


def device_summaries(links: EventLinks, steps: TraceSteps) -> tuple[DeviceSummary, ...]:
    events = links.events
    kernels = links.rows(KERNEL)
    if not len(kernels) or not len(steps.start):
        return ()
    lo, hi = float(steps.start[0]), float(steps.end[-1])
    symbols = events.symbols
    names = events.name[kernels]
    tc_mod = np.zeros(len(symbols.strings), dtype=bool)
    tc_plug = np.zeros(len(symbols.strings), dtype=bool)
    for ident in unique_ints(names).tolist():
        tc_mod[ident] = uses_tensor_cores(symbols.strings[ident])
        tc_plug[ident] = uses_tensor_cores_plugin(symbols.strings[ident])
    out = []
    pids = events.pid[kernels]
    for pid in unique_ints(pids).tolist():
        rows = kernels[pids == pid]
        s, e = events.ts[rows], events.end_at(rows)
        device = _device_number(symbols.strings[pid], events.device[rows])
        window = hi - lo
        util = sm = occ = None
        if window > 0:
            util = intervals.total(*intervals.clip(intervals.merge(s, e), lo, hi)) / window
            bps = events.blocks_per_sm[rows]
            ok = bps > 0
            sm = _sm_efficiency(s[ok], e[ok], bps[ok], lo, hi) if ok.any() else None
            occ_v = events.occupancy[rows]
            ok = occ_v >= 0
            overlap = np.clip(np.minimum(e, hi) - np.maximum(s, lo), 0, None)
            weight = overlap[ok].sum()
            occ = float((occ_v[ok] * overlap[ok]).sum() / weight / 100.0) if weight > 0 else None
        dur = events.dur[rows]
        total = float(dur.sum())
        mod = tc_mod[events.name[rows]]
        plug = tc_plug[events.name[rows]]
        out.append(
            DeviceSummary(
                device=device,
                utilization=util,
                sm_efficiency=sm,
                achieved_occupancy=occ,
                tc_share=float(dur[mod].sum() / total) if total > 0 else None,
                tc_share_plugin=float(dur[plug].sum() / total) if total > 0 else None,
                kernel_us=total,
            )
        )
    return tuple(out)


def _device_number(pid_text: str, device_arg: np.ndarray) -> int:
    try:
        return int(pid_text)
    except ValueError:
        valid = device_arg[device_arg >= 0]
        return int(valid[0]) if len(valid) else -1
