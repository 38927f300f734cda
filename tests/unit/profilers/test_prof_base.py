"""The Profiler base class: file naming, report streams, setup rules, copying, custom subclasses."""

from __future__ import annotations

import copy
import importlib.util
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepscope.profilers import PassThroughProfiler, Profiler, SimpleProfiler


class ActionCounter(Profiler):
    """The README's custom profiler: counts actions and remembers their first occurrence."""

    def __init__(self, dirpath=None, filename=None):
        super().__init__(dirpath=dirpath, filename=filename)
        self.counts: dict[str, int] = {}
        self.first_seen: dict[str, int] = {}
        self._events = 0

    def start(self, action_name: str) -> None:
        self._events += 1
        self.first_seen.setdefault(action_name, self._events)
        self.counts[action_name] = self.counts.get(action_name, 0) + 1

    def stop(self, action_name: str) -> None:
        pass

    def summary(self) -> str:
        rows = sorted(self.counts.items(), key=lambda item: self.first_seen[item[0]])
        return self._stats_to_str({"actions": "\n".join(f"{name}: {count}" for name, count in rows)})


@pytest.mark.parametrize(
    ("stage", "filename", "rank", "action", "extension", "expected"),
    [
        ("fit", "profiler", None, None, ".txt", "fit-profiler.txt"),
        ("fit", "profiler", 1, None, ".txt", "fit-profiler-1.txt"),
        (None, None, None, None, ".prof", "profile.prof"),
        (None, None, None, "test", ".prof", "test.prof"),
        ("run", None, 0, "step", "", "run-0-step"),
        ("fit", "", None, "a/b\\c:d*e?f\"g<h>i|j\nk\rl\tm", ".prof", "fit-a_b_c_d_e_f_g_h_i_j_k_l_m.prof"),
        (None, None, None, "//::", ".txt", "_.txt"),
    ],
)
def test_prepare_filename_follows_lightning_rule(stage, filename, rank, action, extension, expected):
    profiler = PassThroughProfiler(filename=filename)
    profiler._stage, profiler._local_rank = stage, rank
    assert profiler._prepare_filename(action_name=action, extension=extension) == expected


def test_setup_keeps_explicit_dirpath_and_uses_log_dir_otherwise(tmp_path):
    explicit = SimpleProfiler(dirpath=tmp_path / "mine", filename="p")
    explicit.setup("fit", None, str(tmp_path / "logs"))
    assert explicit.dirpath == tmp_path / "mine"
    implicit = SimpleProfiler(filename="p")
    assert implicit.dirpath is None
    implicit.setup("fit", 3, str(tmp_path / "logs"))
    assert implicit.dirpath == str(tmp_path / "logs")
    assert implicit.local_rank == 3
    assert implicit.report_path == tmp_path / "logs" / "fit-p-3.txt"


def test_describe_prints_to_console_without_filename(console, tmp_path):
    profiler = ActionCounter(dirpath=tmp_path)  # dirpath alone: still the console
    profiler.setup("fit")
    with profiler.profile("a"):
        pass
    profiler.describe()
    assert console.getvalue() == "FIT Profiler Report\nProfile stats for: actions\na: 1\n"
    assert list(tmp_path.iterdir()) == []


def test_describe_console_only_on_rank_zero(console):
    profiler = ActionCounter()
    profiler.setup("fit", local_rank=1)
    with profiler.profile("a"):
        pass
    profiler.describe()
    assert console.getvalue() == ""


def test_describe_writes_file_in_append_mode_and_announces_it(console, tmp_path):
    target = tmp_path / "new" / "dir"  # created on demand
    profiler = ActionCounter(dirpath=target, filename="counts")
    for stage in ("validate", "validate"):
        profiler.setup(stage, local_rank=0)
        with profiler.profile("x"):
            pass
        profiler.describe()
    text = (target / "validate-counts-0.txt").read_text()
    assert text.count("VALIDATE Profiler Report") == 2
    assert "Profile stats for: actions rank: 0" in text
    assert console.getvalue().splitlines() == [f"validate profiler report written to {target / 'validate-counts-0.txt'}"] * 2
    assert profiler._output_file is None  # closed by teardown


