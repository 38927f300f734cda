"""The blind evaluation's generator and scoring (benchmarks/blind_eval.py, benchmarks/blind/): a seed
gives the same scripts; each factor's switch removes that factor and nothing else (the script with
its switches folded to off is, statement for statement, the script generated without it, and with
every switch off the plain loop); the mapping table reaches every factor; the launcher's neighbour
never outlives it. No torch: the scripts are compared as syntax trees."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from blind.factors import FACTORS  # noqa: E402
from blind.generate import Workload, draw_workload, render_launcher, render_script, write  # noqa: E402
from blind.score import CODE, MAPPING, Verdict, read_verdict, score  # noqa: E402
from blind.truth import MIN_GAIN, Timing, Truth  # noqa: E402

ALL = tuple(FACTORS)
#: enough workloads that every factor, and every pair of hooks, is planted several times
WORKLOADS = [draw_workload(seed, index, ALL) for seed in (1, 2, 3) for index in range(40)]


def test_workloads_cover_every_factor():
    planted = {name for workload in WORKLOADS for name in workload.factor_names}
    assert planted == set(FACTORS)
    assert all(1 <= len(workload.planted) <= 3 for workload in WORKLOADS)


def test_a_seed_gives_the_same_scripts():
    for index in range(10):
        first, second = draw_workload(42, index, ALL), draw_workload(42, index, ALL)
        assert first == second
        assert render_script(first) == render_script(second) and render_launcher(first) == render_launcher(second)
    assert [render_script(draw_workload(42, index, ALL)) for index in range(10)] \
        != [render_script(draw_workload(43, index, ALL)) for index in range(10)]


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda workload: f"{workload.seed}-{workload.name}")
def test_each_switch_removes_its_factor_and_nothing_else(workload: Workload):
    for name in workload.factor_names:
        for render in (render_script, render_launcher):
            assert _folded(render(workload), {name}) == _folded(render(workload.without(name)), set()), name
        both = render_script(workload) + render_launcher(workload)
        assert _folded(both, set()) != _folded(render_script(workload.without(name)) +
                                               render_launcher(workload.without(name)), set())  # it is there
    plain = Workload(workload.seed, workload.index, workload.base, ())
    for render in (render_script, render_launcher):
        assert _folded(render(workload), set(workload.factor_names)) == _folded(render(plain), set())
        assert 'if on("' not in render(plain)  # the plain loop has no switch


def test_every_factor_has_code_under_its_switch():
    for workload in WORKLOADS:
        script, launcher = render_script(workload), render_launcher(workload)
        for name in workload.factor_names:
            assert f'if on("{name}"):' in script + launcher, name


def test_the_mapping_reaches_every_factor():
    explicit = {name for entry in MAPPING if entry.factors != CODE for name in entry.factors}
    by_code = {name for name, factor in FACTORS.items() if factor.code_names} if any(
        entry.factors == CODE for entry in MAPPING) else set()
    assert set(FACTORS) <= explicit | by_code
    assert set(FACTORS) - explicit <= {"gil_thread"}  # a GIL-holding thread is named by its code only
    assert all(name in FACTORS for entry in MAPPING if entry.factors != CODE for name in entry.factors)


def _finding(family: str, action: str = "", rule_id: str | None = None, title: str = "", confidence=0.9) -> dict:
    return {"family": family, "rule_id": rule_id or f"{family}.rule", "title": title, "confidence": confidence,
            "impact": 0.5, "summary": "", "prescriptions": [{"action": action, "why": ""}] if action else []}


@pytest.mark.parametrize(("finding", "removes"), [
    (_finding("input_pipeline", "DataLoader(persistent_workers=True)"), ("worker_restarts",)),
    (_finding("input_pipeline", "DataLoader(num_workers=2)"), ("costly_samples", "slow_reads")),
    (_finding("input_pipeline", "Make each sample cheaper to produce: precompute"), ("costly_samples",)),
    (_finding("storage_io", "Stage the data locally"), ("slow_reads",)),
    (_finding("launch_overhead", "model = torch.compile(model)"), ("tiny_ops",)),
    (_finding("periodic_stall", "Save checkpoints asynchronously"), ("periodic_saves",)),
    (_finding("periodic_stall", "DataLoader(persistent_workers=True)"), ("worker_restarts",)),
    (_finding("memory_pressure", "Store scalars"), ("memory_growth",)),
    (_finding("foreign_load", "Move the other processes"), ("neighbour",)),
    (_finding("garbage_collection", "gc.freeze()"), ("gc_pressure",)),
    (_finding("straggler", "Look at rank 1"), ("slow_rank",)),
    (_finding("outside_model", "Look at train.py:140", title="Outside the model: save_checkpoint() takes 40%"),
     ("periodic_saves",)),
    (_finding("gil_wait", "Move the work", title="forward: 95% waiting for the GIL held by thread `telemetry` "
              "in telemetry_loop()"), ("gil_thread",)),
    (_finding("compute", "Increase the batch size (64 → 512)"), ()),
])
def test_a_finding_maps_to_the_factors_its_prescription_removes(finding: dict, removes: tuple[str, ...]):
    assert read_verdict({"findings": [finding]}).removes == removes


@pytest.mark.parametrize("report", [
    {"findings": []},
    {"findings": [_finding("healthy", "A larger batch")]},
    {"findings": [_finding("thread_account", "", rule_id="thread_account.unexplained")]},
])
def test_healthy_unexplained_or_nothing_is_an_abstention(report: dict):
    assert read_verdict(report).removes is None


def test_an_unknown_finding_naming_no_code_is_wrong_not_skipped():
    verdict = read_verdict({"findings": [_finding("new_family", "Do something")]})
    assert verdict.removes == () and verdict.mapped_by == "unmapped"


def _truth(gains: dict[str, float], sem_ms: float = 0.1) -> Truth:
    full = Timing(0.1, sem_ms / 1e3, 50, 5.0)
    without = {name: Timing(0.1 * (1 - gain), sem_ms / 1e3, 50, 5.0) for name, gain in gains.items()}
    best = max(gains, key=gains.__getitem__)
    margins = {name: 2 * (2 * (sem_ms / 1e3) ** 2) ** 0.5 / 0.1 + 0.03 for name in gains if name != best}
    return Truth(full, without, gains, margins)


def _verdict(removes: tuple[str, ...] | None, confidence: float = 0.9) -> Verdict:
    return Verdict("f", "f.r", "", confidence, 0.5, "", removes, "test")


def test_scoring_counts_either_of_two_factors_within_noise():
    truth = _truth({"costly_samples": 0.50, "neighbour": 0.48, "gc_pressure": 0.2})
    assert truth.best == "costly_samples" and truth.tied == ("costly_samples", "neighbour")
    assert score(truth, _verdict(("neighbour",))).outcome == "right"
    wrong = score(truth, _verdict(("gc_pressure",), confidence=0.85))
    assert wrong.outcome == "wrong" and wrong.confidently_wrong
    assert score(truth, _verdict(None)).outcome == "abstain"
    assert score(_truth({"memory_growth": MIN_GAIN / 2}), _verdict(("memory_growth",))).outcome == "no bottleneck"


def test_the_neighbour_dies_with_its_launcher(tmp_path: Path):
    workload = next(item for item in WORKLOADS if "neighbour" in item.factor_names)
    write(workload, tmp_path)
    done = subprocess.run([sys.executable, "launch.py", sys.executable, "-c", "import time; time.sleep(0.3)"],
                          cwd=tmp_path, timeout=30)
    assert done.returncode == 0
    launcher = subprocess.Popen([sys.executable, "launch.py", sys.executable, "-c", "import time; time.sleep(60)"],
                                cwd=tmp_path)
    try:
        assert _wait_for(lambda: _neighbours_of(launcher.pid)), "no neighbour started"
    finally:
        launcher.kill()  # SIGKILL: the launcher's own clean-up never runs
        launcher.wait()
    assert _wait_for(lambda: not _neighbours_of(launcher.pid)), "the neighbour outlived its launcher"


def _neighbours_of(pid: int) -> list[int]:
    """Processes running the neighbour's busy loop for the launcher ``pid`` (its argv names it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"-c" in argv and str(pid).encode() in argv and any(b"getppid" in item for item in argv):
                state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
    return found


