"""Where the test suite's CPU goes: every process it starts, by kind and by test file.

Runs pytest (by default the parallel part of ``make test``) under a system-wide ``perf record``
(CPU-clock samples of every process, and the kernel's fork records), with a ``sitecustomize`` on
``PYTHONPATH`` that logs each interpreter's start: its pid, its command line and the test that
started it (``PYTEST_CURRENT_TEST``, which test processes pass on to their children). Each sampled
process is then charged to the nearest interpreter start among its ancestors: the pytest workers
themselves, a cold interpreter (by its command), or a fork of one (a DataLoader worker, a process
forked from the tests' warm interpreter). Processes whose environment dropped ``PYTHONPATH``, or put
another ``sitecustomize`` first (the fault-injection tests), and whose ancestors are not logged
either, are counted as not attributed.

Needs ``perf`` with system-wide sampling (root, or ``kernel.perf_event_paranoid`` <= 0). The
samples are CPU time at ``--hz`` a second per core: at 99 Hz, one sample is ~10 ms.

    python benchmarks/suite_census.py                   # the parallel part of make test
    python benchmarks/suite_census.py -- -p no:xdist -m serial   # the serial part
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

LOGGER = """\
import json, os, sys
try:
    with open({log!r}, "a") as _fh:
        _fh.write(json.dumps({{"pid": os.getpid(), "argv": sys.orig_argv[1:8],
                               "test": os.environ.get("PYTEST_CURRENT_TEST", "")}}) + "\\n")
except OSError:
    pass
"""

FORK = re.compile(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)")


def kind(argv: list[str]) -> str:
    """A short name for an interpreter's command line."""
    text = " ".join(argv)
    if "exec(eval(sys.stdin.readline()))" in text:
        return "pytest worker (in-process tests)"
    if "spawn_main" in text:
        return "multiprocessing spawn child"
    if "-m" in argv[:3] and "pytest" in argv:
        return "pytest main"
    words = [Path(word).name if "/" in word else word for word in argv if not word.startswith("-u")]
    if words[:2] == ["-m", "stepscope"]:
        return "stepscope " + (words[2] if len(words) > 2 else "")
    if words[:1] == ["-m"]:
        return "-m " + (words[1] if len(words) > 1 else "")
    if words[:1] == ["-c"]:
        return "python -c"
    return "script " + (words[0] if words else "?")


def census(samples: dict[int, int], parent: dict[int, int], starts: dict[int, dict], hz: float) -> dict:
    by_kind: collections.Counter[str] = collections.Counter()
    by_file: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for start in starts.values():
        count[kind(start["argv"])] += 1
    for pid, n in samples.items():
        if pid == 0:
            continue
        ancestor, hops = pid, 0
        while ancestor not in starts and ancestor in parent and hops < 64:
            ancestor, hops = parent[ancestor], hops + 1
        start = starts.get(ancestor)
        if start is None:
            by_kind["not attributed"] += n
            continue
        name = kind(start["argv"])
        by_kind[name if ancestor == pid else f"{name} (its forks)"] += n
        by_file[start["test"].split("::")[0] or "(no test: the pytest processes themselves)"] += n
    seconds = {key: value / hz for key, value in by_kind.items()}
    return {"idle_s": samples.get(0, 0) / hz, "busy_s": sum(n for pid, n in samples.items() if pid) / hz,
            "by_kind": dict(sorted(seconds.items(), key=lambda item: -item[1])), "starts": dict(count),
            "by_file": {key: value / hz for key, value in by_file.most_common()}}


def read_perf(data: Path) -> tuple[dict[int, int], dict[int, int]]:
    """Samples per process and each process's parent, from ``perf script``."""
    text = subprocess.run(["perf", "script", "-i", str(data), "--show-task-events", "-F", "pid,tid,event"],
                          capture_output=True, text=True, check=True).stdout
    samples: collections.Counter[int] = collections.Counter()
    parent: dict[int, int] = {}
    for line in text.splitlines():
        if "PERF_RECORD_FORK" in line:
            match = FORK.search(line)
            if match and match.group(1) != match.group(3):  # a process, not a thread
                parent.setdefault(int(match.group(1)), int(match.group(3)))
        elif "cpu-clock" in line:
            samples[int(line.split()[0].split("/")[0])] += 1
    return samples, parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hz", type=int, default=99, help="samples a second per core (default 99)")
    parser.add_argument("--workers", type=int, default=(os.cpu_count() or 1) + 1,
                        help="pytest-xdist workers of the default command (make test's: cores + 1)")
    parser.add_argument("--top", type=int, default=25, help="kinds of process and test files listed")
    parser.add_argument("--json", type=Path, help="also write the census here")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments instead of the parallel part")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        print("suite_census: perf is not installed", file=sys.stderr)
        return 2
    pytest_args = args.pytest_args or ["-n", str(args.workers), "--dist", "worksteal", "-m", "not serial"]
    with tempfile.TemporaryDirectory(prefix="census-") as tmp:
        work = Path(tmp)
        log = work / "starts.jsonl"
        (work / "site").mkdir()
        (work / "site" / "sitecustomize.py").write_text(LOGGER.format(log=str(log)))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(work / "site"), os.environ.get("PYTHONPATH")])),
                   PYTHONDONTWRITEBYTECODE="", XDG_CACHE_HOME=str(work / "cache"))
        command = ["perf", "record", "-q", "-a", "-F", str(args.hz), "-e", "cpu-clock", "-o", str(work / "perf.data"),
                   "--", sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args]
        began = time.monotonic()
        run = subprocess.run(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wall = time.monotonic() - began
        tail = run.stdout.strip().splitlines()[-1:] or [""]
        samples, parent = read_perf(work / "perf.data")
        starts = {}
        for line in log.read_text().splitlines() if log.exists() else []:
            start = json.loads(line)
            starts.setdefault(start["pid"], start)
    result = census(samples, parent, starts, args.hz)
    result.update(wall_s=wall, pytest=tail[0], command=pytest_args)
    print(f"pytest {' '.join(pytest_args)}: {tail[0]}")
    print(f"wall {wall:.0f} s; CPU {result['busy_s']:.0f} s busy ({result['busy_s'] / wall:.2f} cores), "
          f"{result['idle_s']:.0f} s idle; {len(starts)} interpreters started\n")
    print("| processes | CPU s | share | started |\n| --- | ---: | ---: | ---: |")
    kinds = list(result["by_kind"].items())
    rest = sum(value for _, value in kinds[args.top:])
    for name, value in kinds[: args.top] + ([("(the other kinds)", rest)] if rest else []):
        started = "" if name.endswith("(its forks)") else result["starts"].get(name, "")
        print(f"| {name} | {value:.1f} | {value / result['busy_s']:.0%} | {started} |")
    print("\n| test file (its processes and their forks) | CPU s |\n| --- | ---: |")
    for name, value in list(result["by_file"].items())[: args.top]:
        print(f"| {name} | {value:.1f} |")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return run.returncode


if __name__ == "__main__":
    sys.exit(main())
