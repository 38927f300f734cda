"""A job's run records: time and peak memory of ``stepscope report RUN_DIR`` against the number of
ranks, the ranks read in this process (``--jobs 1``) and in local worker processes (``--jobs N``).

Jobs are derived from the recorded two-rank straggler job (``tests/data/runs/straggler-two-ranks``):
rank copies with the rank and world size rewritten, each with a ``stepscope run --trace`` window —
a copy of a reference NCCL trace (``hta/nccl_parser_config``, 0.75 MB of gzip, 12 MB of JSON), as
a data-parallel rank's window would be. Each command runs in a fresh child; wall time includes
interpreter start; CPU time and peak RSS (the largest single process) come from ``wait4``. The
two outputs are compared byte for byte.

    python benchmarks/bench_job_report.py [--ranks 8 32] [--jobs 2] [--per-host 8] [--no-windows] [--steps-scale 1]

``--per-host`` ranks share a host name (the periodic-stall neighbour test compares each rank with
the others of its host); ``--no-windows`` leaves the ranks without ``--trace`` windows;
``--steps-scale K`` repeats each record's 30 steps K times (a longer run's record).
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_jobs import measure  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "data" / "runs" / "straggler-two-ranks"
WINDOW = ROOT / "tests" / "data" / "traces" / "reference" / "hta" / "nccl_parser_config" / "nccl_data.json.gz"


def derive_job(ranks: int, out: Path, per_host: int = 8, windows: bool = True, steps_scale: int = 1) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for rank in range(ranks):
        record = json.loads(gzip.decompress((RUN / f"record.rank{rank % 2}.json.gz").read_bytes()))
        if steps_scale > 1:
            _repeat_steps(record["steps"], steps_scale)
        record["meta"].update(rank=rank, local_rank=rank % per_host, node_rank=rank // per_host, world_size=ranks,
                              hostname=f"node{rank // per_host}")
        if windows:
            window = f"traces/window.rank{rank}.json.gz"  # where stepscope run --trace writes them
            (out / "traces").mkdir(exist_ok=True)
            shutil.copy(WINDOW, out / window)
            record["profiler_windows"] = [{"first_step": 5, "last_step": 8, "trace_path": window}]
        (out / f"record.rank{rank}.json.gz").write_bytes(gzip.compress(json.dumps(record).encode()))
        shutil.copy(RUN / f"samples.rank{rank % 2}.jsonl.gz", out / f"samples.rank{rank}.jsonl.gz")
    return out


def _repeat_steps(steps: dict, times: int) -> None:
    """The step table ``times`` times over (a delta-encoded column repeats its deltas)."""
    for name, values in steps["columns"].items():
        if name in steps["delta_encoded"]:
            deltas = values[1:] + values[1:2]
            steps["columns"][name] = [values[0], *(deltas * times)[: len(values) * times - 1]]
        else:
            steps["columns"][name] = values * times
    steps["count"] *= times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--per-host", type=int, default=8, help="ranks per host name")
    parser.add_argument("--no-windows", action="store_true", help="ranks without --trace windows")
    parser.add_argument("--steps-scale", type=int, default=1, help="repeat each record's steps K times")
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        for ranks in args.ranks:
            job = derive_job(ranks, Path(tmp) / f"job{ranks}", args.per_host, not args.no_windows,
                             args.steps_scale)
            rows, outputs = {}, {}
            for jobs in (1, args.jobs):
                out = Path(tmp) / f"out{jobs}.json"
                rows[jobs] = measure([sys.executable, "-m", "stepscope", "report", str(job), "--format", "json",
                                      "--jobs", str(jobs)], stdout=out)
                outputs[jobs] = out.read_bytes()
            one, many = rows[1], rows[args.jobs]
            same = "same" if outputs[1] == outputs[args.jobs] else "DIFFERENT"
            print(f"{ranks:4d} ranks: --jobs 1 {one[0]:6.2f} s wall, {one[1]:6.2f} s CPU, {one[2]:5.0f} MB peak | "
                  f"--jobs {args.jobs} {many[0]:6.2f} s wall, {many[1]:6.2f} s CPU, {many[2]:5.0f} MB peak per process"
                  f" | speed-up {one[0] / many[0]:.2f}x, {same} output", flush=True)
            shutil.rmtree(job)


if __name__ == "__main__":
    main()
