"""GC pauses from gc.callbacks."""

from __future__ import annotations

import gc

from stepscope.capture.gc_pauses import GcPauseRecorder
from stepscope.capture.recorder import BACKWARD, StepRecorder
from stepscope.record.run import PHASES, StepTable


def make_cycles(count: int) -> None:
    for _ in range(count):
        node: dict = {}
        node["self"] = node


def test_a_collection_is_timed_with_its_generation_phase_and_counts():
    recorder = StepRecorder()
    recorder._phase = BACKWARD
    pauses = GcPauseRecorder(recorder).start()
    try:
        make_cycles(100)
        gc.collect()
    finally:
        pauses.stop()
    frozen = pauses.freeze(StepTable.empty())
    frozen.check()
    assert frozen.enabled
    full = frozen.generation == 2
    assert full.any()
    assert frozen.collected[full].max() >= 100
    assert (frozen.duration_ns > 0).all()
    assert set(frozen.phase.tolist()) == {PHASES.index("backward")}
    assert (frozen.step == -1).all()


def test_stop_removes_the_callback():
    pauses = GcPauseRecorder().start()
    pauses.stop()
    pauses.stop()
    before = len(pauses.columns["start_ns"])
    gc.collect()
    assert len(pauses.columns["start_ns"]) == before
    assert not any(getattr(item, "__name__", "") == "stepscope_gc_callback" for item in gc.callbacks)
