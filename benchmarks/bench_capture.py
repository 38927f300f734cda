"""Overhead of always-on capture on a training step, each way against a baseline in the same run.

1. *Hook cost per step* (the figure to quote): a minimal step (one-sample DataLoader fetch, a 1×1
   Linear forward and backward, an optimizer step) in blocks of steps, bare and captured (stack
   sampling and GC timing on, as ``stepscope run``) alternately in one process; each round gives
   the difference of the two blocks' mean step, adjacent in time, so the machine's drift cancels;
   the median over rounds is printed with its interquartile range.
2. *Instructions per step* (``--instructions``; needs valgrind): the same loop under callgrind,
   instructions of one captured epoch minus one bare epoch, divided by the steps. Deterministic:
   the number to compare versions with on a noisy machine (a µs is ~2,000 instructions of this
   loop on the 2-core development VM).
3. *In-process blocks*: a ~3–5 ms/step MLP loop, alternating blocks bare and captured.
4. *End to end*: the same loop as a script, ``python loop.py`` vs ``stepscope run loop.py``
   alternately in subprocesses (each run times its own steady-state loop, so start-up is not
   counted); median ratio. With ``--wait-sampler`` both sides run under ``stepscope run``, the
   baseline with ``STEPSCOPE_WAIT_SAMPLER=0``: what the wait sampler's thread costs the step.

    python benchmarks/bench_capture.py [--rounds 7] [--steps 400]
    python benchmarks/bench_capture.py --hook-cost           # the first line alone
    python benchmarks/bench_capture.py --instructions        # callgrind, ~2 minutes
    python benchmarks/bench_capture.py --compiled aot_eager [--rounds 7]   # end to end, compiled model
    python benchmarks/bench_capture.py --wait-sampler [--rounds 9]         # end to end, sampler on/off
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

LOOP = textwrap.dedent("""
    import sys, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(0)
    steps = int(sys.argv[1])
    data = TensorDataset(torch.randn(steps * 32, 256), torch.randn(steps * 32, 1))
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 1))
    if len(sys.argv) > 2:  # --compiled: the same loop on torch.compile(model, backend=...)
        model = torch.compile(model, backend=sys.argv[2])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    warmup = 20
    for index, (x, y) in enumerate(DataLoader(data, batch_size=32)):
        if index == warmup:
            started = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    print((time.perf_counter() - started) / (steps - warmup))
    print(time.process_time())
""")

MINIMAL = textwrap.dedent("""
    import os, statistics, sys, tempfile, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from stepscope.capture.session import CaptureSession

    torch.set_num_threads(1)
    steps, rounds, stacks_hz = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    skip = 10  # the first steps of a captured block discover the root modules
    loader = DataLoader(TensorDataset(torch.zeros(steps, 1)), batch_size=None)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.zeros(1, 1)

    def block():
        for index, _ in enumerate(loader):
            if index == skip:
                started, cpu = time.perf_counter(), time.process_time()
            model(x).sum().backward()
            opt.step()
        return ((time.perf_counter() - started) / (steps - skip), (time.process_time() - cpu) / (steps - skip))

    def captured(tmp, index):
        session = CaptureSession(tmp + f"/r{index}", sample_interval_s=None, count_flops=False,
                                 emit_warnings=False, stacks_hz=stacks_hz).start()
        try:
            return block()
        finally:
            session.stop()

    block()
    diffs, cpu_diffs, bare_times = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(rounds):
            if index % 2:
                with_capture, bare = captured(tmp, index), block()
            else:
                bare, with_capture = block(), captured(tmp, index)
            diffs.append(with_capture[0] - bare[0])
            cpu_diffs.append(with_capture[1] - bare[1])
            bare_times.append(bare[0])
    q, c = statistics.quantiles(diffs, n=4), statistics.quantiles(cpu_diffs, n=4)
    print(statistics.median(bare_times), statistics.median(diffs), q[0], q[2], statistics.median(cpu_diffs), c[0], c[2])
