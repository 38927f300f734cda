"""PyTorchProfiler in plain loops: validation, labels, schedules, traces, reports, copying, NVTX."""

from __future__ import annotations

import copy
import pickle
import sys

import pytest
import torch
from torch.profiler import ProfilerAction

from stepscope.errors import UsageError
from stepscope.profilers import ProfilerKeyError
from stepscope.profilers.pytorch import PyTorchProfiler
from stepscope.profilers.pytorch_schedule import DEFAULT_SCHEDULE, CycleSchedule, StageSchedule, stage_of

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _train(profiler: PyTorchProfiler, model: torch.nn.Module, steps: int) -> None:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        with profiler.profile("step"):
            with profiler.profile("forward"):
                loss = model(torch.randn(2, 4)).sum()
            with profiler.profile("backward"):
                loss.backward()
            with profiler.profile("optimizer"):
                optimizer.step()
                optimizer.zero_grad()


def _traces(directory):
    return sorted(path.name for path in directory.glob("*.pt.trace.json"))


# -- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"schedule": 3}, UsageError, "Schedule should be a callable. Found: 3"),
        ({"schedule": lambda step: 1}, UsageError, "Schedule should return a `torch.profiler.ProfilerAction`. Found: 1"),
        ({"sort_by_key": "bogus"}, UsageError, r"Found sort_by_key: bogus. Should be within .*'cpu_time_total'"),
        ({"table_kwargs": {"sort_by": "x"}}, KeyError, "Found invalid table_kwargs key: sort_by. This is already a positional"),
        ({"table_kwargs": {"row_limit": 2}}, KeyError, "Found invalid table_kwargs key: row_limit. This is already a positional"),
        ({"table_kwargs": {"self": 1}}, KeyError, r"Found invalid table_kwargs key: self. Should be within .*max_name_column_width"),
        ({"table_kwargs": {"nope": 1}}, ProfilerKeyError, "Found invalid table_kwargs key: nope."),
        ({"wait": 1, "active": 2}, UsageError, r"unknown keyword argument\(s\) 'active', 'wait'.*pass schedule=torch.profiler.schedule"),
        ({"profile_memroy": True}, UsageError, r"unknown keyword argument\(s\) 'profile_memroy'. Accepted: .*'profile_memory'"),
        ({"group_by_input_shapes": True}, UsageError, "group_by_input_shapes=True needs record_shapes=True"),
        ({"emit_nvtx": True}, UsageError, "emit_nvtx=True needs a CUDA device"),
        ({"row_limit": 0.5}, UsageError, "row_limit must be an int"),
        ({"row_limit": -2}, UsageError, "row_limit must be an int"),
        ({"export_to_chrome": "yes"}, UsageError, "export_to_chrome must be True or False"),
        ({"metric": "wall"}, UsageError, "metric must be one of"),
    ],
)
def test_constructor_validation(kwargs, error, message):
    with pytest.raises(error, match=message):
        PyTorchProfiler(**kwargs)


def test_defaults_follow_lightning():
    profiler = PyTorchProfiler()
    config = profiler.config
    assert config.sort_by_key == "cpu_time_total"  # no CUDA here
    assert list(config.torch_kwargs["activities"]) == [torch.profiler.ProfilerActivity.CPU]
    assert config.schedule == DEFAULT_SCHEDULE
    assert (DEFAULT_SCHEDULE.wait, DEFAULT_SCHEDULE.warmup, DEFAULT_SCHEDULE.active) == (1, 1, 3)
    assert config.row_limit == 20 and config.export_to_chrome and config.record_module_names
    assert PyTorchProfiler(schedule=None).config.schedule is None


# -- labels ------------------------------------------------------------------------------------
def test_nested_actions_are_labelled():
    profiler = PyTorchProfiler(schedule=None)
    with profiler.profile("a"):
        torch.ones(1)
        with profiler.profile("b"):
            torch.zeros(1)
            with profiler.profile("c"):
                torch.ones(1) + 1
    profiler._delete_profilers()
    names = {event.name for event in profiler.function_events}
    assert {name for name in names if name.startswith("[pl]")} == {"[pl][profile]a", "[pl][profile]b", "[pl][profile]c"}
    assert {"aten::ones", "aten::zeros", "aten::add"} <= names


