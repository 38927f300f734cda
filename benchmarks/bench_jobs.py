"""A job's traces: time and peak memory of ``stepscope analyze DIR`` against the number of ranks,
analysed in one process (``--jobs 1``), on local worker processes (``--jobs N``) and, with
``--dask``, on a local Dask cluster of N single-threaded workers (``--dask local --jobs N``: the same
map through ``Client.get_executor()``, the cluster's start-up included).

Jobs are derived from a reference trace: rank copies with ``distributedInfo`` rewritten (and the
trace replicated to reach the size asked for, as ``bench_analyze.py`` builds its synthetic
traces). Each command runs in a fresh child; wall time includes interpreter start; CPU time and
peak RSS (the largest single process: the driver or one worker) come from ``wait4``.

    python benchmarks/bench_jobs.py [--small 16,64,256,1024 --small-mb 0.2] [--large 2,16,64 --large-mb 54]
        [--jobs 2] [--dask] [--format text|json]

``--small`` and ``--large`` take the rank counts to run (each a job of its own); the output is the
command's default text (``-o FILE``), or with ``--format json`` the JSON document. Peak RSS is
``ru_maxrss`` of the command's process tree: the largest single process (the driver or one worker).
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
LARGE_SEED = ROOT.parent / "shared" / "traces" / "hta" / "trace_diff" / "control" / "control.json.gz"


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
    parser.add_argument("--small", default="16,64,256,1024", help="rank counts of the small-rank jobs")
    parser.add_argument("--small-mb", type=float, default=0.2)
    parser.add_argument("--large", default="2,16", help="rank counts of the large-rank jobs")
    parser.add_argument("--large-mb", type=float, default=54.0)
    parser.add_argument("--large-seed", type=Path, default=LARGE_SEED,
                        help="the trace the large ranks replicate (default: the trace_diff/control sample when "
                             "../shared/traces is there, else the small seed)")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--format", choices=("text", "json"), default="text")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--dask", action="store_true", help="also time a local Dask cluster of --jobs workers")
    parser.add_argument("--derive", nargs=4, metavar=("SEED", "RANKS", "MB", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.work_dir is not None and not args.work_dir.is_dir():
        parser.error(f"--work-dir {args.work_dir}: no such directory")
    if args.derive:
        derive_job(Path(args.derive[0]), int(args.derive[1]), float(args.derive[2]), Path(args.derive[3]))
        return
    script = Path(sys.executable).parent / "stepscope"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "stepscope"]
    print(f"{'ranks':>6} {'MB/rank':>8} {'MB':>8} | {'--jobs 1: wall s':>16} {'CPU s':>7} {'RSS MB':>7} | "
          f"{f'--jobs {args.jobs}: wall s':>16} {'CPU s':>7} {'RSS MB':>7} {'x':>5}"
          + (f" | {'--dask local: wall s':>20} {'CPU s':>7} {'RSS MB':>7} {'x':>5} output" if args.dask else ""),
          flush=True)
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        large_seed = args.large_seed if args.large_seed.is_file() else seed_trace()
        for label, counts, mb, seed in (("small", args.small, args.small_mb, seed_trace()),
                                        ("large", args.large, args.large_mb, large_seed)):
            for count in [int(item) for item in counts.split(",") if item.strip()]:
                # in a child: the rank documents take ~8x their JSON size as Python objects, and a
                # child forked from the driver inherits its resident high-water mark in ru_maxrss
                job = Path(tmp) / f"{label}{count}"
                subprocess.run([sys.executable, __file__, "--derive", str(seed), str(count), str(mb), str(job)],
                               check=True)
                size = sum(p.stat().st_size for p in job.iterdir()) / 1e6
                out = {"local": Path(tmp) / "out.txt", "dask": Path(tmp) / "dask.txt"}
                fmt = ["--format", "json"] if args.format == "json" else []
                rows = {}
                for jobs in (1, args.jobs):
                    rows[jobs] = measure([*command, "analyze", str(job), *fmt, "-o", str(out["local"]),
                                          "--jobs", str(jobs)])
                one, many = rows[1], rows[args.jobs]
                line = (f"{count:6d} {size / count:8.2f} {size:8.1f} | {one[0]:16.1f} {one[1]:7.1f} {one[2]:7.0f} | "
                        f"{many[0]:16.1f} {many[1]:7.1f} {many[2]:7.0f} {one[0] / many[0]:5.2f}")
                if args.dask:
                    dask = measure([*command, "analyze", str(job), *fmt, "-o", str(out["dask"]), "--dask", "local",
                                    "--jobs", str(args.jobs)])
                    same = out["dask"].read_bytes() == out["local"].read_bytes()
                    line += (f" | {dask[0]:20.1f} {dask[1]:7.1f} {dask[2]:7.0f} {one[0] / dask[0]:5.2f} "
                             f"{'same' if same else 'DIFFERENT'}")
                print(line, flush=True)
                for path in job.iterdir():
                    path.unlink()
                job.rmdir()


if __name__ == "__main__":
    main()
