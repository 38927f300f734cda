"""The outputs of ``try``, ``tune-loader``, ``gpu-procs``, ``monitor``, ``runs`` and ``demo --list`` on
fixed inputs, byte for byte against the files in ``tests/data/golden/commands/`` (written by the
commands before they went through the pipeline and the render table; ``STEPSCOPE_WRITE_GOLDEN=1``
rewrites them).

Each command runs through its CLI handler where its inputs can be fixed (a fake GPU probe, a fixed
index listing, a fixed monitor frame); ``try`` and ``tune-loader`` render a fixed result (their
inputs are trials of a script).
"""

from __future__ import annotations

import io
import os
import re
import time
from pathlib import Path

import pytest

from stepscope.analysis.run.live import DeviceRates, GpuRow, MonitorFrame, ProcessRow
from stepscope.cli.main import main
from stepscope.data.tuner import LoaderSetting, Trial, TuneResult
from stepscope.record.run_index import IndexedRun
from stepscope.whatif import BASELINE, Candidate, CodeChange, TrialResult, WhatIf, best_change, compare

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden" / "commands"
WRITE = os.environ.get("STEPSCOPE_WRITE_GOLDEN") == "1"


@pytest.fixture(autouse=True)
def fixed_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def check(name: str, text: str, css: bool = False) -> None:
    """``text`` is the golden file ``name`` (with ``css``: but for the stylesheet, which the pages
    share and which changes on its own)."""
    path = GOLDEN / name
    if WRITE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    expected = path.read_text(encoding="utf-8")
    if css:
        text, expected = (re.sub(r"<style>.*?</style>", "<style/>", item, count=1, flags=re.S) for item in (text, expected))
    assert text == expected, name


# -- try -------------------------------------------------------------------------------------------
def _trial(name: str, step_ms: float | None, repeat: int = 0) -> TrialResult:
    if step_ms is None:
        return TrialResult(name, repeat, None, None, None, exit_code=1, error="exit 1")
    return TrialResult(name, repeat, step_ms / 1000.0, 8000.0 / step_ms, 1000.0 / step_ms, 30)


WORKERS = Candidate("dataloader.num_workers=2", {"dataloader.num_workers": 2}, "input_pipeline.loader_cpu_bound",
                    expected_gain=0.5)
PINNED = Candidate("dataloader.pin_memory=true", {"dataloader.pin_memory": True})


def whatifs() -> dict[str, WhatIf]:
    faster = compare([_trial(BASELINE, 20), _trial(BASELINE, 22), _trial(WORKERS.name, 10), _trial(WORKERS.name, 11),
                      _trial(PINNED.name, 21), _trial(PINNED.name, None, 1)], [WORKERS, PINNED])
    noise = compare([_trial(BASELINE, 20), _trial(BASELINE, 24), _trial(PINNED.name, 21), _trial(PINNED.name, 25)],
                    [PINNED])
    no_base = compare([_trial(BASELINE, None), _trial(BASELINE, None, 1), _trial(WORKERS.name, 10)], [WORKERS])
    failed = compare([_trial(BASELINE, None), _trial(WORKERS.name, None)], [WORKERS])
    return {
        "faster": WhatIf("train.py", 30, 2, faster, (CodeChange("Make each sample cheaper", "input_pipeline.x"),),
                         "runs/diagnosis", best_change(faster).name, ("6 runs in 12 s; run directories under out",),
                         failed="1 of 6 trials failed: exit 1",
                         failures=({"setting": PINNED.name, "round": 2, "error": "exit 1", "log": "logs/x.log"},)),
        "noise": WhatIf("train.py", 30, 2, noise, notes=("a note",)),
        "no_baseline": WhatIf("train.py", 30, 2, no_base, failed="2 of 3 trials failed: exit 1"),
        "all_failed": WhatIf("train.py", 30, 1, failed, failed="all 2 trials failed, nothing was measured: exit 1"),
        "nothing": WhatIf("train.py", 30, 3, (), notes=("no prescription can be applied",)),
    }


def try_output(result: WhatIf, fmt: str) -> str:
    from stepscope.pipeline.commands import whatif_view
    from stepscope.report.render import Output, render

    stream = io.StringIO()
    render(whatif_view(result), fmt, Output(stream=stream))
    return stream.getvalue()


@pytest.mark.parametrize("case", ["faster", "noise", "no_baseline", "all_failed", "nothing"])
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_try(case, fmt):
    check(f"try-{case}.{'txt' if fmt == 'text' else 'json'}", try_output(whatifs()[case], fmt))