""")

#: The callgrind variant: one bare epoch and one captured epoch between two dump points each.
INSTRUCTIONS = textwrap.dedent("""
    import gc, os, subprocess, sys, tempfile
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from stepscope.capture.session import CaptureSession

    torch.set_num_threads(1)
    steps, stacks_hz = int(sys.argv[1]), float(sys.argv[2])
    data = TensorDataset(torch.zeros(steps, 1))
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.zeros(1, 1)

    def epoch():
        for _ in DataLoader(data, batch_size=None):
            model(x).sum().backward()
            opt.step()

    def settled():
        # every object so far out of the collector's way: a full collection landing in one measured
        # epoch and not the other moved the difference by up to 9k instructions per step
        gc.collect()
        gc.freeze()

    epoch(); epoch()
    subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
    with tempfile.TemporaryDirectory() as tmp:
        settled()
        os.getppid()  # dump 1: set-up
        epoch()
        os.getppid()  # dump 2: the bare epoch
        session = CaptureSession(tmp + "/r", sample_interval_s=None, count_flops=False, emit_warnings=False,
                                 stacks_hz=stacks_hz).start()
        epoch()
        settled()
        os.getppid()  # dump 3: start-up and the discovery epoch
        epoch()
        os.getppid()  # dump 4: a captured epoch
        session.stop()
""")


def instructions_per_step(steps: int, stacks_hz: float, workdir: Path) -> tuple[float, float]:
    """(bare, captured) instructions per step of the minimal loop, counted by callgrind."""
    script = workdir / "instructions.py"
    script.write_text(INSTRUCTIONS)
    out = workdir / "callgrind.out"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-before=getppid",
                    "--separate-threads=yes", f"--callgrind-out-file={out}", sys.executable, str(script), str(steps),
                    str(stacks_hz)],
                   capture_output=True, text=True, env=env, check=True, cwd=workdir)

    def total(part: int) -> int:
        # the training thread only: capture's background threads (record checkpoints at growing
        # intervals, the stack sampler) run on the clock, and under callgrind's ~50x slow-down a
        # varying number of their rounds landed in the measured epoch (12-15k instructions per step)
        for line in Path(f"{out}.{part}-01").read_text().splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1])
        raise RuntimeError(f"no summary in {out}.{part}-01")

    return total(2) / steps, total(4) / steps


IN_PROCESS = textwrap.dedent("""
    import statistics, sys, tempfile, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from stepscope.capture.session import CaptureSession

    torch.set_num_threads(1)
    torch.manual_seed(0)
    block, rounds = int(sys.argv[1]), int(sys.argv[2])
    data = TensorDataset(torch.randn(block * 32, 256), torch.randn(block * 32, 1))
    loader = DataLoader(data, batch_size=32)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def epoch():
        wall, cpu = time.perf_counter(), time.process_time()
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        return (time.perf_counter() - wall) / block, (time.process_time() - cpu) / block

    epoch()
    wall_ratios, cpu_ratios = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(rounds):
            bare = epoch()
            session = CaptureSession(tmp + f"/r{index}", sample_interval_s=None, count_flops=False,
                                     emit_warnings=False).start()
            epoch()  # discovery steps, then steady capture
            captured = epoch()
            session.stop()
            wall_ratios.append(captured[0] / bare[0])
            cpu_ratios.append(captured[1] / bare[1])
    print(statistics.median(wall_ratios), statistics.median(cpu_ratios), bare[0])
""")


def run_once(script: Path, steps: int, wrapped: bool, workdir: Path, extra: tuple[str, ...] = (),
             env_extra: dict[str, str] | None = None) -> float:
    prefix = [sys.executable, "-m", "stepscope", "run", "--no-summary", "--no-monitor", "--force",
              "-o", str(workdir / "run")] if wrapped else [sys.executable]
    env = dict(os.environ, OMP_NUM_THREADS="1", **(env_extra or {}))
    result = subprocess.run([*prefix, str(script), str(steps), *extra], capture_output=True, text=True, env=env,
                            check=True)
    return float(result.stdout.strip().splitlines()[-2])


def minimal_step(steps: int, rounds: int, workdir: Path, stacks_hz: float) -> tuple[float, ...]:
    """(bare step, median added per step in wall time, its first and third quartiles, the same three
    in CPU time of the process: every thread, capture's own included), in seconds."""
    script = workdir / "minimal.py"
    script.write_text(MINIMAL)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(script), str(steps), str(rounds), str(stacks_hz)],
                            capture_output=True, text=True, env=env, check=True)
    return tuple(float(value) for value in result.stdout.split())


