"""FLOP and operator counting of one step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from stepscope.capture.flops import FlopProbe, OpCounter, rnn_flops  # noqa: E402
from stepscope.capture.warn import WarningSink  # noqa: E402


def test_op_counter_counts_aten_ops():
    with OpCounter() as counter:
        torch.ones(3).add(1).mul(2)
    assert counter.count >= 3


def test_probe_counts_exactly_one_step():
    probe = FlopProbe(WarningSink(emit=False), step=2)
    model = torch.nn.Linear(64, 32)
    for index in range(5):
        model(torch.randn(8, 64)).sum().backward()
        probe.on_commit(index)
    assert probe.result.step_index == 2
    assert probe.result.flops == 2 * (2 * 8 * 64 * 32)  # forward + weight gradient (input needs none)
    assert probe.result.ops > 3
    assert probe.result.matmul_flops_by_dtype == {"fp32": probe.result.flops}
    assert probe.result.compute_dtype == "fp32" and probe.result.autocast is None


def test_probe_sees_the_dtype_autocast_runs():
    probe = FlopProbe(WarningSink(emit=False), step=1)
    model = torch.nn.Linear(64, 32)
    for index in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(torch.randn(8, 64))
        out.float().sum().backward()
        probe.on_commit(index)
    assert probe.result.compute_dtype == "bf16"
    assert probe.result.autocast == "cpu:bf16"
    assert set(probe.result.matmul_flops_by_dtype) == {"bf16"}


def _count(module, inputs, fused: bool):
    with torch.backends.mkldnn.flags(enabled=fused), OpCounter() as counter:
        output, _ = module(inputs)
        output.sum().backward()
    return counter


@pytest.mark.filterwarnings("ignore::UserWarning")  # oneDNN's TF32 note when its flags are set
def test_a_fused_lstm_counts_the_flops_its_unfused_matmuls_count():
    """On a CPU an LSTM runs as one oneDNN operator a layer, which torch's FLOP registry does not
    know: its matmuls were missing from the step's FLOPs and MFU. With oneDNN off the same layers run
    as the registry's mm/addmm: the forward's count is the same to the FLOP, the backward's within
    2 % (the fused kernel also computes the initial hidden state's gradient)."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(48, 32, 2, bidirectional=True)
    inputs = torch.randn(7, 5, 48, requires_grad=True)
    fused, unfused = _count(lstm, inputs, True), _count(lstm, inputs, False)
    assert set(fused.flops_by_op) == {"mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"}
    # per layer: 2 directions x 2 FLOPs x 35 tokens x its weights' elements (layer 2 reads both directions)
    per_layer = [2 * 2 * 35 * (128 * 48 + 128 * 32), 2 * 2 * 35 * (128 * 64 + 128 * 32)]
    assert fused.flops_by_op["mkldnn_rnn_layer"] == unfused.flops_by_op["addmm"] == sum(per_layer)
    assert fused.flops == pytest.approx(unfused.flops, rel=0.02)
    assert fused.matmul_dtypes["mkldnn_rnn_layer"] == "fp32"
    gru = torch.nn.GRU(48, 32, 2)  # decomposed into the registry's matmuls whatever the flags: unchanged
    assert _count(gru, inputs, True).flops == _count(gru, inputs, False).flops > 0


def test_cudnn_and_miopen_rnn_flops_from_their_arguments():
    """cuDNN's and MIOpen's fused RNNs take every layer's weights in one list; a packed sequence is one
    row a token. Checked on CPU tensors of the shapes those operators receive (no GPU here)."""
    w = [torch.empty(128, 48), torch.empty(128, 32), torch.empty(128), torch.empty(128)]  # one LSTM layer
    padded, packed = torch.empty(7, 5, 48), torch.empty(23, 48)
    forward = 2 * 35 * (128 * 48 + 128 * 32)
    assert rnn_flops("_cudnn_rnn", (padded, w, 4)) == forward
    assert rnn_flops("miopen_rnn", (padded, w, 4)) == forward
    assert rnn_flops("_cudnn_rnn", (packed, w, 4)) == 2 * 23 * (128 * 48 + 128 * 32)
    tail = ("mode", "hidden", "proj", "layers", "first", 0.0, True, False, [], None, None)
    assert rnn_flops("_cudnn_rnn_backward", (padded, w, *tail, [True, False, False, True])) == 2 * forward
    assert rnn_flops("_cudnn_rnn_backward", (padded, w, *tail, [True, False, False, False])) == forward
    assert rnn_flops("mkldnn_rnn_layer", (padded, w[0], w[1], w[2], w[3])) == forward
    assert rnn_flops("_cudnn_rnn", (None, w)) == rnn_flops("_cudnn_rnn", ()) == 0  # not what it takes: none


def test_ops_inside_data_loading_are_counted_apart():
    loading = [False]
    probe = FlopProbe(WarningSink(emit=False), in_data_wait=lambda: loading[0], step=1)
    for index in range(3):
        loading[0] = True
        batch = torch.randn(4, 4).mul(2).add(1)  # a transform run by next(loader)
        loading[0] = False
        batch.sum()
        probe.on_commit(index)
    assert probe.result.data_ops >= 3
    assert 1 <= probe.result.ops < probe.result.data_ops


def _copy_to_meta(batch, **kwargs):
    return batch.to("meta", **kwargs)  # the copy's line


def test_copies_between_devices_are_recorded_at_the_users_line_with_bytes_and_pinning():
    probe = FlopProbe(WarningSink(emit=False), step=1)
    host = torch.randn(64, 32)  # pageable: 8 KiB
    for index in range(3):
        on_device = _copy_to_meta(host)
        _copy_to_meta(host[:8], non_blocking=True)
        torch.empty(4, device="meta").copy_(torch.ones(4))  # dst.copy_(src) across devices
        host.to(torch.float16)  # a cast on the host: no copy between devices
        host.to("cpu")  # already there: no copy at all
        on_device.add(1)
        probe.on_commit(index)
    copies = probe.result.copies
    here = __file__
    line = _copy_to_meta.__code__.co_firstlineno + 1
    assert [(item.file, item.line, item.function) for item in copies[:2]] == [(here, line, "_copy_to_meta")] * 2
    blocking, asked = copies[0], copies[1]
    assert (blocking.bytes, blocking.count, blocking.pinned, blocking.non_blocking) == (64 * 32 * 4, 1, False, False)
    assert (asked.bytes, asked.non_blocking) == (8 * 32 * 4, True)
    assert blocking.source == "cpu" and blocking.target == "meta" and blocking.to_device
    assert [(item.bytes, item.function) for item in copies[2:]] == [(16, "test_copies_between_devices_are_recorded_at_the_users_line_with_bytes_and_pinning")]


def test_probe_closed_mid_step_discards_the_count():
    probe = FlopProbe(WarningSink(emit=False), step=1)
    probe.on_commit(0)
    probe.close()
    assert probe.result is None
    torch.ones(2).add(1)  # no mode left active


COUNT_WITHOUT_AND_THEN_WITH_COMPILE = """
import sys, torch
from stepscope.capture.flops import OpCounter

model = torch.nn.Linear(8, 4)
x = torch.randn(2, 8)
with OpCounter() as counter:
    eager = model(x)
print("count", counter.count, "dynamo", "torch._dynamo" in sys.modules)
with OpCounter(function_mode=False) as counter:
    compiled = torch.compile(model, backend="eager")  # dynamo is first imported inside the count
    for _ in range(3):
        out = compiled(x)
from torch._dynamo.utils import counters
print("compiled", counter.count > 0, counters["stats"]["unique_graphs"], len(counters["graph_break"]),
      torch.equal(out, eager))
"""


def test_counting_a_step_does_not_import_dynamo_and_a_compile_started_inside_it_still_compiles():
    """torch wraps a dispatch mode in torch._disable_dynamo, whose first call imports torch._dynamo
    (1.8 s on a 2-core box, inside the counted step of every run); a script that never compiles
    must not pay it, and one that starts compiling inside the count compiles as without it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = str(Path(__file__).resolve().parents[3] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    result = subprocess.run([sys.executable, "-c", COUNT_WITHOUT_AND_THEN_WITH_COMPILE], env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].split()[2:] == ["dynamo", "False"] and int(lines[0].split()[1]) >= 2, lines
    assert lines[1] == "compiled True 1 0 True", lines
