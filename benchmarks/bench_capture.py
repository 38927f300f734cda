"""Overhead of always-on capture on a training step, three ways, each against a baseline in the same run.

1. *Hook cost per step*: a minimal step (one-sample DataLoader fetch, a 1×1 Linear forward and
   backward, an optimizer step) timed bare and captured in alternating epochs of one process; the
   difference of the minima is what capture adds per step, and the ratio it implies on a 5 ms step
   is printed. This is the robust number on a noisy machine.
2. *In-process blocks*: a ~3–5 ms/step MLP loop, alternating blocks bare and captured.
3. *End to end*: the same loop as a script, ``python loop.py`` vs ``stepscope run loop.py``
   alternately in subprocesses (each run times its own steady-state loop, so start-up is not
   counted); median ratio.

    python benchmarks/bench_capture.py [--rounds 7] [--steps 400]
    python benchmarks/bench_capture.py --compiled aot_eager [--rounds 7]   # end to end, compiled model
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
    import statistics, sys, tempfile, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from stepscope.capture.session import CaptureSession

    torch.set_num_threads(1)
    steps, rounds = int(sys.argv[1]), int(sys.argv[2])
    loader = DataLoader(TensorDataset(torch.zeros(steps, 1)), batch_size=None)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.zeros(1, 1)

    def epoch():
        started = time.perf_counter()
        for _ in loader:
            model(x).sum().backward()
            opt.step()
        return (time.perf_counter() - started) / steps

    epoch()
    bare, captured = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(rounds):
            bare.append(epoch())
            session = CaptureSession(tmp + f"/r{index}", sample_interval_s=None, count_flops=False,
                                     emit_warnings=False).start()
            epoch()
            captured.append(epoch())
            session.stop()
    print(min(bare), min(captured))
""")

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


def run_once(script: Path, steps: int, wrapped: bool, workdir: Path, extra: tuple[str, ...] = ()) -> float:
    prefix = [sys.executable, "-m", "stepscope", "run", "--no-summary", "--no-monitor", "--force",
              "-o", str(workdir / "run")] if wrapped else [sys.executable]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([*prefix, str(script), str(steps), *extra], capture_output=True, text=True, env=env,
                            check=True)
    return float(result.stdout.strip().splitlines()[-2])


def minimal_step(steps: int, rounds: int, workdir: Path) -> tuple[float, float]:
    script = workdir / "minimal.py"
    script.write_text(MINIMAL)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, str(script), str(steps), str(rounds)], capture_output=True,
                            text=True, env=env, check=True)
    bare, captured = (float(value) for value in result.stdout.split())
    return bare, captured


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
    parser.add_argument("--compiled", metavar="BACKEND", help="only the end-to-end comparison, on the loop's model "
                        "compiled with torch.compile(backend=BACKEND), e.g. aot_eager or inductor")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if args.compiled:
            end_to_end(args, workdir, (args.compiled,))
            return
        bare, captured = minimal_step(2000, args.rounds + 3, workdir)
        cost = captured - bare
        print(f"hook cost: minimal step {bare * 1e6:.1f} µs bare, {captured * 1e6:.1f} µs captured "
              f"=> {cost * 1e6:.1f} µs/step; on a 5 ms step: ratio {1 + cost / 5e-3:.4f}", flush=True)
        wall, cpu, step = in_process(args.block, args.rounds * 3, workdir)
        print(f"in-process, alternating blocks of {args.block} steps ({step * 1e3:.2f} ms/step): "
              f"median ratio wall {wall:.4f}, CPU time {cpu:.4f}", flush=True)
        end_to_end(args, workdir, ())


def end_to_end(args: argparse.Namespace, workdir: Path, extra: tuple[str, ...]) -> None:
    script = workdir / "loop.py"
    script.write_text(LOOP)
    ratios, bare_times, wrapped_times = [], [], []
    for round_index in range(args.rounds):
        order = (False, True) if round_index % 2 == 0 else (True, False)
        times = {mode: run_once(script, args.steps, mode, workdir, extra) for mode in order}
        bare_times.append(times[False])
        wrapped_times.append(times[True])
        ratios.append(times[True] / times[False])
        print(f"round {round_index}: bare {times[False] * 1e3:.3f} ms/step, "
              f"stepscope {times[True] * 1e3:.3f} ms/step, ratio {ratios[-1]:.4f}", flush=True)
    print(f"median step: bare {statistics.median(bare_times) * 1e3:.3f} ms, "
          f"stepscope {statistics.median(wrapped_times) * 1e3:.3f} ms")
    print(f"median overhead ratio: {statistics.median(ratios):.4f}")


if __name__ == "__main__":
    main()
