"""Model FLOPs utilisation: achieved FLOP/s over the peak of the device.

- :func:`peak_flops` knows current accelerators by the name the driver reports
  (``torch.cuda.get_device_name()`` / NVML: ``"NVIDIA H200"``, ``"NVIDIA H100 80GB HBM3"``,
  ``"NVIDIA A100-SXM4-80GB"``, ``"Tesla T4"``, ``"AMD Instinct MI300X"`` …) and a dtype
  (``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``fp64``; torch spellings accepted).
  Values are the vendors' datasheet **dense** peaks (no 2:4 sparsity), per GPU, in FLOP/s.
- On CPU the "peak" is what a large GEMM actually reaches on this machine: capture measures it
  (:mod:`stepscope.capture.cpu_peak`) and the record carries it (``record.facts.cpu_peak``).
- :func:`mfu` divides FLOPs of one step (``torch.utils.flop_counter.FlopCounterMode``: forward and
  backward matmuls/convolutions/attention; elementwise ops count 0) by step time and peak.
- :class:`OpCounter` counts the aten operators dispatched while it is active (the launch-overhead
  rule divides step time by it).

Only :class:`OpCounter` needs torch; it imports it inside.
"""

from __future__ import annotations

import re

from stepscope.errors import UsageError

TERA = 1e12

#: dtype spellings -> canonical key.
_DTYPES: dict[str, str] = {
    "fp32": "fp32", "float32": "fp32", "float": "fp32", "torch.float32": "fp32",
    "tf32": "tf32",
    "bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "torch.float16": "fp16",
    "fp8": "fp8", "float8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
    "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8",
    "fp64": "fp64", "float64": "fp64", "double": "fp64", "torch.float64": "fp64",
}

#: Dense datasheet peaks in TFLOP/s per GPU (NVIDIA/AMD product datasheets; sparsity excluded).
#: A dtype a device has no fast path for is absent (``peak_flops`` then returns None).
_PEAKS_TFLOPS: dict[str, dict[str, float]] = {
    "b200": {"fp64": 37.0, "fp32": 75.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0},
    "b100": {"fp64": 30.0, "fp32": 60.0, "tf32": 875.0, "bf16": 1750.0, "fp16": 1750.0, "fp8": 3500.0},
    "gb200": {"fp64": 40.0, "fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0},
    "h200-nvl": {"fp64": 30.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
    "h200": {"fp64": 34.0, "fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    "h100-nvl": {"fp64": 30.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5},
    "h100-pcie": {"fp64": 25.6, "fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
    "h100-sxm": {"fp64": 34.0, "fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9},
    "h20": {"fp64": 1.0, "fp32": 44.0, "tf32": 74.0, "bf16": 148.0, "fp16": 148.0, "fp8": 296.0},
    "a100": {"fp64": 9.7, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    "a10g": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    "a10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    "a40": {"fp32": 37.4, "tf32": 74.8, "bf16": 149.7, "fp16": 149.7},
    "a6000": {"fp32": 38.7, "tf32": 77.4, "bf16": 154.8, "fp16": 154.8},
    "l40s": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.0, "fp16": 362.0, "fp8": 733.0},
    "l40": {"fp32": 90.5, "tf32": 90.5, "bf16": 181.0, "fp16": 181.0, "fp8": 362.0},
    "l4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0, "fp8": 242.0},
    "rtx4090": {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2, "fp8": 330.3},
    "rtx3090": {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0, "fp16": 71.0},
    "v100s": {"fp64": 8.2, "fp32": 16.4, "fp16": 130.0},
    "v100-pcie": {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0},
    "v100": {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0},
    "t4": {"fp32": 8.1, "fp16": 65.0},
    "mi300x": {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
    "mi325x": {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
    "mi250x": {"fp64": 95.7, "fp32": 95.7, "bf16": 383.0, "fp16": 383.0},
    "mi250": {"fp64": 90.5, "fp32": 90.5, "bf16": 362.1, "fp16": 362.1},
}

#: Driver name patterns -> table key, most specific first (L40S before L40 before L4, …).
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"gb200", "gb200"),
    (r"\bb200\b", "b200"),
    (r"\bb100\b", "b100"),
    (r"h200.*nvl", "h200-nvl"),
    (r"\bh200\b", "h200"),
    (r"h100.*nvl", "h100-nvl"),
    (r"h100.*pcie", "h100-pcie"),
    (r"\bh100\b|\bh800\b", "h100-sxm"),
    (r"\bh20\b", "h20"),
    (r"\ba100\b|\ba800\b", "a100"),
    (r"\ba10g\b", "a10g"),
    (r"\ba10\b", "a10"),
    (r"\ba40\b", "a40"),
    (r"\ba6000\b", "a6000"),
    (r"\bl40s\b", "l40s"),
    (r"\bl40\b", "l40"),
    (r"\bl4\b", "l4"),
    (r"\b4090\b", "rtx4090"),
    (r"\b3090\b", "rtx3090"),
    (r"\bv100s\b", "v100s"),
    (r"v100.*pcie", "v100-pcie"),
    (r"\bv100\b", "v100"),
    (r"\bt4\b", "t4"),
    (r"\bmi300x\b", "mi300x"),
    (r"\bmi325x\b", "mi325x"),
    (r"\bmi250x\b", "mi250x"),
    (r"\bmi250\b", "mi250"),
)


def normalize_dtype(dtype: str) -> str | None:
    """Canonical dtype key (``"fp32"``, ``"tf32"``, ``"bf16"``, ``"fp16"``, ``"fp8"``, ``"fp64"``)."""
    return _DTYPES.get(str(dtype).strip().lower())


def device_key(device_name: str) -> str | None:
    """The peak-table key of a driver-reported device name, or None when unknown."""
    name = str(device_name).strip().lower().replace("_", " ")
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, name):
            return key
    return None


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense datasheet peak in FLOP/s of a device for a dtype; None when unknown.

    Args:
        device_name: as the driver reports it, e.g. ``"NVIDIA H200"``.
        dtype: ``"fp32"``, ``"tf32"``, ``"bf16"``, ``"fp16"``, ``"fp8"``, ``"fp64"`` or a torch
            spelling (``"torch.bfloat16"``).
    """
    key = device_key(device_name)
    canonical = normalize_dtype(dtype)
    if key is None or canonical is None:
        return None
    tflops = _PEAKS_TFLOPS[key].get(canonical)
    return None if tflops is None else tflops * TERA


def mfu(flops_per_step: float, step_time_s: float, peak: float) -> float:
    """Model FLOPs utilisation: ``flops_per_step / step_time_s / peak`` (0..1 when sane).

    Raises:
        UsageError: a non-positive step time or peak, or negative FLOPs.
    """
    if step_time_s <= 0 or peak <= 0 or flops_per_step < 0:
        raise UsageError(
            f"mfu needs flops >= 0, step time > 0 and peak > 0 "
            f"(got {flops_per_step}, {step_time_s}, {peak})"
        )
    return float(flops_per_step) / float(step_time_s) / float(peak)
