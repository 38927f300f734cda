"""Capture's cost and verdicts on three device workloads, plain against ``stepscope run``.

Scripts (written into a temporary directory; each times its own loop between two device
synchronisations and reads its training thread's ``/proc/self/task/<tid>/schedstat``):

- ``tiny_ops``: 60 ``Linear(64, 64)`` layers, SGD, 200 steps (launch-bound on a GPU);
- ``big_bf16``: two ``Linear(8192, 8192)`` under bf16 autocast, AdamW, 60 steps (compute-bound on a GPU;
  ``--small`` shrinks it to 1024 for a CPU);
- ``item_sync``: ``Linear`` 2048→2048→10, a copy from pageable host memory and ``.item()`` every
  step, 300 steps.

Each round runs every script as ``python SCRIPT``, ``stepscope run SCRIPT`` and ``stepscope run
--stacks-hz 0 --no-monitor SCRIPT``, in that order, and prints the loop's time and the thread's
shares; with ``--keep DIR`` the run directories stay there (their report.json holds the verdicts
and the per-step times that the steady-step comparison in BENCHMARKS.md reads).

    python benchmarks/bench_gpu_overhead.py [--device cuda] [--rounds 2] [--keep DIR] [--small]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO_SRC = Path(__file__).resolve().parents[1] / "src"

PROLOGUE = textwrap.dedent("""
    import sys, threading, time
    import torch

    DEVICE = sys.argv[1]
    SIZE = int(sys.argv[2])


    def sync():
        if DEVICE.startswith("cuda"):
            torch.cuda.synchronize()


    def thread_ns():
        try:
            with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as f:
                cpu, runq, _ = f.read().split()
            return int(cpu), int(runq)
        except OSError:
            return 0, 0


    torch.manual_seed(0)
""")

EPILOGUE = textwrap.dedent("""
    sync()
    wall = time.perf_counter() - t0
    c1 = thread_ns()
    print(f"loop {wall:.3f} s, thread on CPU {(c1[0] - c0[0]) / 1e9 / wall:.1%}, "
          f"waiting for a core {(c1[1] - c0[1]) / 1e9 / wall:.1%}")
""")

BODIES = {
    "tiny_ops": """
model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(60)]).to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(32, 64, device=DEVICE)
sync(); t0 = time.perf_counter(); c0 = thread_ns()
for step in range(200):
    opt.zero_grad(set_to_none=True)
    model(x).pow(2).mean().backward()
    opt.step()
""",
    "big_bf16": """
model = torch.nn.Sequential(torch.nn.Linear(SIZE, SIZE), torch.nn.GELU(), torch.nn.Linear(SIZE, SIZE)).to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(SIZE, SIZE, device=DEVICE)
sync(); t0 = time.perf_counter(); c0 = thread_ns()
for step in range(60):
    opt.zero_grad(set_to_none=True)
    with torch.autocast(DEVICE.split(":")[0], dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
""",
    "item_sync": """
model = torch.nn.Sequential(torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10)).to(DEVICE)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
host = [torch.randn(1024, 2048) for _ in range(4)]      # pageable host memory
total = 0.0
sync(); t0 = time.perf_counter(); c0 = thread_ns()
for step in range(300):
    x = host[step % 4].to(DEVICE)
    opt.zero_grad(set_to_none=True)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    total += loss.item()                                  # a host sync every step
""",
}

MODES = {"plain": None, "stepscope": (), "stepscope --stacks-hz 0 --no-monitor": ("--stacks-hz", "0", "--no-monitor")}


def loop_line(output: str) -> str:
    return next((line for line in output.splitlines() if line.startswith("loop ")), "no loop line: " + output[-300:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--keep", type=Path, default=None, help="keep the scripts and run directories here")
    parser.add_argument("--small", action="store_true", help="big_bf16 at 1024 wide (for a CPU)")
    parser.add_argument("--scripts", default=",".join(BODIES), help="comma-separated, of: " + ", ".join(BODIES))
    args = parser.parse_args(argv)
    names = [name for name in args.scripts.split(",") if name]
    unknown = sorted(set(names) - set(BODIES))
    if unknown:
        parser.error(f"unknown script(s) {', '.join(unknown)}: choose from {', '.join(BODIES)}")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.keep is not None and args.keep.exists() and not args.keep.is_dir():
        parser.error(f"--keep {args.keep}: not a directory; give a directory to keep the runs in")
    env = {**os.environ, "PYTHONPATH": str(REPO_SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    size = "1024" if args.small else "8192"
    with tempfile.TemporaryDirectory(prefix="stepscope-gpu-overhead-") as scratch:
        work = args.keep or Path(scratch)
        work.mkdir(parents=True, exist_ok=True)
        for name in names:
            (work / f"{name}.py").write_text(PROLOGUE + BODIES[name] + EPILOGUE, encoding="utf-8")
        for round_ in range(1, args.rounds + 1):
            for name in names:
                for mode, options in MODES.items():
                    script = [f"{name}.py", args.device, size]
                    command = ([sys.executable, *script] if options is None else
                               [sys.executable, "-m", "stepscope", "run", "--no-summary", "--force",
                                "-o", f"run_{name}_{round_}_{len(options)}", *options, *script])
                    result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=600)
                    print(f"{name:10} round {round_} {mode:38} {loop_line(result.stdout + result.stderr)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
