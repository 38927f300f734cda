"""Cost of sampling Python stacks on the benchmark step, as ratios against bare blocks in one run.

One process runs the capture benchmark's step (a 256→512→512→1 MLP, batch 32, forward + backward
+ SGD, one intra-op thread; ~3 ms) in short blocks, interleaving a bare block with a block under
each mechanism (order rotated every round), and reports per mechanism the median of the per-round
ratios sampled/bare and the sampler's own CPU per sample:

- ``signal@HZ``: stepscope's sampler, the shipped one (the main thread samples itself from a
  ``SIGPROF`` handler; see ``stepscope.capture.stacks``);
- ``py-spy@HZ``: py-spy attached from outside (``py-spy record --pid``; needs ptrace rights),
  ``--nonblocking`` (reads memory while the target runs) and default (pauses the target per sample).

    python benchmarks/bench_stacks.py [--rounds 24] [--block 150] [--rates 100,50] [--no-py-spy]

A second part runs the same loop with stepscope's capture on and ``--stacks-hz`` off vs on in
alternating blocks of one CaptureSession each (everything the option wires: sampler + GC callbacks).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from stepscope.capture.recorder import StepRecorder  # noqa: E402
from stepscope.capture.stacks import StackSampler  # noqa: E402


def make_loop(block: int):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(block * 32, 256), torch.randn(block * 32, 1))
    loader = DataLoader(data, batch_size=32)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def epoch() -> float:
        wall = time.perf_counter()
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return (time.perf_counter() - wall) / block

    return epoch


class ThreadMode:
    def __init__(self, rate: float):
        self.rate = rate
        self.name = f"signal@{rate:g}"
        self.sampler: StackSampler | None = None
        self.cost: list[float] = []

    def __enter__(self):
        self.sampler = StackSampler(StepRecorder(), self.rate).start()
        return self

    def __exit__(self, *exc):
        self.sampler.stop()
        samples = len(self.sampler.table)
        if samples:  # the thread's whole CPU time, wake-ups included, per sample
            self.cost.append(self.sampler._thread.cpu_ns / samples / 1e3)


class PySpyMode:
    def __init__(self, rate: float, blocking: bool, workdir: Path):
        self.rate = rate
        self.blocking = blocking
        self.name = f"py-spy@{rate:g}{'' if blocking else ' --nonblocking'}"
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.cost: list[float] = []

    def __enter__(self):
        out = self.workdir / "pyspy.txt"
        cmd = [_py_spy(), "record", "--pid", str(os.getpid()), "--rate", str(int(self.rate)),
               "--format", "raw", "-o", str(out)]
        if not self.blocking:
            cmd.append("--nonblocking")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # attach and start sampling before the block
        if self.proc.poll() is not None:
            raise RuntimeError(f"py-spy failed: {self.proc.stderr.read().decode()[-400:]}")
        self._cpu0 = _child_cpu(self.proc.pid)
        self._wall0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        cpu = _child_cpu(self.proc.pid) - self._cpu0
        wall = time.perf_counter() - self._wall0
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(timeout=30)
        self.cost.append(cpu / max(1.0, wall * self.rate) * 1e6)


def _py_spy() -> str:
    """py-spy next to this interpreter (a virtualenv's bin), else on PATH."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else (shutil.which("py-spy") or str(local))


def _child_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sampler_ratios(args: argparse.Namespace, workdir: Path) -> None:
    epoch = make_loop(args.block)
    epoch()
    modes: list = [ThreadMode(rate) for rate in args.rates]
    if args.py_spy:
        modes += [PySpyMode(args.rates[0], blocking, workdir) for blocking in (False, True)]
    ratios: dict[str, list[float]] = {mode.name: [] for mode in modes}
    sampled_steps: dict[str, list[float]] = {mode.name: [] for mode in modes}
    bare_steps: list[float] = []
    bare_by_mode: dict[str, list[float]] = {mode.name: [] for mode in modes}
    for round_index in range(args.rounds):
        order = modes[round_index % len(modes):] + modes[:round_index % len(modes)]
        for mode in order:
            first_bare = round_index % 2 == 0  # ABBA: bare first in even rounds, sampled first in odd
            bare = epoch() if first_bare else None
            with mode:
                sampled = epoch()
            if bare is None:
                bare = epoch()
            bare_steps.append(bare)
            bare_by_mode[mode.name].append(bare)
            ratios[mode.name].append(sampled / bare)
            sampled_steps[mode.name].append(sampled)
    print(f"benchmark step: median {statistics.median(bare_steps) * 1e3:.2f} ms bare "
          f"({args.rounds} rounds × blocks of {args.block} steps, each sampled block next to a bare one, ABBA)")
    for mode in modes:
        values = sorted(ratios[mode.name])
        quart = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
        cost = f"{statistics.median(mode.cost):.1f} µs CPU per sample" if mode.cost else "-"
        print(f"{mode.name:<26} ratio of fastest blocks {min(sampled_steps[mode.name]) / min(bare_by_mode[mode.name]):.4f}; "
              f"median ratio {statistics.median(values):.4f} (quartiles {quart[0]:.4f}–{quart[2]:.4f}); "
              f"sampler {cost}", flush=True)


def gil_held_cost(args: argparse.Namespace) -> None:
    """CPU the sampler spends per sample: the stack walk, and the whole signal handler (both taken
    from the training thread, which runs the handler)."""
    import types

    from stepscope.capture import stacks

    epoch = make_loop(args.block)
    epoch()
    spent = [0, 0]
    original_add, original_sys = stacks.StackTable.add, stacks.sys
    cpu = time.thread_time_ns

    def current_frames():
        started = cpu()
        frames = sys._current_frames()
        spent[0] += cpu() - started
        return frames

    def add(table, *values):
        started = cpu()
        original_add(table, *values)
        spent[0] += cpu() - started
        spent[1] += 1

    class TimedSys(types.SimpleNamespace):  # sys, with a timed _current_frames
        def __getattr__(self, name):
            return getattr(sys, name)

    stacks.sys, stacks.StackTable.add = TimedSys(_current_frames=current_frames), add
    try:
        for rate in args.rates:
            spent[:] = [0, 0]
            sampler = StackSampler(StepRecorder(), rate).start()
            for _ in range(3):
                epoch()
            sampler.stop()
            held = spent[0] / max(1, spent[1]) / 1e3
            total = sampler._thread.cpu_ns / max(1, spent[1]) / 1e3
            print(f"signal@{rate:g}: {held:.1f} µs CPU per sample in the walk ({held * rate / 1e4:.2f}% of the "
                  f"training thread); {total:.1f} µs per sample in the whole handler "
                  f"({total * rate / 1e4:.2f}% of the training thread)", flush=True)
    finally:
        stacks.sys, stacks.StackTable.add = original_sys, original_add


def _pure_python(count: int) -> int:
    return sum(value * value for value in range(count))  # the pure-Python line


def gil_bias(seconds: float = 3.0, intervals: tuple[float, ...] = (0.005, 0.001, 0.0005)) -> None:
    """How far the thread sampler's shares are from the truth on a loop that alternates a
    pure-Python call (~2 ms) with GIL-releasing torch matmuls, at several GIL switch intervals
    (5 ms is Python's default; stepscope sets 0.5 ms while sampling)."""
    import collections

    matrix = torch.randn(200, 200)
    previous = sys.getswitchinterval()
    for interval in intervals:
        sys.setswitchinterval(interval)
        sampler = StackSampler(StepRecorder(), 100, switch_interval_s=None).start()
        pure = other = 0.0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            _pure_python(20_000)
            middle = time.perf_counter()
            (matrix @ matrix) @ matrix
            pure, other = pure + middle - started, other + time.perf_counter() - middle
        sampler.stop()
        sys.setswitchinterval(previous)
        table = sampler.table
        counts = collections.Counter(table.frames[table.stacks[stack][-1]][2] for stack in table.stack)
        sampled = counts["_pure_python.<locals>.<genexpr>"] + counts["_pure_python"]
        print(f"GIL bias at switch interval {interval * 1e3:g} ms: pure Python {pure / (pure + other):.0%} of the "
              f"time, {sampled / max(1, sum(counts.values())):.0%} of the samples", flush=True)


def session_ratios(args: argparse.Namespace, workdir: Path) -> None:
    from stepscope.capture.session import CaptureSession

    epoch = make_loop(args.block)
    ratios = []
    fastest: dict[float, float] = {}
    for round_index in range(args.rounds):
        times = {}
        for hz in ((0, args.rates[0]) if round_index % 2 == 0 else (args.rates[0], 0)):
            session = CaptureSession(workdir / f"s{round_index}-{hz:g}", sample_interval_s=None, count_flops=False,
                                     emit_warnings=False, stacks_hz=hz).start()
            epoch()  # discovery steps
            times[hz] = epoch()
            fastest[hz] = min(fastest.get(hz, float("inf")), times[hz])
            session.stop()
        ratios.append(times[args.rates[0]] / times[0])
    print(f"capture with --stacks-hz {args.rates[0]:g} vs --stacks-hz 0 (whole capture on in both): "
          f"ratio of fastest blocks {fastest[args.rates[0]] / fastest[0]:.4f}; "
          f"median ratio {statistics.median(ratios):.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--block", type=int, default=150, help="steps per block")
    parser.add_argument("--rates", default="100,50", help="comma-separated sampling rates (Hz); py-spy "
                        "is measured at the first")
    parser.add_argument("--no-py-spy", dest="py_spy", action="store_false")
    parser.add_argument("--no-session", dest="session", action="store_false")
    args = parser.parse_args()
    args.rates = [float(item) for item in args.rates.split(",")]
    if args.py_spy and not Path(_py_spy()).exists():
        print("py-spy not installed (pip install py-spy): measuring the thread sampler only")
        args.py_spy = False
    with tempfile.TemporaryDirectory() as tmp:
        gil_held_cost(args)
        gil_bias()
        sampler_ratios(args, Path(tmp))
        if args.session:
            session_ratios(args, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
