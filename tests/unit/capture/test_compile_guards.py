"""Every guard that failed before a recompilation, checked on real dynamo guard trees (torch 2.13,
backend eager): dynamo itself reports only the first failed check of a cached variant."""

from __future__ import annotations

import torch
from torch import nn

from stepscope.capture.compile_watch import failed_guards, source_name


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, scale: int) -> torch.Tensor:
        return self.drop(self.linear(x)) * scale


def test_a_mode_switch_fails_the_grad_mode_size_value_and_training_guards_and_all_are_named():
    import torch._dynamo
    import torch._dynamo.guards as guards

    torch._dynamo.reset()
    original = guards.get_guard_fail_reason_helper
    seen: list[tuple[str, list[str]]] = []

    def helper(guard_manager, f_locals, *args, **kwargs):
        reason = original(guard_manager, f_locals, *args, **kwargs)
        seen.append((reason, failed_guards(guard_manager, f_locals)))
        return reason

    guards.get_guard_fail_reason_helper = helper
    try:
        model = Model()
        model.compile(backend="eager")
        model(torch.randn(4, 8), 2)
        model.eval()
        with torch.no_grad():
            model(torch.randn(5, 8), 3)
    finally:
        guards.get_guard_fail_reason_helper = original
        torch._dynamo.reset()
    ((reason, found),) = seen
    assert "grad_mode" in reason and "size" not in reason  # dynamo: the first failure only
    assert found == ["global state: grad_mode", "x: size (dim 0) 4 -> 5", "scale == 2, now 3",
                     "self.drop.training == True, now False"], found


def test_guard_sources_read_as_code():
    assert source_name("L['self']._modules['encoder']._modules['layers']") == "self.encoder.layers"
    assert source_name("L['src']") == "src" and source_name("G['CONFIG']") == "CONFIG"
    assert source_name("L['self'].__dict__['_modules']['pos_encoder'].dropout") == "self.pos_encoder.dropout"
