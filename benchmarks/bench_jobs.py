"""A job's traces: time and peak memory of ``stepscope analyze DIR`` against the number of ranks,
analysed in one process (``--jobs 1``), on local worker processes (``--jobs N``) and, with
``--dask``, on a local Dask cluster of N single-threaded workers (``--dask local --jobs N``: the same
map through ``Client.get_executor()``, the cluster's start-up included).

Jobs are derived from a reference trace: rank copies with ``distributedInfo`` rewritten (and the
trace replicated to reach the size asked for, as ``bench_analyze.py`` builds its synthetic
traces). Each command runs in a fresh child; wall time includes interpreter start; CPU time and
peak RSS (the largest single process: the driver or one worker) come from ``wait4``.

    python benchmarks/bench_jobs.py [--small 64 --small-mb 2] [--large 8 --large-mb 50] [--jobs 2] [--dask]
"""

from __future__ import annotations

import argparse
import gzip
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "tests" / "data" / "traces" / "reference" / "hta" / "trace_compare" / "base"


def seed_trace() -> Path:
    return next(p for p in sorted(SEED.iterdir()) if p.name.endswith((".json", ".json.gz")))


def derive_job(seed: Path, ranks: int, mb: float, out: Path) -> Path:
    """``ranks`` copies of ``seed`` of ~``mb`` MB each, one rank each."""
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_analyze import make_synthetic

    out.mkdir(parents=True, exist_ok=True)
    raw = seed.read_bytes()
    doc = orjson.loads(gzip.decompress(raw) if seed.name.endswith(".gz") else raw)
    if len(orjson.dumps(doc)) < mb * 1e6 * 0.9:
        sized = make_synthetic(seed, mb, out / "sized.json")
        doc = orjson.loads(sized.read_bytes())
        sized.unlink()
    for rank in range(ranks):
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": ranks}
        (out / f"rank{rank:04d}.json").write_bytes(orjson.dumps(doc))
    return out


def measure(command: list[str], stdout: Path | None = None) -> tuple[float, float, float]:
    """(wall s, CPU s of the process and its children, peak RSS MB of the largest one); the
    command's output goes to ``stdout`` when given."""
    started = time.perf_counter()
    sink = open(stdout, "wb") if stdout is not None else subprocess.DEVNULL  # noqa: SIM115 - closed below
    try:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.PIPE)
    finally:
        if stdout is not None:
            sink.close()
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(command)} failed: {process.stderr.read().decode()[-500:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=64)
    parser.add_argument("--small-mb", type=float, default=2.0)
    parser.add_argument("--large", type=int, default=8)
    parser.add_argument("--large-mb", type=float, default=50.0)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--dask", action="store_true", help="also time a local Dask cluster of --jobs workers")
    parser.add_argument("--derive", nargs=4, metavar=("SEED", "RANKS", "MB", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.derive:
        derive_job(Path(args.derive[0]), int(args.derive[1]), float(args.derive[2]), Path(args.derive[3]))
        return
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        for label, ranks, mb in (("small", args.small, args.small_mb), ("large", args.large, args.large_mb)):
            for count in sorted({max(1, ranks // 4), ranks}):
                # in a child: the rank documents take ~8x their JSON size as Python objects, and a
                # child forked from the driver inherits its resident high-water mark in ru_maxrss
                job = Path(tmp) / f"{label}{count}"
                subprocess.run([sys.executable, __file__, "--derive", str(seed_trace()), str(count), str(mb), str(job)],
                               check=True)
                size = sum(p.stat().st_size for p in job.iterdir()) / 1e6
                rows = {}
                for jobs in (1, args.jobs):
                    rows[jobs] = measure([sys.executable, "-m", "stepscope", "analyze", str(job), "--format", "json",
                                          "-o", str(Path(tmp) / "out.json"), "--jobs", str(jobs)])
                one, many = rows[1], rows[args.jobs]
                line = (f"{count:4d} ranks x {size / count:5.1f} MB ({size:7.1f} MB): --jobs 1 {one[0]:6.1f} s wall, "
                        f"{one[1]:6.1f} s CPU, {one[2]:5.0f} MB peak | --jobs {args.jobs} {many[0]:6.1f} s wall, "
                        f"{many[1]:6.1f} s CPU, {many[2]:5.0f} MB peak per process | speed-up {one[0] / many[0]:.2f}x")
                if args.dask:
                    dask = measure([sys.executable, "-m", "stepscope", "analyze", str(job), "--format", "json",
                                    "-o", str(Path(tmp) / "dask.json"), "--dask", "local", "--jobs", str(args.jobs)])
                    same = (Path(tmp) / "dask.json").read_bytes() == (Path(tmp) / "out.json").read_bytes()
                    line += (f" | --dask local {dask[0]:6.1f} s wall, {dask[1]:6.1f} s CPU, {dask[2]:5.0f} MB peak "
                             f"per process, speed-up {one[0] / dask[0]:.2f}x, {'same' if same else 'DIFFERENT'} output")
                print(line, flush=True)
                for path in job.iterdir():
                    path.unlink()


if __name__ == "__main__":
    main()
