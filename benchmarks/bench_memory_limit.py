"""Benchmark: the least memory ``stepscope analyze TRACE`` runs in, with and without spilling its table.

Each command runs in a memory cgroup of its own with a hard limit (cgroup v1 ``memory.limit_in_bytes``
or v2 ``memory.max``; no swap), so a command that needs more than the limit is killed by the kernel,
as in a container or on a machine of that size. The trace file is read into the page cache first,
outside the cgroup: its pages are the machine's, not charged to the command. For each limit, the
tools alternate: ``auto`` (as typed: the table spills when its analysis would not fit in what the
cgroup has left, see ``stepscope.traces.spill``) and ``in memory`` (``STEPSCOPE_SPILL=off``, the
behaviour before spilling existed). The table says whether each finished, its wall time, the
cgroup's peak usage, and whether its text report is byte for byte the one of an unlimited run.

Needs root and a writable cgroup hierarchy (``/sys/fs/cgroup/memory`` for v1, ``/sys/fs/cgroup``
with the memory controller for v2).

Usage::

    python benchmarks/bench_memory_limit.py TRACE --limits 600M,900M,1200M [--tools auto,off]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")
TOOLS = {"auto": {}, "off": {"STEPSCOPE_SPILL": "off"}}


def _size(text: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30}
    text = text.strip().lower()
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def _cgroup() -> tuple[Path, str, str]:
    """A fresh cgroup directory, its limit file and its peak-usage file."""
    name = f"stepscope-bench-{os.getpid()}"
    if (V1 / "memory.limit_in_bytes").exists():
        path = V1 / name
        path.mkdir(exist_ok=True)
        return path, "memory.limit_in_bytes", "memory.max_usage_in_bytes"
    if "memory" in (V2 / "cgroup.controllers").read_text():
        path = V2 / name
        path.mkdir(exist_ok=True)
        return path, "memory.max", "memory.peak"
    raise SystemExit("bench_memory_limit: no writable memory cgroup (needs root and cgroup v1 or v2 with memory)")


def _run(group: tuple[Path, str, str], limit: int, env_extra: dict[str, str], trace: str, out: str) -> dict:
    path, limit_file, peak_file = group
    (path / limit_file).write_text(str(limit))
    if peak_file == "memory.max_usage_in_bytes":
        (path / peak_file).write_text("0")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **env_extra}
    script = f'echo $$ > {path / "cgroup.procs"} && exec "$@"'
    command = ["bash", "-c", script, "bash", sys.executable, "-m", "stepscope", "analyze", trace]
    started = time.perf_counter()
    with open(out, "wb") as sink:
        done = subprocess.run(command, env=env, stdout=sink, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    peak = int((path / peak_file).read_text()) if (path / peak_file).exists() else 0
    return {"exit": done.returncode, "wall_s": wall, "peak_mb": peak / 2**20}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--limits", required=True, help="comma-separated limits, e.g. 600M,900M,3G")
    parser.add_argument("--tools", default="auto,off", help="comma-separated: auto (as typed), off (no spilling)")
    args = parser.parse_args()
    trace = os.path.realpath(args.trace)
    with open(trace, "rb") as fh:  # into the page cache, charged outside the cgroups
        while fh.read(64 << 20):
            pass
    scratch = tempfile.mkdtemp(prefix="bench-memory-limit-")
    reference = os.path.join(scratch, "unlimited.txt")
    with open(reference, "wb") as sink:
        subprocess.run([sys.executable, "-m", "stepscope", "analyze", trace], stdout=sink, check=False,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    expected = Path(reference).read_bytes()
    group = _cgroup()
    print(f"{Path(trace).name} ({os.path.getsize(trace) / 1e9:.1f} GB)")
    print("| limit | tool | finished | wall | cgroup peak | report as unlimited |")
    print("| ---: | --- | --- | ---: | ---: | --- |")
    try:
        for limit_text in args.limits.split(","):
            for tool in args.tools.split(","):
                out = os.path.join(scratch, f"{tool}.txt")
                row = _run(group, _size(limit_text), TOOLS[tool], trace, out)
                same = Path(out).read_bytes() == expected
                finished = "yes" if row["exit"] in (0, 1) else f"no (exit {row['exit']})"
                print(f"| {limit_text} | {tool} | {finished} | {row['wall_s']:.1f} s | {row['peak_mb']:.0f} MB | "
                      f"{'yes' if same else 'no'} |", flush=True)
    finally:
        try:
            group[0].rmdir()
        except OSError:
            pass


if __name__ == "__main__":
    main()
