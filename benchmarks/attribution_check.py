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

ZOO = HERE.parent / "src" / "stepscope" / "zoo"
#: (name, what `stepscope run` gets after its options, (file, function) holding the training loop)
WORKLOADS: tuple[tuple[str, list[str], tuple[Path, str]], ...] = (
    ("loop-bookkeeping", ["-m", "stepscope.zoo.loop_bookkeeping", "--steps", "500"], (ZOO / "loop_bookkeeping.py", "main")),
    ("metrics-confusion", ["-m", "stepscope.zoo.metrics_confusion", "--steps", "1500"],
     (ZOO / "metrics_confusion.py", "main")),
    ("input-cpu", ["-m", "stepscope.zoo.input_cpu", "--steps", "200"], (ZOO / "_common.py", "train")),
    ("tokenize-main", ["-m", "stepscope.zoo.tokenize_main", "--steps", "200"], (ZOO / "tokenize_main.py", "main")),
    ("worker-tokenize", ["-m", "stepscope.zoo.worker_tokenize", "--steps", "150"], (ZOO / "_common.py", "train")),
    ("gc-cycles", ["-m", "stepscope.zoo.gc_cycles"], (ZOO / "gc_cycles.py", "main")),
    ("tiny-ops", ["-m", "stepscope.zoo.tiny_ops", "--steps", "150"], (ZOO / "_common.py", "train")),
    ("small-batch", ["-m", "stepscope.zoo.small_batch", "--steps", "600"], (ZOO / "_common.py", "train")),
    ("storage-latency", ["-m", "stepscope.zoo.storage_latency", "--steps", "150"], (ZOO / "_common.py", "train")),
    ("c-calls", [str(SCRIPTS / "c_calls.py"), "1500"], (SCRIPTS / "c_calls.py", "main")),
)


def loop_pattern(path: Path, function: str) -> str:
    """A regex of py-spy frames inside the training loop: the function's outermost loop whose body
    calls ``backward``/``step`` (or, for a loop without them, its first loop), by line range."""
    import ast

    tree = ast.parse(path.read_text())
    node = next(item for item in ast.walk(tree) if isinstance(item, ast.FunctionDef) and item.name == function)
    loops = [item for item in ast.walk(node) if isinstance(item, (ast.For, ast.While))]

    def trains(loop: ast.AST) -> bool:
        return any(isinstance(call, ast.Attribute) and call.attr in ("backward", "step") for call in ast.walk(loop))

    loop = next((item for item in loops if trains(item)), loops[0])
    lines = "|".join(str(line) for line in range(loop.lineno, (loop.end_lineno or loop.lineno) + 1))
    return rf"^{function} \({re.escape(str(path))}:({lines})\)$"


from stepscope.analysis.run.code_locations import function_name  # noqa: E402


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
        function = function_name(function)  # py-spy names qualnames: fold comprehensions as stepscope does
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


def record_dir_of(run_dir: Path) -> Path:
    return run_dir


def function_share(run_dir: Path, location: dict, role: str) -> float:
    """stepscope's share for the named location's whole function (all its lines), like py-spy's
    function column: of the step (main thread) or of the workers' samples."""
    from stepscope.analysis.run.code_locations import attribute_code
    from stepscope.record.store import load_record

    attribution = attribute_code(load_record(run_dir), top=1000)
    parts = [attribution.workers] if role == "worker" else list(attribution.phases)
    total = 0.0
    for part in parts:
        if part is None:
            continue
        for item in part.locations:
            if item.file == location["file"] and item.function == location["function"]:
                total += item.share_of_phase if role == "worker" else item.share_of_step
    return total


def phase_share_error(run_dir: Path) -> float:
    """Largest difference, in points, between a phase's share of the step from the samples and
    from the step timestamps (exact): the sampler's own check, whatever the reference profiler."""
    from stepscope.analysis.run.code_locations import attribute_code
    from stepscope.analysis.run.steady import steady_state
    from stepscope.record.store import load_record

    record = load_record(run_dir)
    steady = steady_state(record)
    attribution = attribute_code(record, steady.mask)
    sampled = {item.phase: item.share_of_step for item in attribution.phases}
    return max(abs(sampled.get(phase, 0.0) - share) for phase, share in steady.shares.items()) * 100


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
    shutil.rmtree(run_dir, ignore_errors=True)
    for stale in work.glob("worker.*.spy"):
        stale.unlink()
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
            # the worker's main thread (stepscope samples that one; the queue feeder and the
            # resource sharer are threads of their own)
            more = pyspy_shares(path, r"^_worker_loop \(", main_only=True)
            lines.update(more[0])
            functions.update(more[1])
            total += more[2]
        # worker samples are the loading work of the data-wait phase: compare shares of the
        # workers' samples, stepscope's being share_of_step / data-wait share
        ours = location["share_of_phase"]
    else:
        lines, functions, total = pyspy_shares(raw, loop, main_only=True)
        ours = location["share_of_step"]
    theirs_line = lines.get((location["file"], location["line"]), 0) / total if total else None
    theirs_function = functions.get((location["file"], location["function"]), 0) / total if total else None
    function_ours = function_share(record_dir_of(run_dir), location, role)
    py_top = functions.most_common(1)[0][0] if functions else None
    top = report["findings"][0] if report.get("findings") else {}
    return {"workload": name, "named": location["label"], "role": role, "phase": location["phase"],
            "stepscope": ours, "stepscope_function": function_ours, "phase_error": phase_share_error(run_dir),
            "py_spy_line": theirs_line, "py_spy_function": theirs_function,
            "py_spy_samples": total, "py_spy_top_function": f"{Path(py_top[0]).name} {py_top[1]}()" if py_top else None,
            "top_finding": top.get("title", "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", type=Path, help="keep the run directories and py-spy files here")
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("py-spy is not on PATH: pip install py-spy")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = str(args.keep) if args.keep else scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        for name, target, (path, function) in WORKLOADS:
            if args.only and name not in args.only:
                continue
            for _attempt in range(3):  # py-spy now and then reads no sample of a run: measure it again
                row = run_one(name, target, loop_pattern(path, function), Path(tmp))
                if row.get("py_spy_samples"):
                    break
            rows.append(row)
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print("| workload | named location (phase) | line: stepscope / py-spy | error | function: stepscope / py-spy "
          "| error | phase shares, samples vs timestamps | py-spy's top function |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for row in rows:
        if "error" in row:
            print(f"| {row['workload']} | {row['error']} | | | | | | |")
            continue
        line, function = row["py_spy_line"], row["py_spy_function"]
        where = "workers" if row["role"] == "worker" else row["phase"]
        print(f"| {row['workload']} | `{row['named']}` ({where}) | {row['stepscope']:.0%} / {line:.0%} | "
              f"{abs(row['stepscope'] - line) * 100:.1f} | {row['stepscope_function']:.0%} / {function:.0%} | "
              f"{abs(row['stepscope_function'] - function) * 100:.1f} | ≤ {row['phase_error']:.1f} | "
              f"{row['py_spy_top_function']} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