def test_module_names_are_recorded_for_a_watched_module():
    model = torch.nn.Module()
    model.layer = _model()
    profiler = PyTorchProfiler(schedule=None)
    profiler.watch_module(model)
    with profiler.profile("forward"):
        model.layer(torch.randn(2, 4))
    profiler._delete_profilers()
    names = {event.name for event in profiler.function_events}
    assert {
        "[pl][module]torch.nn.modules.container.Sequential: layer",
        "[pl][module]torch.nn.modules.linear.Linear: layer.0",
        "[pl][module]torch.nn.modules.activation.ReLU: layer.1",
        "[pl][module]torch.nn.modules.linear.Linear: layer.2",
    } <= names
    assert model.layer[0]._forward_pre_hooks == {}  # hooks removed when profiling ended


# -- schedules -----------------------------------------------------------------------------------
def test_stage_of_step_actions():
    assert stage_of("step") == "train"
    assert stage_of("[Strategy]SingleDeviceStrategy.training_step") == "train"
    assert stage_of("[Strategy]DDPStrategy.validation_step") == "validate"
    assert stage_of("x.test_step") == "test" and stage_of("x.predict_step") == "predict"
    assert stage_of("forward") is None and stage_of("steps") is None


def test_stage_schedule_keeps_one_counter_per_stage():
    seen = []
    wrapper = StageSchedule(lambda step: seen.append(step) or ProfilerAction.NONE)
    for action in ("step", "a.validation_step", "step", "a.validation_step", "a.test_step"):
        wrapper.pre_step(action)
        wrapper(999)
    assert seen == [1, 1, 2, 2, 1]


def test_stage_schedule_skips_sanity_check_validation():
    wrapper = StageSchedule(lambda step: ProfilerAction.NONE)
    wrapper.setup("[Callback]X.on_fit_start")
    wrapper.pre_step("m.validation_step")
    wrapper(0)
    assert wrapper.counts["validate"] == 0
    wrapper.pre_step("m.training_step")
    wrapper(0)
    wrapper.pre_step("m.validation_step")
    wrapper(0)
    assert wrapper.counts == {"train": 1, "validate": 1, "test": 0, "predict": 0}


def test_plain_loop_step_k_runs_under_schedule_k():
    calls = []

    def schedule(step):
        calls.append(step)
        return ProfilerAction.NONE

    wrapper = StageSchedule(schedule)
    wrapper.setup("step")  # profiling began with the step action itself
    assert wrapper(0) == ProfilerAction.NONE and calls == [0]
    wrapper.pre_step("step")
    wrapper(1)
    assert calls == [0, 1]
    hook_started = StageSchedule(schedule)
    hook_started.setup("[LightningModule]M.on_fit_start")  # Lightning: nothing before the first step
    assert hook_started(0) == ProfilerAction.NONE and calls == [0, 1]


def test_stage_schedule_turns_warmup_after_record_into_record():
    actions = iter([ProfilerAction.RECORD, ProfilerAction.WARMUP])
    wrapper = StageSchedule(lambda step: next(actions))
    wrapper.pre_step("step")
    assert wrapper(0) == ProfilerAction.RECORD
    wrapper.pre_step("x.validation_step")
    assert wrapper(0) == ProfilerAction.RECORD


def test_default_schedule_records_one_window_per_run(tmp_path, console):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="prof")
    profiler.setup("run", local_rank=0, log_dir=tmp_path)
    _train(profiler, _model(), steps=9)
    profiler.describe()
    traces = _traces(tmp_path)
    assert len(traces) == 1 and traces[0].startswith("run-prof-0-step.")


def test_repeat_in_a_user_schedule_is_honoured(tmp_path, console):
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=3)
    profiler = PyTorchProfiler(dirpath=tmp_path, schedule=schedule)
    _train(profiler, _model(), steps=12)
    profiler.describe()
    assert len(_traces(tmp_path)) == 3  # Lightning records one cycle and ignores repeat


def test_too_short_run_says_nothing_was_recorded(console):
    profiler = PyTorchProfiler()
    profiler.setup("run")
    _train(profiler, _model(), steps=1)
    profiler.describe()
    assert "No operator was recorded: the run ended before the schedule's first recording window" in console.getvalue()
    assert "(wait=1, warmup=1, active=3)" in console.getvalue()