def _wait_for(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _folded(source: str, off: set[str]) -> str:
    """The script with ``on(name)`` for every name in ``off`` folded to False: those ``if`` blocks
    dropped, then module-level definitions nothing uses any more; the docstring left out."""
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if not _is_docstring(node)]
    tree = _SwitchFolder(off).visit(tree)
    while True:
        used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
        kept = [node for node in tree.body if not _defines_only_unused(node, used)]
        if len(kept) == len(tree.body):
            return ast.dump(tree)
        tree.body = kept


class _SwitchFolder(ast.NodeTransformer):
    def __init__(self, off: set[str]):
        self.off = off

    def visit_If(self, node: ast.If):  # noqa: N802 (ast's visitor naming)
        test = node.test
        if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "on":
            assert not node.orelse
            if test.args[0].value in self.off:  # type: ignore[attr-defined]
                return None
        return self.generic_visit(node)


def _defines_only_unused(node: ast.stmt, used: set[str]) -> bool:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name not in used
    if isinstance(node, ast.Assign):
        return all(isinstance(target, ast.Name) and target.id not in used for target in node.targets)
    return False


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def test_dry_run_writes_the_scripts(tmp_path: Path):
    command = [sys.executable, str(ROOT / "benchmarks" / "blind_eval.py"), "--seed", "9", "--count", "3",
               "--dry-run", "--keep", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert "seed 9" in done.stdout
    assert sorted(path.name for path in tmp_path.iterdir()) == ["w000", "w001", "w002"]
    for directory in tmp_path.iterdir():
        assert {path.name for path in directory.iterdir()} == {"train.py", "launch.py", "workload.json"}


@pytest.mark.parametrize("content", [None, "not json", '{"kind": "something else"}'])
def test_the_wait_split_check_refuses_a_file_that_is_no_evaluation_in_one_line(tmp_path, content):
    path = tmp_path / "blind.json"
    if content is not None:
        path.write_text(content)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "wait_split_check.py"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"wait_split_check: {path} is not a blind evaluation")