def in_process(block: int, rounds: int, workdir: Path) -> tuple[float, float, float]:
    script = workdir / "in_process.py"
    script.write_text(IN_PROCESS)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(script), str(block), str(rounds)], capture_output=True,
                            text=True, env=env, check=True)
    wall, cpu, step = (float(value) for value in result.stdout.split())
    return wall, cpu, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--block", type=int, default=100, help="steps per in-process block")
    parser.add_argument("--stacks-hz", type=float, default=None,
                        help="stack sampling rate of the captured blocks (default: stepscope run's)")
    parser.add_argument("--instructions", action="store_true",
                        help="only the instructions per step, counted under callgrind (needs valgrind)")
    parser.add_argument("--hook-cost", action="store_true", help="only the first measurement (the hook cost per step)")
    parser.add_argument("--compiled", metavar="BACKEND", help="only the end-to-end comparison, on the loop's model "
                        "compiled with torch.compile(backend=BACKEND), e.g. aot_eager or inductor")
    parser.add_argument("--wait-sampler", action="store_true", help="only the end-to-end comparison of stepscope "
                        "run with its wait sampler against STEPSCOPE_WAIT_SAMPLER=0")
    args = parser.parse_args()
    if args.stacks_hz is None:
        from stepscope.capture.stacks import DEFAULT_RATE_HZ

        args.stacks_hz = DEFAULT_RATE_HZ
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.compiled or args.wait_sampler:
            end_to_end(args, workdir, (args.compiled,) if args.compiled else ())
            return
        if args.instructions:
            bare_ir, captured_ir = instructions_per_step(1000, args.stacks_hz, workdir)
            print(f"instructions per step (callgrind): bare {bare_ir:,.0f}, captured {captured_ir:,.0f} "
                  f"=> +{captured_ir - bare_ir:,.0f} (stacks {args.stacks_hz:g} Hz)", flush=True)
            return
        bare, added, low, high, cpu, cpu_low, cpu_high = minimal_step(args.block * 4, args.rounds * 6, workdir,
                                                                      args.stacks_hz)
        print(f"hook cost: minimal step {bare * 1e6:.1f} µs bare, +{added * 1e6:.1f} µs/step captured "
              f"(interquartile {low * 1e6:.1f}..{high * 1e6:.1f}; CPU time of the process +{cpu * 1e6:.1f} µs, "
              f"interquartile {cpu_low * 1e6:.1f}..{cpu_high * 1e6:.1f}; {args.rounds * 6} paired blocks of "
              f"{args.block * 4} steps, stacks {args.stacks_hz:g} Hz); on a 5 ms step: ratio "
              f"{1 + added / 5e-3:.4f}", flush=True)
        if args.hook_cost:
            return
        wall, cpu, step = in_process(args.block, args.rounds * 3, workdir)
        print(f"in-process, alternating blocks of {args.block} steps ({step * 1e3:.2f} ms/step): "
              f"median ratio wall {wall:.4f}, CPU time {cpu:.4f}", flush=True)
        end_to_end(args, workdir, ())


def end_to_end(args: argparse.Namespace, workdir: Path, extra: tuple[str, ...]) -> None:
    script = workdir / "loop.py"
    script.write_text(LOOP)
    sampler = args.wait_sampler
    names = ("stepscope, wait sampler off", "stepscope") if sampler else ("bare", "stepscope")

    def once(candidate: bool) -> float:
        if sampler:
            return run_once(script, args.steps, True, workdir, extra,
                            None if candidate else {"STEPSCOPE_WAIT_SAMPLER": "0"})
        return run_once(script, args.steps, candidate, workdir, extra)

    ratios, bare_times, wrapped_times = [], [], []
    for round_index in range(args.rounds):
        order = (False, True) if round_index % 2 == 0 else (True, False)
        times = {mode: once(mode) for mode in order}
        bare_times.append(times[False])
        wrapped_times.append(times[True])
        ratios.append(times[True] / times[False])
        print(f"round {round_index}: {names[0]} {times[False] * 1e3:.3f} ms/step, "
              f"{names[1]} {times[True] * 1e3:.3f} ms/step, ratio {ratios[-1]:.4f}", flush=True)
    print(f"median step: {names[0]} {statistics.median(bare_times) * 1e3:.3f} ms, "
          f"{names[1]} {statistics.median(wrapped_times) * 1e3:.3f} ms")
    print(f"median overhead ratio: {statistics.median(ratios):.4f}")


if __name__ == "__main__":
    main()