def test_no_dirpath_warns_once_that_no_trace_was_written(console):
    profiler = PyTorchProfiler(schedule=torch.profiler.schedule(wait=0, warmup=1, active=1))
    with pytest.warns(RuntimeWarning, match="no trace was exported because dirpath is None"):
        _train(profiler, _model(), steps=6)
    profiler.describe()


# -- reports -----------------------------------------------------------------------------------
def test_report_file_per_rank_with_rank_in_header(tmp_path, console):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="profiler", schedule=None, row_limit=5)
    profiler.setup("run", local_rank=1)
    _train(profiler, _model(), steps=2)
    profiler.describe()
    text = (tmp_path / "run-profiler-1.txt").read_text()
    assert text.splitlines()[:2] == ["RUN Profiler Report", "Profile stats for: records rank: 1"]
    assert "[pl][profile]step" in text and "Self CPU time total" in text
    assert console.getvalue() == ""  # rank 1 does not announce on the console


def test_table_kwargs_reach_the_table(console):
    widths = {}
    for width in (5, 30):
        profiler = PyTorchProfiler(schedule=None, table_kwargs={"max_name_column_width": width})
        _train(profiler, _model(), steps=1)
        header_rule = profiler.summary().splitlines()[2]
        widths[width] = len(header_rule.split()[0])
    assert widths[5] < widths[30]


def test_deepcopy_and_pickle_while_profiling(tmp_path):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="p")
    profiler.start("step")
    torch.ones(3) * 2
    clones = [copy.deepcopy(profiler), pickle.loads(pickle.dumps(profiler))]
    profiler.stop("step")
    profiler.teardown(None)
    for clone in clones:
        assert clone.profiler is None and clone._recording_map == {}
        assert clone.config.schedule == DEFAULT_SCHEDULE and clone.filename == "p"
        clone = PyTorchProfiler(schedule=None) if clone is None else clone
        clone._schedule = None
        clone.start("work")
        torch.ones(2) + 1
        clone.stop("work")
        clone._delete_profilers()
        assert any(event.name == "[pl][profile]work" for event in clone.function_events)


def test_cycle_schedule_matches_torch_and_pickles():
    ours = CycleSchedule(wait=1, warmup=2, active=2, repeat=2, skip_first=1)
    theirs = torch.profiler.schedule(wait=1, warmup=2, active=2, repeat=2, skip_first=1)
    assert [ours(step) for step in range(14)] == [theirs(step) for step in range(14)]
    assert pickle.loads(pickle.dumps(ours)) == ours


# -- NVTX (no GPU here: fakes of exactly the functions the profiler calls) ----------------------------
class _FakeContext:
    def __init__(self, log, name, **kwargs):
        self.log, self.name, self.kwargs = log, name, kwargs

    def __enter__(self):
        self.log.append(f"enter {self.name}")
        return self

    def __exit__(self, *exc):
        self.log.append(f"exit {self.name}")


def test_emit_nvtx_wraps_autograd_ranges_in_the_cuda_profiler(monkeypatch, console):
    log: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.profiler, "profile", lambda: _FakeContext(log, "cuda.profiler"))
    monkeypatch.setattr(torch.autograd.profiler, "emit_nvtx", lambda **kw: _FakeContext(log, "emit_nvtx", **kw))
    profiler = PyTorchProfiler(emit_nvtx=True, activities=[torch.profiler.ProfilerActivity.CPU])
    with profiler.profile("step"):
        torch.ones(1)
    profiler.describe()
    assert log == ["enter cuda.profiler", "enter emit_nvtx", "exit emit_nvtx", "exit cuda.profiler"]
    assert console.getvalue() == ""


@pytest.mark.skipif(sys.platform != "linux", reason="flame graph export is exercised on Linux CI")
def test_flame_graph_export_goes_to_dirpath(tmp_path, console):
    profiler = PyTorchProfiler(dirpath=tmp_path, export_to_flame_graph=True, schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1))
    _train(profiler, _model(), steps=2)
    profiler.describe()
    assert [path.name for path in tmp_path.glob("*.stack")] == ["step.stack"]


def test_configuration_errors_pickle_across_processes():
    with pytest.raises(UsageError) as caught:
        PyTorchProfiler(sort_by_key="bogus")
    restored = pickle.loads(pickle.dumps(caught.value))
    assert isinstance(restored, UsageError) and isinstance(restored, ValueError)
    assert str(restored) == str(caught.value)