def test_the_others_meter_subtracts_this_process_and_what_it_reaped(monkeypatch):
    from blind import quiet

    snapshots = iter([quiet._Snapshot(10.0, 100.0, 5.0), quiet._Snapshot(14.0, 106.0, 9.0)])
    monkeypatch.setattr(quiet, "_snapshot", lambda: next(snapshots))
    meter = quiet.OthersMeter()
    assert meter.cores() == pytest.approx((6.0 - 4.0) / 4.0)  # 6 s busy, 4 s of it ours, over 4 s


BUSY = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"
#: Starts a busy grandchild and leaves at once: the grandchild is no descendant this process reaps.
ORPHAN = ("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {code!r}], start_new_session=True)\n")


@pytest.mark.serial  # reads the machine's CPU: other tests' load would be "others" too
def test_a_reaped_busy_child_is_ours_and_an_orphan_is_another_process():
    from blind.quiet import OthersMeter

    meter = OthersMeter()
    subprocess.run([sys.executable, "-c", BUSY.format(seconds=1.0)], check=True, timeout=30)
    ours = meter.cores()
    meter = OthersMeter()
    subprocess.run([sys.executable, "-c", ORPHAN.format(code=BUSY.format(seconds=1.5))], check=True, timeout=30)
    time.sleep(1.6)
    others = meter.cores()
    assert ours < 0.3 and others > 0.5, (ours, others)


def test_a_workload_beside_other_load_is_marked_and_named_in_the_summary():
    import blind_eval

    row = {"name": "w003", "seed": 7, "outcome": "right", "factors": [], "elapsed_s": 9.0, "others_cores": 0.93,
           "crowded": True, "truth": {"full": {"mean_ms": 1.0, "sem_ms": 0.1}, "within_noise": [], "bottleneck": None},
           "verdict": {"rule_id": None, "primary_prescription": "", "confidence": None, "removes": []}}
    assert blind_eval.render_row(row).endswith("BESIDE OTHER LOAD (0.93 cores)")
    summary = {"workloads": 1, "scored": 1, "no_bottleneck": 0, "errors": 0, "right": 1, "wrong": 0, "abstain": 0,
               "accuracy": 1.0, "accuracy_when_answered": 1.0, "abstention_rate": 0.0, "confidently_wrong": 0,
               "confidently_wrong_rate": 0.0, "top_within_noise": 0, "calibration": [], "beside_other_load": ["w003"]}
    assert blind_eval.render_summary(7, summary).splitlines()[-1] == (
        "  NOT BLIND: 1 workload(s) ran beside other processes using >= 0.2 cores (w003); draw them again on a "
        "quiet machine (--seed 7)")
    assert "NOT BLIND" not in blind_eval.render_summary(7, {**summary, "beside_other_load": []})
