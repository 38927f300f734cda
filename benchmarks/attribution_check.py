"""Code attribution checked against an independent profiler (py-spy) on the same runs.

Each workload runs once as ``py-spy record --idle --threads --full-filenames -f raw -- python -m
stepscope run …``: py-spy samples the training process from outside at wall-clock rate (idle
samples included, so its shares are shares of wall time), while stepscope samples the same process
from inside. For the location each verdict names (the top finding's named code location, else the
top location of the largest phase) the table compares

- stepscope's ``share_of_step`` of that location (its share of the phase's samples × the phase's
  measured share of the step), with
- py-spy's share of the main thread's samples inside the training loop whose innermost user frame
  is that line (and, for the function column, that function),

and reports the difference in points. DataLoader workers are compared the same way when the named
location is a worker's (py-spy is attached to each worker by pid as it appears).

    python benchmarks/attribution_check.py [--only NAME] [--json out.json]

Needs py-spy on PATH (``pip install py-spy``) and ptrace rights (root, or CAP_SYS_PTRACE).
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
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "attribution_scripts"

#: (name, what `stepscope run` gets after its options, regex of a frame of the training loop)
WORKLOADS: tuple[tuple[str, list[str], str], ...] = (
    ("loop-bookkeeping", ["-m", "stepscope.zoo.loop_bookkeeping", "--steps", "300"], r"^main \("),
    ("metrics-confusion", ["-m", "stepscope.zoo.metrics_confusion"], r"^main \("),
    ("input-cpu", ["-m", "stepscope.zoo.input_cpu", "--steps", "120"], r"^train \("),
    ("tokenize-main", ["-m", "stepscope.zoo.tokenize_main"], r"^main \("),
    ("worker-tokenize", ["-m", "stepscope.zoo.worker_tokenize", "--steps", "60"], r"^train \("),
    ("gc-cycles", ["-m", "stepscope.zoo.gc_cycles"], r"^main \("),
    ("tiny-ops", ["-m", "stepscope.zoo.tiny_ops", "--steps", "60"], r"^train \("),
    ("small-batch", ["-m", "stepscope.zoo.small_batch", "--steps", "200"], r"^train \("),
    ("c-calls", [str(SCRIPTS / "c_calls.py")], r"^main \("),
)


def user_frame(frame: str) -> bool:
    """A py-spy frame ``func (path:line)`` of user code (not the stdlib, site-packages, stepscope
    itself — its zoo excepted — or frozen modules)."""
    match = re.search(r"\((.*):\d+\)$", frame)
    if match is None:
        return False
    path = match.group(1)
    if "/stepscope/zoo/" in path or path.startswith(str(SCRIPTS)):
        return True
    return not (path.startswith("<") or "/site-packages/" in path or "/lib/python3" in path
                or "/src/stepscope/" in path or path.endswith("/bin/stepscope"))


def parse_frame(frame: str) -> tuple[str, str, int]:
    match = re.match(r"^(.*) \((.*):(\d+)\)$", frame)
    assert match is not None, frame
    return match.group(1), match.group(2), int(match.group(3))


def pyspy_shares(raw: Path, loop: str, main_only: bool) -> tuple[collections.Counter, collections.Counter, int]:
    """(shares by (file, line), shares by (file, function), samples) of the innermost user frame
    over the samples inside the loop (main thread) or over all worker samples."""
    lines: collections.Counter = collections.Counter()
    functions: collections.Counter = collections.Counter()
    total = 0
    for row in raw.read_text().splitlines():
        stack, _, count = row.rpartition(" ")
        frames = stack.split(";")
        if main_only and not any(re.search(loop, frame) for frame in frames):
            continue
        n = int(count)
        total += n
        user = [frame for frame in frames if user_frame(frame)]
        if not user:
            continue
        function, path, line = parse_frame(user[-1])
        lines[(path, line)] += n
        functions[(path, function)] += n
    return lines, functions, total


def named_location(report: dict, record_dir: Path) -> tuple[dict, str] | None:
    """The location the verdict names, with its role: the top finding's code location evidence,
    else the top location of the largest phase."""
    from stepscope.analysis.run.code_locations import attribute_code
    from stepscope.record.store import load_record

    attribution = attribute_code(load_record(record_dir), top=5)
    locations = {}
    for phase in (*attribution.phases, *((attribution.workers,) if attribution.workers else ())):
        for location in phase.locations:
            role = "worker" if phase is attribution.workers else "main"
            locations.setdefault(location.label, (location, role, phase))
    for finding in report.get("findings", ()):
        for item in finding.get("evidence", ()):
            if item.get("metric") == "code_location" and item.get("value") in locations:
                location, role, phase = locations[str(item["value"])]
                return {"label": location.label, "file": location.file, "line": location.line,
                        "function": location.function, "share_of_step": location.share_of_step,
                        "share_of_phase": location.share_of_phase, "phase": phase.phase}, role
    phases = sorted(attribution.phases, key=lambda item: -item.share_of_step)
    for phase in phases:
        if phase.locations:
            location = phase.locations[0]
            return {"label": location.label, "file": location.file, "line": location.line,
                    "function": location.function, "share_of_step": location.share_of_step,
                    "share_of_phase": location.share_of_phase, "phase": phase.phase}, "main"
    return None


def attach_workers(parent: int, out_dir: Path, stop: threading.Event, procs: list) -> None:
    """py-spy on every DataLoader worker of ``parent`` as it appears."""
    import psutil

    seen: set[int] = set()
    try:
        root = psutil.Process(parent)
    except psutil.Error:
        return
    while not stop.is_set():
        try:
            children = root.children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            if child.pid in seen:
                continue
            seen.add(child.pid)
            try:
                command = " ".join(child.cmdline())
            except psutil.Error:
                continue
            if "stepscope.capture.sampler" in command or "py-spy" in command:
                continue
            procs.append(subprocess.Popen(
                ["py-spy", "record", "--pid", str(child.pid), "--full-filenames", "-r", "100", "-f", "raw",
                 "-o", str(out_dir / f"worker.{child.pid}.spy")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.02)


def run_one(name: str, target: list[str], loop: str, work: Path) -> dict:
    run_dir = work / name
    raw = work / f"{name}.spy"
    command = ["py-spy", "record", "--idle", "--full-filenames", "-r", "100", "-f", "raw", "-o", str(raw), "--",
               sys.executable, "-m", "stepscope", "run", "--no-summary", "-o", str(run_dir), *target]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stop, workers = threading.Event(), []
    watcher = None
    time.sleep(0.3)
    import psutil

    try:
        child = next(iter(psutil.Process(proc.pid).children()), None)
    except psutil.Error:
        child = None
    if child is not None:
        watcher = threading.Thread(target=attach_workers, args=(child.pid, work, stop, workers), daemon=True)
        watcher.start()
    _, err = proc.communicate(timeout=600)
    stop.set()
    if watcher is not None:
        watcher.join()
    for worker in workers:
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
    if proc.returncode != 0 or not (run_dir / "report.json").is_file():
        return {"workload": name, "error": f"exit {proc.returncode}: {err.decode(errors='replace')[-300:]}"}
    report = json.loads((run_dir / "report.json").read_text())
    named = named_location(report, run_dir)
    if named is None:
        return {"workload": name, "error": "no code location"}
    location, role = named
    if role == "worker":
        lines: collections.Counter = collections.Counter()
        functions: collections.Counter = collections.Counter()
        total = 0
        for path in work.glob("worker.*.spy"):
            more = pyspy_shares(path, loop, main_only=False)
            lines.update(more[0])
            functions.update(more[1])
            total += more[2]
            path.unlink()
        # worker samples are the loading work of the data-wait phase: compare shares of the
        # workers' samples, stepscope's being share_of_step / data-wait share
        ours = location["share_of_phase"]
    else:
        lines, functions, total = pyspy_shares(raw, loop, main_only=True)
        ours = location["share_of_step"]
    short = location["function"].rsplit(".", 1)[-1]
    theirs_line = lines.get((location["file"], location["line"]), 0) / total if total else None
    theirs_function = sum(count for (path, function), count in functions.items()
                          if path == location["file"] and function == short) / total if total else None
    py_top = functions.most_common(1)[0][0] if functions else None
    top = report["findings"][0] if report.get("findings") else {}
    return {"workload": name, "named": location["label"], "role": role, "phase": location["phase"],
            "stepscope": ours, "py_spy_line": theirs_line, "py_spy_function": theirs_function,
            "py_spy_samples": total, "py_spy_top_function": f"{Path(py_top[0]).name} {py_top[1]}()" if py_top else None,
            "top_finding": top.get("title", "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("py-spy is not on PATH: pip install py-spy")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, target, loop in WORKLOADS:
            if args.only and name not in args.only:
                continue
            rows.append(run_one(name, target, loop, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print("| workload | named location (phase) | stepscope | py-spy, that line | py-spy, that function | "
          "error (points) | py-spy's top function |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        if "error" in row:
            print(f"| {row['workload']} | {row['error']} | | | | | |")
            continue
        line, function = row["py_spy_line"], row["py_spy_function"]
        error = abs(row["stepscope"] - line) * 100 if line is not None else None
        where = "workers" if row["role"] == "worker" else row["phase"]
        print(f"| {row['workload']} | `{row['named']}` ({where}) | {row['stepscope']:.0%} | "
              f"{line:.0%} | {function:.0%} | {error:.1f} | {row['py_spy_top_function']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