def test_describe_standalone_without_setup(console, tmp_path):
    profiler = ActionCounter(dirpath=tmp_path, filename="profiler")
    with profiler.profile("a"):
        pass
    profiler.describe()
    assert (tmp_path / "profiler.txt").read_text().startswith("Profiler Report")


def test_profile_stops_even_when_the_block_raises():
    profiler = SimpleProfiler()
    with pytest.raises(RuntimeError, match="boom"):
        with profiler.profile("failing"):
            raise RuntimeError("boom")
    assert profiler.current_actions == {}
    assert len(profiler.recorded_durations["failing"]) == 1


def test_profile_yields_the_action_name():
    for profiler in (PassThroughProfiler(), SimpleProfiler(), ActionCounter()):
        with profiler.profile("named") as name:
            assert name == "named"


def test_custom_subclass_counts_actions_and_first_occurrence(console):
    profiler = ActionCounter()
    for _ in range(3):
        with profiler.profile("step"):
            with profiler.profile("forward"):
                pass
    with profiler.profile("save"):
        pass
    assert profiler.counts == {"step": 3, "forward": 3, "save": 1}
    assert profiler.first_seen == {"step": 1, "forward": 2, "save": 7}
    profiler.describe()
    assert console.getvalue().splitlines()[2:] == ["step: 3", "forward: 3", "save: 1"]


def test_subclass_overriding_profile_keeps_its_own():
    calls = []

    class Custom(PassThroughProfiler):
        def profile(self, action_name):
            calls.append(action_name)
            return super().profile(action_name)

    with Custom().profile("x"):
        pass
    assert calls == ["x"]


def test_copy_and_pickle_drop_live_handles(tmp_path):
    profiler = ActionCounter(dirpath=tmp_path, filename="p")
    profiler._prepare_streams()  # an open file
    profiler._lightning_module = object()
    for clone in (copy.deepcopy(profiler), pickle.loads(pickle.dumps(profiler))):
        assert clone._output_file is None and clone._lightning_module is None
        assert clone.dirpath == tmp_path and clone.filename == "p"
        with clone.profile("after-copy"):
            pass
        assert clone.counts == {"after-copy": 1}
    profiler.teardown(None)


def _run_isolated(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[3] / "src"))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120)


def test_import_works_without_lightning_or_torch():
    result = _run_isolated(
        """
        import sys
        for name in ("lightning", "pytorch_lightning", "torch"):
            sys.modules[name] = None  # any import of them fails
        import stepscope.profilers as p
        profiler = p.create_profiler("simple")
        with profiler.profile("x"):
            pass
        print(type(profiler).__name__, sorted(k for k in sys.modules if k.startswith(("lightning", "torch")) and sys.modules[k]))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "SimpleProfiler []"


def test_passthrough_scope_yields_name_and_lets_exceptions_through():
    profiler = PassThroughProfiler()
    with profiler.profile("phase") as name:
        assert name == "phase" and type(name) is str
    with pytest.raises(KeyError, match="inside"):
        with profiler.profile("phase"):
            raise KeyError("inside")
    with profiler.profile("outer"), profiler.profile("outer"):  # re-entrant, unlike a lock
        pass
    assert profiler.summary() == ""


@pytest.mark.skipif(importlib.util.find_spec("lightning") is None, reason="lightning is not installed")
def test_profilers_become_lightning_profilers_once_lightning_is_loaded():
    result = _run_isolated(
        """
        import stepscope.profilers as ours                 # before Lightning
        from lightning.pytorch.profilers import Profiler as LightningProfiler
        made_after = ours.SimpleProfiler()                  # construction registers
        import pytorch_lightning.profilers as standalone
        ours.register_with_loaded_lightning()
        print(isinstance(made_after, LightningProfiler), isinstance(ours.AdvancedProfiler(), standalone.Profiler),
              issubclass(ours.PassThroughProfiler, LightningProfiler))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "True"]
