"""Top code locations per phase, folding of library frames, worker samples apart, flame text."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from records import make_record
from stepscope.analysis.run.code_locations import (
    attribute_code,
    collapse_stacks,
    function_name,
)
from stepscope.record.run import PHASES, STACK_ROLES, StackFrame, StackSamples
from stepscope.report.render.flame import folded_text as format_collapsed

LIB = "/usr/lib/python3.11/"
SITE = "/venv/lib/python3.11/site-packages/"
FRAMES = (
    StackFrame(LIB + "runpy.py", 88, "_run_code"),                     # 0 library (root)
    StackFrame("/home/me/train.py", 50, "main"),                        # 1 user
    StackFrame("/home/me/train.py", 41, "tokenize.<locals>.<listcomp>"),  # 2 user (comprehension)
    StackFrame(SITE + "torch/nn/modules/module.py", 1500, "_call_impl"),  # 3 library
    StackFrame("/home/me/train.py", 60, "log_metrics"),                 # 4 user
    StackFrame(SITE + "torch/utils/data/_utils/worker.py", 300, "_worker_loop"),  # 5 library
    StackFrame("/home/me/data.py", 12, "Dataset.__getitem__"),          # 6 user
    StackFrame("<frozen importlib._bootstrap>", 1, "_call_with_frames_removed"),  # 7 synthetic
)
STACKS = ((0, 1, 3), (0, 1, 4), (0, 1, 4, 3), (5, 6), (5,), (0, 1, 2))


def with_samples(rows: list[tuple[int, str, str, int]], count: int = 5):
    """rows: (step, phase, role, stack id)."""
    record = make_record(count)
    samples = StackSamples(
        rate_hz=100.0, mechanism="test", frames=FRAMES, stacks=STACKS,
        ts_ns=np.arange(len(rows), dtype=np.int64),
        step=np.array([row[0] for row in rows], dtype=np.int64),
        phase=np.array([PHASES.index(row[1]) for row in rows], dtype=np.int64),
        role=np.array([STACK_ROLES.index(row[2]) for row in rows], dtype=np.int64),
        pid=np.full(len(rows), 7, dtype=np.int64),
        stack=np.array([row[3] for row in rows], dtype=np.int64),
        library_paths=(LIB, SITE), user_paths=())
    record = replace(record, stack_samples=samples)
    record.check()
    return record


ALL = np.ones(5, dtype=bool)


def test_library_frames_fold_into_the_user_line_that_called_them():
    rows = [(1, "forward", "main", 0)] * 3 + [(1, "other", "main", 1)] * 2 + [(1, "other", "main", 2)] * 6
    result = attribute_code(with_samples(rows), ALL)
    forward = result.phase("forward")
    assert forward.top.line == 50 and forward.top.function == "main" and not forward.top.library
    other = result.phase("other")
    assert (other.top.file, other.top.line, other.top.function) == ("/home/me/train.py", 60, "log_metrics")
    assert other.top.share_of_phase == pytest.approx(1.0)
    assert other.top.share_of_step == pytest.approx(8 / 11)
    assert other.top.label == "train.py:60 log_metrics()"
    # the record's steps have 50 ns of "other" each: the estimate splits the measured phase time
    assert other.top.estimated_s == pytest.approx(5 * 50 / 1e9)
    assert result.samples == 11 and result.workers is None


def test_comprehensions_are_reported_under_their_function():
    result = attribute_code(with_samples([(0, "other", "main", 5)] * 4), ALL)
    assert result.phase("other").top.function == "tokenize"
    assert function_name("a.<locals>.<dictcomp>.<genexpr>") == "a"
    assert function_name("<module>") == "<module>"


def test_worker_samples_are_reported_apart_with_library_only_stacks_marked():
    rows = [(2, "data_wait", "main", 0)] * 4 + [(2, "data_wait", "worker", 3)] * 3 + [(2, "data_wait", "worker", 4)]
    result = attribute_code(with_samples(rows), ALL)
    workers = result.workers
    assert workers.role == "worker" and workers.samples == 4
    assert workers.top.label == "data.py:12 Dataset.__getitem__()"
    assert workers.top.share_of_phase == pytest.approx(0.75)
    idle = workers.locations[1]
    assert idle.library and idle.function == "_worker_loop"
    # data wait is 40% of the record's steps: a worker line's share of the step scales with it
    assert workers.top.share_of_step == pytest.approx(0.75 * 0.4)
    assert result.phase("data_wait").samples == 4


def test_samples_outside_the_chosen_steps_are_left_out():
    rows = [(-1, "other", "main", 1), (0, "other", "main", 1), (3, "forward", "main", 0)]
    mask = np.array([True, False, False, False, False])
    result = attribute_code(with_samples(rows), mask)
    assert result.samples == 1 and [item.phase for item in result.phases] == ["other"]


def test_no_samples_gives_an_empty_result_with_a_note():
    result = attribute_code(make_record(), ALL)
    assert result.phases == () and result.workers is None and "no stack samples" in result.notes[0]
    assert result.to_dict()["phases"] == []


def test_to_dict_is_plain_data():
    import json

    result = attribute_code(with_samples([(1, "other", "main", 1)] * 2), ALL)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["phases"][0]["locations"][0]["label"] == "train.py:60 log_metrics()"


def test_collapsed_stacks_fold_library_frames_and_count():
    rows = [(1, "other", "main", 1)] * 2 + [(1, "other", "main", 2)] + [(1, "forward", "main", 0)]
    record = with_samples(rows)
    stacks = collapse_stacks(record, "other", ALL)
    text = format_collapsed(stacks)
    assert text == "main (train.py:50);log_metrics (train.py:60) 3\n"
    full = format_collapsed(collapse_stacks(record, "other", ALL, keep_library=True))
    assert "_run_code (runpy.py:88);main (train.py:50);log_metrics (train.py:60);_call_impl (module.py:1500) 1" in full
    workers = collapse_stacks(with_samples([(1, "data_wait", "worker", 4)]), "workers", ALL)
    assert format_collapsed(workers) == "_worker_loop (worker.py:300) 1\n"


def test_collapse_rejects_an_unknown_phase():
    with pytest.raises(ValueError, match="unknown phase 'fwd'; choose one of: data_wait"):
        collapse_stacks(with_samples([]), "fwd")


@pytest.mark.parametrize("qualname, folded", [
    ("tokenize.<locals>.<listcomp>", "tokenize"),
    ("f.<locals>.g.<locals>.<genexpr>", "f.<locals>.g"),
    ("Model.<genexpr>", "Model"),  # a comprehension in a class body: no <locals>
    ("<genexpr>", "<genexpr>"),
    ("<lambda>", "<lambda>"),
    ("plain", "plain"),
])
def test_comprehensions_fold_into_their_function_and_never_loop(qualname, folded):
    from stepscope.analysis.run.code_locations import function_name

    assert function_name(qualname) == folded