# -- tune-loader -----------------------------------------------------------------------------------
def tune_result(oversubscribed: bool, exhausted: bool) -> TuneResult:
    base = LoaderSetting(0, None, False, False, 32)
    two = base.with_workers(2)
    four = base.with_workers(4)
    trials = (Trial("current", base, 1200.0, 0.01, 0.0, 40, 1.0), Trial("workers", two, 3100.5, 0.25, 0.3, 40, 1.1),
              Trial("workers", four, 0.0, 0.0, 0.0, 0, 0.2, error="RuntimeError: boom"),
              Trial("repeat", two, 3050.0, 0.24, 0.31, 40, 1.0))
    return TuneResult(base, two, trials, 1200.0, 3050.0, 0.016, 2 if oversubscribed else 8, 4, 60.0, 5.25,
                      exhausted, False, notes=("pin_memory not tried: no CUDA",))


def tune_output(result: TuneResult, target: str) -> str:
    from stepscope.pipeline.commands import tune_view
    from stepscope.report.render import Output, render

    stream = io.StringIO()
    render(tune_view(result, target), "text", Output(stream=stream))
    return stream.getvalue()


@pytest.mark.parametrize("oversubscribed", [False, True])
def test_tune_loader(oversubscribed):
    check(f"tune-loader-{int(oversubscribed)}.txt",
          tune_output(tune_result(oversubscribed, oversubscribed), "mytrain:make_loader"))


# -- gpu-procs -------------------------------------------------------------------------------------
class _Probe:
    devices = (0, 1)
    notes = ("NVML reports host pids",)

    def all_processes(self):
        return []

    def close(self):
        pass


def gpu_views():
    from stepscope.capture.gpu_procs import GpuProcessView

    me = os.getuid()
    return [
        GpuProcessView(101, 1, me + 1, "alice", "python train.py [true]", (0, 1), 3 << 30, 3600.0, "sleeping",
                       "parent gone; idle", 1.0, holds_gpu_device=True),
        GpuProcessView(102, 50, me, "me", "python eval.py", (1,), 1 << 20, 42.5, "running", None, 2.0,
                       holds_gpu_device=True),
        GpuProcessView(103, 50, me, "me", "[python]", (0,), None, 5.0, "zombie", "zombie: exited, not reaped", 3.0),
        GpuProcessView(104, 50, me, "me", "python old.py", (0,), 2 << 30, 7200.0, "sleeping", "job leader gone; idle",
                       4.0, holds_gpu_device=None),
        GpuProcessView(105, None, None, "?", "(not visible here: another pid namespace, or ended)", (1,), 1 << 30,
                       None, "?", None, None, visible=False),
    ]


@pytest.mark.parametrize("options", [(), ("--json",), ("--kill", "--yes")], ids=["table", "json", "kill"])
@pytest.mark.parametrize("listed", [True, False], ids=["listed", "none"])
def test_gpu_procs(capsys, monkeypatch, options, listed):
    import stepscope.capture.gpu as gpu_layer
    from stepscope.capture import gpu_procs

    monkeypatch.setattr(gpu_layer, "open_gpus", lambda **_: (_Probe(), None))
    monkeypatch.setattr(gpu_procs, "inspect_processes", lambda found: gpu_views() if listed else [])
    assert main(["gpu-procs", *options]) == 0
    out, err = capsys.readouterr()
    check(f"gpu-procs-{'-'.join(o.strip('-') for o in options) or 'table'}-{int(listed)}.txt", out + "--stderr--\n" + err)


@pytest.mark.parametrize("options", [(), ("--json",)], ids=["text", "json"])
def test_gpu_procs_without_a_gpu(capsys, monkeypatch, options):
    import stepscope.capture.gpu as gpu_layer

    monkeypatch.setattr(gpu_layer, "open_gpus", lambda **_: (None, "GPU metrics unavailable: no libnvidia-ml"))
    assert main(["gpu-procs", *options]) == 0
    out, err = capsys.readouterr()
    check(f"gpu-procs-nogpu-{int(bool(options))}.txt", out + "--stderr--\n" + err)


