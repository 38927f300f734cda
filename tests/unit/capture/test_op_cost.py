"""The price of a tiny operator: measured without touching the RNG or importing the compiler,
cached per machine, never fatal; the launch-overhead estimate uses it where a run measured it."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest

torch = pytest.importorskip("torch")

from stepscope.capture import op_cost  # noqa: E402
from stepscope.record.run import OpCost  # noqa: E402


def test_measurement_is_plausible_and_leaves_the_rng_and_grad_mode_alone():
    torch.manual_seed(123)
    state = torch.get_rng_state()
    with torch.no_grad():
        cost = op_cost.measure_op_cost(repetitions=3, max_s=0.05)
        assert not torch.is_grad_enabled()
    assert torch.equal(torch.get_rng_state(), state)
    assert 1e-7 < cost.seconds_best <= cost.seconds_median < 1e-3
    assert cost.ops > 10 * op_cost.LAYERS and cost.repetitions >= 3 and cost.source == "measured"


def test_first_call_measures_and_caches_then_the_cache_answers(cache_home, monkeypatch):
    calls = []
    monkeypatch.setattr(op_cost, "measure_op_cost", lambda: calls.append(1) or OpCost(4e-6, 4.2e-6, 400, 15))
    first = op_cost.op_cost_at_torch_import(lambda cause, text: pytest.fail(text))
    second = op_cost.op_cost_at_torch_import(lambda cause, text: pytest.fail(text))
    assert len(calls) == 1 and first.source == "measured" and second.source == "cache"
    assert (second.seconds_best, second.seconds_median, second.ops) == (4e-6, 4.2e-6, 400)
    assert op_cost.cache_path() == cache_home / "stepscope" / "op_cost.json"
    (key,) = orjson.loads(op_cost.cache_path().read_bytes())["entries"]
    assert key == op_cost.machine_key() and "torch=" in key and "cores=" in key and op_cost.MODEL in key


def test_a_disturbed_measurement_is_taken_again_and_the_lower_cost_kept(cache_home, monkeypatch):
    op_cost.store_op_cost(OpCost(5e-6, 9e-6, 400, 15))  # its median 1.8x its fastest: disturbed
    monkeypatch.setattr(op_cost, "measure_op_cost", lambda: OpCost(4e-6, 4.4e-6, 400, 15))
    cost = op_cost.op_cost_at_torch_import(lambda *args: None)
    assert (cost.seconds_best, cost.seconds_median, cost.source) == (4e-6, 4.4e-6, "measured")
    monkeypatch.setattr(op_cost, "measure_op_cost", lambda: pytest.fail("measured again"))
    assert op_cost.op_cost_at_torch_import(lambda *args: None).source == "cache"  # steady now


def test_a_failed_measurement_or_an_unwritable_cache_is_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    warned: list[str] = []
    monkeypatch.setattr(op_cost, "measure_op_cost", lambda: OpCost(4e-6, 4e-6, 400, 15))
    assert op_cost.op_cost_at_torch_import(lambda cause, text: warned.append(cause)).seconds_best == 4e-6
    monkeypatch.setattr(op_cost, "measure_op_cost", lambda: 1 / 0)
    assert op_cost.op_cost_at_torch_import(lambda cause, text: warned.append(cause)) is None
    assert warned == ["op-cost-cache", "op-cost"]


def test_a_damaged_cache_reads_as_empty(cache_home):
    path = op_cost.cache_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"{not json")
    assert op_cost.cached_op_cost() is None
    path.write_bytes(orjson.dumps({"entries": {op_cost.machine_key(): {"seconds_best": "fast"}}}))
    assert op_cost.cached_op_cost() is None


def _overhead(cost: OpCost | None, ops: int = 1000, step_s: float = 0.02):
    from dataclasses import replace

    from stepscope.analysis.bundle import op_overhead
    from stepscope.record.run import CaptureFacts, ComputeFacts

    steady = type("Steady", (), {"step_time_mean_s": step_s})()
    return op_overhead(replace(CaptureFacts(), compute=ComputeFacts(step_index=4, flops=1, ops=ops), op_cost=cost),
                       steady)


def test_the_price_of_an_operator_scales_with_the_machine_s_measured_cost():
    from stepscope.analysis.bundle import EAGER_OP_OVERHEAD_S, REFERENCE_OP_COST_S

    assert _overhead(None).price_s == EAGER_OP_OVERHEAD_S and not _overhead(None).measured
    reference = _overhead(OpCost(REFERENCE_OP_COST_S, REFERENCE_OP_COST_S))
    assert reference.measured and reference.price_s == pytest.approx(EAGER_OP_OVERHEAD_S)
    slower = _overhead(OpCost(2.5 * REFERENCE_OP_COST_S, 3 * REFERENCE_OP_COST_S))  # the fastest step decides
    assert slower.price_s == pytest.approx(2.5 * EAGER_OP_OVERHEAD_S)
    assert slower.share == pytest.approx(1000 * 2.5 * EAGER_OP_OVERHEAD_S / 0.02)


def test_measuring_imports_neither_sympy_nor_the_compiler():
    """The first run on a machine pays the measurement (~0.1 s): building on the meta device
    (``skip_init``) would import sympy (0.46 s) and a torch.optim optimizer torch._dynamo (1.3 s)."""
    code = ("import sys, torch\nfrom stepscope.capture.op_cost import measure_op_cost\nmeasure_op_cost(3, 0.01)\n"
            "print('sympy' in sys.modules, 'torch._dynamo' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]
