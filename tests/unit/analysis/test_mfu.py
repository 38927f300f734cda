from __future__ import annotations

import pytest

from stepscope.analysis.run.mfu import device_key, mfu, normalize_dtype, peak_flops
from stepscope.errors import UsageError


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200-nvl"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA L40", "l40"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("Tesla T4", "t4"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("AMD Instinct MI300X", "mi300x"),
    ("AMD Instinct MI250X / MI250", "mi250x"),
    ("Intel(R) Xeon(R) CPU", None),
])
def test_device_names_resolve(name, key):
    assert device_key(name) == key


@pytest.mark.parametrize("name, dtype, tflops", [
    ("NVIDIA H200", "bf16", 989.4),
    ("NVIDIA H200", "torch.float32", 67.0),
    ("NVIDIA H100 80GB HBM3", "fp8", 1978.9),
    ("NVIDIA A100-SXM4-40GB", "tf32", 156.0),
    ("NVIDIA L4", "float16", 121.0),
    ("Tesla T4", "half", 65.0),
])
def test_peak_flops(name, dtype, tflops):
    assert peak_flops(name, dtype) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("name, dtype", [("Tesla T4", "bf16"), ("NVIDIA H200", "int4"), ("Some GPU", "fp32")])
def test_unknown_peaks_are_none(name, dtype):
    assert peak_flops(name, dtype) is None


def test_dtype_spellings():
    assert normalize_dtype("torch.bfloat16") == normalize_dtype("BF16") == "bf16"


def test_mfu_value():
    assert mfu(1e12, 0.1, 1e14) == pytest.approx(0.1)


@pytest.mark.parametrize("args", [(1e12, 0.0, 1e14), (1e12, 0.1, 0.0), (-1.0, 0.1, 1e14)])
def test_mfu_rejects_bad_input(args):
    with pytest.raises(UsageError):
        mfu(*args)