# -- monitor ---------------------------------------------------------------------------------------
def frame(roles: bool) -> MonitorFrame:
    processes = (
        ProcessRow(4242, 1, 0, "python", "python train.py --epochs 1", "main" if roles else "other", "R", 0.97,
                   1 << 30, 12, 2 << 30),
        ProcessRow(4243, 4242, -1, "python", "python [worker]", "dataloader_worker" if roles else "other", "S", 0.25,
                   200 << 20, None),
    )
    return MonitorFrame(
        ts_ns=1_700_000_000_000_000_000, seconds=1.0, hostname="node1",
        core_utils=tuple([0.1, 0.95, None, 0.5] * 5), cpu_util=0.45, iowait_share=0.02, load1=3.5,
        runnable_threads=7, mem_used_bytes=12 << 30, mem_available_bytes=20 << 30, mem_cached_bytes=4 << 30,
        mem_total_bytes=32 << 30, swap_used_bytes=1 << 30, swap_total_bytes=8 << 30,
        swap_in_bytes_per_s=4096.0, swap_out_bytes_per_s=None,
        disks=(DeviceRates("nvme0n1", 1.5e6, 2e5),), nics=(DeviceRates("eth0", 1e3, None),),
        gpus=(GpuRow(0, "NVIDIA H100 [bold]", 0.73, 0.5, 40 << 30, 80 << 30, 1980, 350.4, 61, 1 << 20, None),
              GpuRow(1, "NVIDIA H100", None, None, None, None, None, None, None, None, None)),
        processes=processes, notes=("GPU metrics unavailable for one device",))


class _Monitor:
    def __init__(self, pid, interval_s, *, top=15, gpu="auto"):
        self.pid = pid
        self.meta = {"hostname": "node1"}
        self.frames = [None, frame(pid is not None)]

    def step(self):
        return self.frames.pop(0)

    def close(self):
        pass


@pytest.mark.parametrize("options", [(), ("--json",), ("--pid", "1")], ids=["text", "json", "pid"])
def test_monitor_once(capsys, monkeypatch, options):
    from stepscope.cli import monitor_cmd

    monkeypatch.setattr(monitor_cmd, "LiveMonitor", _Monitor)
    assert main(["monitor", "--once", "--interval", "0.01", *options]) == 0
    check(f"monitor-{'-'.join(o.strip('-') for o in options) or 'text'}.txt", capsys.readouterr().out)


# -- runs ------------------------------------------------------------------------------------------
def indexed() -> list[IndexedRun]:
    return [
        IndexedRun("/nonexistent/runs/a", 1_700_000_000.0, "/home/u/train.py", "train.py", ("nightly",),
                   {"steps": 100, "step_time_s": 0.0123, "samples_per_s": 2600.4, "data_wait": 0.42,
                    "top_title": "The step waits for data [slow]", "top_severity": "high"}),
        IndexedRun("/nonexistent/runs/b", 1_700_086_400.0, "", "", (), {"steps": None, "step_time_s": 0.0101}),
        IndexedRun("/nonexistent/runs/c", 0.0, "x.py", "x.py", ("a", "b"), {"steps": 5, "step_time_s": 0.02,
                                                                          "data_wait": 0.1}),
    ]


@pytest.mark.parametrize("options", [(), ("--format", "json"), ("--plot", "step_time_s"), ("--plot", "data_wait"),
                                     ("--plot", "mfu")], ids=["list", "json", "plot", "plot-share", "plot-none"])
@pytest.mark.parametrize("listed", [True, False], ids=["listed", "none"])
def test_runs(capsys, monkeypatch, options, listed):
    from stepscope.record import run_index

    monkeypatch.setattr(run_index, "list_runs", lambda *_, **__: indexed() if listed else [])
    assert main(["runs", "--index", "/nonexistent/index/runs.sqlite", *options]) == 0
    name = "-".join(o.strip("-") for o in options) or "list"
    check(f"runs-{name}-{int(listed)}.txt", capsys.readouterr().out)


def test_runs_plot_html(capsys, monkeypatch, tmp_path):
    from stepscope.record import run_index

    monkeypatch.setattr(run_index, "list_runs", lambda *_, **__: indexed())
    target = tmp_path / "plot.html"
    assert main(["runs", "--index", "/nonexistent/index/runs.sqlite", "--plot", "step_time_s", "--html",
                 str(target)]) == 0
    check("runs-plot.html", target.read_text(encoding="utf-8"), css=True)


# -- demo ------------------------------------------------------------------------------------------
def test_demo_list(capsys):
    assert main(["demo", "--list"]) == 0
    check("demo-list.txt", capsys.readouterr().out)


def test_the_goldens_are_not_empty():
    files = sorted(GOLDEN.iterdir())
    assert len(files) >= 30 and all(path.stat().st_size > 0 for path in files)
