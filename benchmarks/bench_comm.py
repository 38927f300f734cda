"""Overhead of the communication hook: DDP steps with stepscope's timed hook vs DDP's built-in all-reduce.

Launches itself under torchrun (2 gloo processes). Each rank builds two identical DDP models: one
left with DDP's built-in reduction, one with stepscope's timed communication hook (what ``stepscope
run`` registers), and trains them in alternating blocks of steps so machine noise hits both alike.
Prints the median step time of each and their ratio (rank 0).

    python benchmarks/bench_comm.py                       # defaults: 6 rounds of 2 × 60 steps
    python benchmarks/bench_comm.py --rounds 3 --steps 30
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60, help="steps per block")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--python-hook", action="store_true",
                        help="compare with torch's own Python allreduce_hook instead of stepscope's timed one")
    parser.add_argument("--buckets-mb", type=float, default=0.25, help="DDP bucket_cap_mb (several buckets)")
    return parser.parse_args()


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stepscope.capture.collectives import CollectiveHooks
    from stepscope.capture.recorder import StepRecorder
    from stepscope.capture.warn import WarningSink

    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()

    def build() -> DDP:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(64, args.width), torch.nn.ReLU(),
                                  torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                  torch.nn.Linear(args.width, 1))
        return DDP(net, bucket_cap_mb=args.buckets_mb)

    plain = build()
    plain._stepscope_comm = "off"  # keeps DDP's built-in reduction once the hooks are installed
    recorder = StepRecorder()
    hooks = CollectiveHooks(recorder, WarningSink(emit=False))
    hooks.install(torch)
    timed = build()
    if args.python_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hooks.uninstall()
        timed.register_comm_hook(None, default_hooks.allreduce_hook)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(rank))
    y = torch.randn(16, 1, generator=torch.Generator().manual_seed(rank + 1))

    def block(model: DDP) -> float:
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            opt.zero_grad(set_to_none=True)
            recorder.enter(3)  # what the backward hook does under capture
            torch.nn.functional.mse_loss(model(x), y).backward()
            recorder.leave(3)
            opt.step()
            recorder.mark_step()
        return (time.perf_counter() - start) / args.steps

    block(plain), block(timed)  # warm-up (the timed model registers its hook on its first forward)
    results: dict[str, list[float]] = {"built-in": [], "timed hook": []}
    for index in range(args.rounds):
        order = (("built-in", plain), ("timed hook", timed)) if index % 2 == 0 else (("timed hook", timed), ("built-in", plain))
        for name, model in order:
            results[name].append(block(model))
    hooks.uninstall()
    if rank == 0 and args.python_hook:
        bare, hooked = (statistics.median(results[name]) for name in ("built-in", "timed hook"))
        print(f"torch's Python allreduce_hook vs built-in: ratio {hooked / bare:.4f}")
    elif rank == 0:
        bare, hooked = (statistics.median(results[name]) for name in ("built-in", "timed hook"))
        buckets = timed._stepscope_comm.hooks.timer.bucket_count / ((args.rounds + 1) * args.steps)
        print(f"DDP step, 2 gloo ranks, {buckets:.1f} bucket(s)/step: built-in {bare * 1e3:.3f} ms, "
              f"timed hook {hooked * 1e3:.3f} ms (median of {args.rounds} blocks of {args.steps} steps)")
        print(f"overhead ratio: {hooked / bare:.4f} ({(hooked - bare) * 1e6:+.1f} µs per step)")
    dist.destroy_process_group()


def main() -> None:
    args = _parse()
    if "LOCAL_RANK" in os.environ:
        _worker(args)
        return
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               __file__, *sys.argv[1:]]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    raise SystemExit(subprocess.call(command, env=env))


if __name__ == "__main__":
    main()
