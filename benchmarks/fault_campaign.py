"""Fault-injection campaign: ``stepscope run`` killed and failed on purpose, then checked.

After SQLite's crash and I/O-error tests: a real training script (torch, a DataLoader with two
worker processes, the sampler, a torch.profiler window, ``--html``, the run index) is run under
``stepscope run`` again and again, and each time something goes wrong on purpose:

- **SIGKILL at random instants** of the run's life — start-up, the first step, steady steps, the
  profiler window, later steps, and the finish (record, sampler, report, index, HTML, exit) — to
  the whole process tree (training process, sampler, workers) or to the training process only.
  Each phase's instants are placed from the run's own progress (the step it reached), so they land
  in that phase on a loaded machine too.
- **SIGKILL inside each write** (record, checkpoint, samples, trace, report.json, HTML, index):
  half of the bytes written (``mid``) or all of them, synced, just before the rename or after the
  index's commit (``full``), through ``benchmarks/fault_hook/sitecustomize.py``.
- **ENOSPC and EIO at each write site**: the write fails half-way as a full or failing disk does.
- **A real full disk**: the run directory on a tmpfs of 8 to 192 KiB, so the writes that no longer
  fit fail in the order the run makes them, torch's own trace export included (needs root to mount;
  skipped, saying so, without it).

After each kill: no process of the run is left (the sampler and the DataLoader workers of a
killed training process must end on their own within 15 s); the run directory is absent, or
``stepscope report DIR`` gives a report or one ``stepscope: error:`` line with exit 2 (never a
traceback), and every file under a final name is whole (report.json and traces parse, report.html
ends); the run index passes SQLite's integrity check, still holds every earlier run and lists
with ``stepscope runs``; every ``--follow-every``-th instant, a following run into the same
directory works (without ``--force`` when the killed run left nothing to protect, else after
the one-line refusal, with ``--force``). After each failed write: the script's exit status and
stdout are those of the script alone, stepscope says one line naming what it could not write and
why, and no half-written file is left under a final name.

Outcomes: ``clean`` (a finished run: record and report.json), ``readable-partial`` (reported from
the killed run's last checkpoint, or a one-line error saying what is missing), ``absent`` (no run
directory), ``broken`` (anything else: a traceback, a file that does not parse, an index that fails
its check, a process left behind).

    python benchmarks/fault_campaign.py                 # the full campaign (about 45 min on 2 busy cores)
    python benchmarks/fault_campaign.py --kills 20 --follow-every 5 --no-sites   # a quick look
    python benchmarks/fault_campaign.py --kills 0 --no-sites                     # the full disks alone
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOOK_DIR = ROOT / "benchmarks" / "fault_hook"
STEPSCOPE = [sys.executable, "-m", "stepscope"]
STEPS = 16
#: The stepscope source tree the runs import (--src: a frozen copy, while the checkout changes).
SRC = Path(os.environ.get("FAULT_CAMPAIGN_SRC") or ROOT / "src")
ORPHAN_WAIT_S = 15.0

TRAIN = '''
import os, sys, time, torch
from torch.utils.data import DataLoader, TensorDataset

progress = open(os.environ["FAULT_PROGRESS"], "a", buffering=1)
torch.manual_seed(0)
steps = int(sys.argv[1])
data = TensorDataset(torch.randn(steps * 16, 64), torch.randint(0, 4, (steps * 16,)))
loader = DataLoader(data, batch_size=16, num_workers=2)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(loader):
    progress.write(f"{time.monotonic():.6f} step {step}\\n")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.03)
progress.write(f"{time.monotonic():.6f} done\\n")
print(f"trained {steps} steps, last loss {loss.item():.4f}")
'''


def _by_hand(script: str) -> str:
    """``script`` with its weights updated by hand instead of by ``torch.optim`` (whose first
    optimizer imports ``torch._dynamo``, ~1 s of CPU a process): the same data, model, steps,
    progress marks and last line, for the tests, which look at what the run writes."""
    edits = (("opt = torch.optim.SGD(model.parameters(), lr=0.01)\n", ""),
             ("    opt.zero_grad()\n", "    model.zero_grad()\n"),
             ("    opt.step()\n", "    with torch.no_grad():\n        for parameter in model.parameters():\n"
                                 "            parameter.add_(parameter.grad, alpha=-0.01)\n"))
    for old, new in edits:
        assert script.count(old) == 1, old
        script = script.replace(old, new)
    return script


TRAIN_BY_HAND = _by_hand(TRAIN)

#: Random-instant phases: (name, the progress mark to wait for, steps to choose it among).
PHASES = ("startup", "first_step", "steady", "profiler_window", "late_steps", "finish")
SITES = ("checkpoint", "samples", "trace", "record", "report", "index", "html")
ERRNOS = ("ENOSPC", "EIO")
#: Sizes of the real file systems (tmpfs, KiB) a run fills: from nothing fitting but the lock to
#: everything but the profiler's trace (~140 KiB here).
FULL_DISK_KB = (8, 16, 24, 32, 48, 64, 96, 128, 192)
PAGE = 4096  # tmpfs counts whole pages
STRERROR = {"ENOSPC": ("No space left on device", "database or disk is full"),
            "EIO": ("Input/output error", "disk I/O error")}


@dataclass
class Outcome:
    """One instant (or one failed write) and what it left."""

    fault: str  # "kill-tree", "kill-script", "ENOSPC", "EIO"
    where: str  # a phase, or a write site and when
    outcome: str = ""  # clean / readable-partial / absent / broken
    detail: str = ""
    orphans: int = 0
    index_ok: bool = True
    follow: str = ""  # "", "ok", "failed: ..."
    killed: bool = True
    seconds: float = 0.0
    run_dir: str = ""
    problems: list[str] = field(default_factory=list)


class Campaign:
    #: seconds to the first checkpoint of the record (STEPSCOPE_CHECKPOINT_S): well inside the steps
    checkpoint_s = "0.5"

    def __init__(self, work: Path, seed: int, follow_every: int):
        self.work = work
        self.rng = random.Random(seed)
        self.follow_every = follow_every
        self.script = work / "train.py"
        self.script.write_text(TRAIN)
        self.index = work / "index.sqlite"
        self.count = 0
        self.instants = 0
        self.indexed: set[str] = set()
        self.baseline: dict[str, Any] = {}
        #: What starts a run's process (``subprocess.Popen``'s signature; the tests fork it from a warm
        #: interpreter).
        self.popen: Callable[..., subprocess.Popen] = subprocess.Popen

    # -- running -------------------------------------------------------------------------------
    def env(self, token: str, progress: Path, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("FAULT_")}
        env.update(PYTHONPATH=os.pathsep.join(filter(None, (str(HOOK_DIR), str(SRC), env.get("PYTHONPATH")))),
                   STEPSCOPE_INDEX=str(self.index), STEPSCOPE_CHECKPOINT_S=self.checkpoint_s, FAULT_TOKEN=token,
                   FAULT_PROGRESS=str(progress), PYTHONUNBUFFERED="1", **extra)
        return env

    def start(self, run_dir: Path, steps: int = STEPS, force: bool = False,
              **extra: str) -> tuple[subprocess.Popen, Path, str]:
        self.count += 1
        token = uuid.uuid4().hex
        progress = self.work / f"progress.{self.count}"
        progress.write_text("")
        logs = self.work / f"log.{self.count}"
        command = [*STEPSCOPE, "run", "--trace", "--html", "-o", str(run_dir), *(["--force"] if force else []),
                   str(self.script), str(steps)]
        with open(f"{logs}.out", "wb") as out, open(f"{logs}.err", "wb") as err:
            process = self.popen(command, cwd=self.work, env=self.env(token, progress, **extra), stdout=out,
                                 stderr=err, start_new_session=True)
        process.logs = logs  # type: ignore[attr-defined]
        return process, progress, token

    def finish(self, process: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
        code = process.wait(timeout=timeout)
        logs = process.logs  # type: ignore[attr-defined]
        return code, Path(f"{logs}.out").read_text(errors="replace"), Path(f"{logs}.err").read_text(errors="replace")

    # -- baseline ------------------------------------------------------------------------------
    def measure_script(self) -> None:
        """The script alone: its stdout and exit status, which a failed write must not change."""
        progress = self.work / "progress.plain"
        plain = subprocess.run([sys.executable, str(self.script), str(STEPS)], cwd=self.work, capture_output=True,
                               env=self.env("plain", progress), timeout=300)
        self.baseline["stdout"], self.baseline["code"] = plain.stdout.decode(), plain.returncode

    def measure_baseline(self) -> None:
        """The script alone, and a clean run's timeline (where the random instants' phases lie)."""
        self.measure_script()
        started = time.monotonic()
        run_dir = self.work / "baseline"
        process, progress, _ = self.start(run_dir)
        code, _, err = self.finish(process)
        ended = time.monotonic()
        if code != 0:
            raise SystemExit(f"the baseline run failed (exit {code}): {err[-2000:]}")
        marks = _marks(progress)
        self.baseline.update(start_s=marks["step 0"] - started, finish_s=ended - marks["done"],
                             step_s=(marks["done"] - marks["step 1"]) / (STEPS - 1), total_s=ended - started)
        self.indexed.add(str(run_dir.resolve()))

    # -- one instant ---------------------------------------------------------------------------
    def kill_at_phase(self, phase: str, scope: str) -> Outcome:
        result = Outcome(f"kill-{scope}", phase)
        run_dir = self.work / f"run{self.count + 1}"
        began = time.monotonic()
        process, progress, token = self.start(run_dir)
        base = self.baseline
        if phase == "startup":
            _sleep_until_exit(process, self.rng.uniform(0.0, base["start_s"]))
        else:
            mark, delay = {
                "first_step": ("step 0", self.rng.uniform(0, base["step_s"])),
                "steady": (f"step {self.rng.randint(1, 4)}", self.rng.uniform(0, base["step_s"])),
                "profiler_window": (f"step {self.rng.randint(5, 8)}", self.rng.uniform(0, base["step_s"])),
                "late_steps": (f"step {self.rng.randint(9, STEPS - 1)}", self.rng.uniform(0, base["step_s"])),
                "finish": ("done", self.rng.uniform(0, base["finish_s"])),
            }[phase]
            _wait_for_mark(progress, mark, process)
            _sleep_until_exit(process, delay)
        result.killed = _kill(process, scope)
        return self.check(result, process, run_dir, token, began)

    def kill_in_write(self, site: str, when: str, scope: str) -> Outcome:
        result = Outcome(f"kill-{scope}", f"{site} ({when})")
        run_dir = self.work / f"run{self.count + 1}"
        began = time.monotonic()
        nth = "3" if site == "samples" else "1"
        process, _, token = self.start(run_dir, FAULT_KILL=f"{site}:{when}@{nth}", FAULT_KILL_SCOPE=scope)
        process.wait(timeout=300)
        result.killed = process.returncode == -signal.SIGKILL
        if not result.killed:
            result.problems.append(f"the write site was not reached (exit {process.returncode})")
        return self.check(result, process, run_dir, token, began)

    def fail_write(self, site: str, errno_name: str) -> Outcome:
        result = Outcome(errno_name, site, killed=False)
        run_dir = self.work / f"run{self.count + 1}"
        began = time.monotonic()
        nth = "3" if site == "samples" else "1"
        hits = self.work / f"hits.{self.count + 1}"
        process, _, token = self.start(run_dir, FAULT_INJECT=f"{site}:{errno_name}@{nth}", FAULT_LOG=str(hits))
        code, out, err = self.finish(process)
        if f" {site} begin" not in (hits.read_text() if hits.exists() else ""):
            result.problems.append(f"the write site was not reached (exit {code})")
            return self.check(result, process, run_dir, token, began)
        if code != self.baseline["code"] or out != self.baseline["stdout"]:
            result.problems.append(f"the script's own run changed: exit {code}, stdout {out[-200:]!r}")
        # stepscope's own lines (the summary's list of the run's warnings repeats them, indented)
        said = [line for line in err.splitlines()
                if line.startswith("stepscope") and any(text in line for text in STRERROR[errno_name])]
        if len(said) != 1:
            result.problems.append(f"{len(said)} lines name the failed write: {said[:3]}")
        elif not _names_site(said[0], site):
            result.problems.append(f"the warning does not name what was not written: {said[0]}")
        result.detail = said[0] if said else ""
        return self.check(result, process, run_dir, token, began, wrote_index=site != "index")

    def disk_for_all_but_the_trace_kb(self) -> int:
        """The size of a disk (KiB) on which a clean run's record, checkpoint, samples, roles, lock
        and report.json fit with room to spare (16 KiB), but not the profiler's trace as well, on
        this machine (the record and samples grow with its cores). Needs :meth:`measure_baseline`."""
        run_dir = self.work / "baseline"
        pages = {path.relative_to(run_dir).as_posix(): -(-path.stat().st_size // PAGE) * PAGE // 1024
                 for path in run_dir.rglob("*") if path.is_file()}
        trace_kb = sum(kb for name, kb in pages.items() if name.startswith("traces/"))
        need_kb = sum(kb for name, kb in pages.items() if not name.startswith("traces/") and name != "report.html")
        need_kb += pages["record.rank0.json.gz"]  # the checkpoint stays until the record is in place
        need_kb += PAGE // 1024 * ("rank0.lock" not in pages)  # the lock: held while the run lives, then removed
        size_kb = need_kb + 16
        if size_kb >= need_kb + trace_kb:
            raise SystemExit(f"the trace ({trace_kb} KiB) is too small to fill a {size_kb} KiB disk")
        return size_kb

    def full_disk(self, size_kb: int) -> Outcome | None:
        """A run into a real file system of ``size_kb`` KiB (a tmpfs) that fills during the run:
        whichever writes no longer fit fail as a full disk fails them, in the order the run makes
        them. None where a tmpfs cannot be mounted here (it needs root)."""
        mount = self.work / f"full{self.count + 1}"
        mount.mkdir()
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(mount)],
                                 capture_output=True)
        if mounted.returncode != 0:
            mount.rmdir()
            return None
        result = Outcome("full disk", f"{size_kb} KiB", killed=False)
        try:
            run_dir = mount / "run"
            began = time.monotonic()
            process, _, token = self.start(run_dir)
            code, out, err = self.finish(process)
            if code != self.baseline["code"] or out != self.baseline["stdout"]:
                result.problems.append(f"the script's own run changed: exit {code}, stdout {out[-200:]!r}")
            said = [line for line in err.splitlines()
                    if line.startswith("stepscope") and "No space left on device" in line]
            unnamed = [line for line in said if str(run_dir) not in line and "samples" not in line]
            if unnamed:
                result.problems.append(f"a line does not name what was not written: {unnamed[0]}")
            misread = [line for line in err.splitlines() if line.startswith("stepscope") and "No such file" in line]
            if misread:  # the disk was full: a missing file is the wrong cause
                result.problems.append(f"a line gives the wrong cause: {misread[0]}")
            if not run_dir.is_dir():
                result.problems.append("no run directory")
                return self.check(result, process, run_dir, token, began, wrote_index=False)
            left = [path.name for path in (*run_dir.iterdir(), *(run_dir / "traces").glob("*"))
                    if path.name.endswith(".tmp")]
            if left:
                result.problems.append(f"temporaries left on the full disk: {left}")
            written = sorted(name for name in os.listdir(run_dir) if _is_data(name) and name != "traces")
            written += [f"traces/{path.name}" for path in (run_dir / "traces").glob("*.json")]
            result = self.check(result, process, run_dir, token, began,
                                wrote_index=(run_dir / "report.json").exists())
            result.detail = f"{len(said)} line(s) name a write that failed; written: {', '.join(written) or 'nothing'}"
            return result
        finally:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)

    # -- checks --------------------------------------------------------------------------------
    def check(self, result: Outcome, process: subprocess.Popen, run_dir: Path, token: str, began: float,
              wrote_index: bool | None = None) -> Outcome:
        process.wait(timeout=300)
        result.run_dir = str(run_dir)
        left = _orphans(token, process.pid)
        result.orphans = len(left)
        if left:
            result.problems.append(f"{len(left)} process(es) of the run left after {ORPHAN_WAIT_S:g} s: "
                                   + "; ".join(left[:3]))
        result.outcome, detail = classify(run_dir)
        result.detail = result.detail or detail
        if result.outcome == "broken":
            result.problems.append(detail)
        ok, problem = self.check_index()
        result.index_ok = ok
        if not ok:
            result.problems.append(problem)
        if result.outcome == "clean" and (wrote_index if wrote_index is not None else result.killed is False):
            self.indexed.add(str(run_dir.resolve()))
        self.instants += 1
        if self.follow_every and self.instants % self.follow_every == 0 and result.fault.startswith("kill"):
            result.follow = self.follow(run_dir)
            if result.follow != "ok":
                result.problems.append(f"following run: {result.follow}")
        if any(not problem.startswith("the write site was not reached") for problem in result.problems):
            result.outcome = "broken"  # a process left, a damaged index, a failed following run or warning
        result.seconds = time.monotonic() - began
        return result

    def check_index(self) -> tuple[bool, str]:
        if not self.index.exists():
            return True, ""
        try:
            with sqlite3.connect(f"file:{self.index}?mode=ro", uri=True) as connection:
                verdict = connection.execute("PRAGMA integrity_check").fetchone()[0]
                rows = {row[0] for row in connection.execute("SELECT run_dir FROM runs")}
            connection.close()
        except sqlite3.Error as exc:
            return False, f"index: {exc}"
        if verdict != "ok":
            return False, f"index integrity_check: {verdict}"
        lost = self.indexed - rows
        if lost:
            return False, f"index lost {len(lost)} earlier run(s)"
        listed = subprocess.run([*STEPSCOPE, "runs"], capture_output=True, env=self.env("runs", self.work / "x"),
                                timeout=120)
        if listed.returncode != 0:
            return False, f"stepscope runs: exit {listed.returncode}: {listed.stderr.decode()[-300:]}"
        return True, ""

    def follow(self, run_dir: Path) -> str:
        """A following run into the same directory: without --force, then (refused because the
        killed run left files to protect) with it."""
        protect = run_dir.is_dir() and any(_is_data(name) for name in os.listdir(run_dir))
        process, _, token = self.start(run_dir, steps=10)
        code, _, err = self.finish(process)
        lines = [line for line in err.splitlines() if line.startswith("stepscope: error:")]
        if code == 2 and protect and len(lines) == 1 and "--force" in lines[0]:
            process, _, token = self.start(run_dir, steps=10, force=True)
            code, _, err = self.finish(process)
        elif code == 2:
            return f"refused without a run to protect: {err.strip()[-200:]}"
        if _orphans(token, process.pid):
            return "left processes"
        kind, detail = classify(run_dir)
        if code != 0 or kind != "clean":
            return f"exit {code}, {kind}: {detail or err.strip()[-200:]}"
        self.indexed.add(str(run_dir.resolve()))
        return "ok"


# -- helpers -----------------------------------------------------------------------------------
def _marks(progress: Path) -> dict[str, float]:
    marks: dict[str, float] = {}
    for line in progress.read_text().splitlines():
        stamp, _, mark = line.partition(" ")
        marks.setdefault(mark, float(stamp))
    return marks


def _wait_for_mark(progress: Path, mark: str, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if mark in progress.read_text():
            return
        time.sleep(0.005)


def _sleep_until_exit(process: subprocess.Popen, seconds: float) -> None:
    try:
        process.wait(timeout=max(seconds, 0.0))
    except subprocess.TimeoutExpired:
        pass


def _tree(pid: int) -> list[int]:
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def _kill(process: subprocess.Popen, scope: str) -> bool:
    """SIGKILL the run (``tree``: with its sampler and workers); False when it had already ended."""
    if process.poll() is not None:
        return False
    victims = _tree(process.pid) if scope == "tree" else []
    for pid in [process.pid, *victims]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    process.wait(timeout=60)
    return process.returncode == -signal.SIGKILL


def _run_pids(token: str, session: int) -> list[int]:
    """The live processes of a run: those started with its token in their environment, and those
    of its session (the run's process leads one: a process forked without an ``exec`` shows the
    environment it was started with, which may not hold the token); zombies are not live."""
    found = []
    needle = f"FAULT_TOKEN={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                tokened = needle in handle.read()
            with open(f"/proc/{entry}/stat", "rb") as handle:
                state, _ppid, _group, sid = handle.read().rsplit(b")", 1)[1].split()[:4]
        except (OSError, IndexError, ValueError):  # gone meanwhile, or a stat line cut short
            continue
        if (tokened or int(sid) == session) and state != b"Z":
            found.append(int(entry))
    return found


def _orphans(token: str, session: int) -> list[str]:
    """Processes of the run still alive ``ORPHAN_WAIT_S`` after it ended (then killed): each as
    ``PID COMMAND LINE``."""
    deadline = time.monotonic() + ORPHAN_WAIT_S
    while (left := _run_pids(token, session)) and time.monotonic() < deadline:
        time.sleep(0.1)
    named = [f"{pid} {_command_line(pid)}" for pid in left]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return named


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "(gone)"


def _is_data(name: str) -> bool:
    return not (name.endswith(".lock") or name.endswith(".tmp"))


def _names_site(line: str, site: str) -> bool:
    words = {"record": "record.rank0.json.gz", "checkpoint": "checkpoint", "samples": "samples",
             "trace": "trace", "report": "report.json", "html": "report.html", "index": "run index"}
    return words[site] in line


def classify(run_dir: Path) -> tuple[str, str]:
    """(clean | readable-partial | absent | broken, why) for what a run left in ``run_dir``."""
    if not run_dir.exists():
        return "absent", ""
    for problem in _damaged_files(run_dir):
        return "broken", problem
    shown = subprocess.run([*STEPSCOPE, "report", str(run_dir)], capture_output=True, timeout=300,
                           env={key: value for key, value in os.environ.items() if not key.startswith("FAULT_")}
                           | {"PYTHONPATH": str(SRC), "STEPSCOPE_INDEX": "off"})
    err = shown.stderr.decode(errors="replace").strip()
    if "Traceback" in err or shown.returncode not in (0, 2):
        return "broken", f"stepscope report: exit {shown.returncode}: {err[-300:]}"
    if shown.returncode == 2:
        if len(err.splitlines()) != 1 or not err.startswith("stepscope: error:"):
            return "broken", f"stepscope report: exit 2 with {err[-300:]!r}"
        return "readable-partial", err
    if (run_dir / "record.rank0.json.gz").exists() and (run_dir / "report.json").exists():
        return "clean", ""
    return "readable-partial", "reported from " + ", ".join(sorted(name for name in os.listdir(run_dir)
                                                                 if name.startswith(("record", "report"))))


def _damaged_files(run_dir: Path) -> list[str]:
    """Files under a final name that are not whole."""
    problems = []
    for path in [*run_dir.iterdir(), *(run_dir / "traces").glob("*")]:
        name = path.name
        try:
            if name.endswith(".json") and not name.startswith("."):
                json.loads(path.read_bytes())
            elif name.endswith(".json.gz"):
                json.loads(gzip.decompress(path.read_bytes()))
            elif name == "report.html" and not path.read_bytes().rstrip().endswith(b"</html>"):
                problems.append(f"{name} is cut short")
        except (ValueError, OSError, EOFError) as exc:
            problems.append(f"{name} does not parse: {type(exc).__name__}: {str(exc)[:100]}")
    return problems


def summarize(results: list[Outcome]) -> list[dict[str, Any]]:
    rows = []
    groups: dict[tuple[str, str], list[Outcome]] = {}
    for item in results:
        family = ("random instant" if item.where in PHASES else "inside a write") if item.fault.startswith("kill") \
            else "failed write"
        groups.setdefault((item.fault, family), []).append(item)
    for (fault, family), items in groups.items():
        counts = Counter(item.outcome for item in items)
        rows.append({"fault": fault, "instants": family, "tried": len(items),
                     "where": dict(Counter(item.where for item in items)),
                     **{kind: counts.get(kind, 0) for kind in ("clean", "readable-partial", "absent", "broken")},
                     "missed": sum(1 for item in items if item.fault.startswith("kill") and not item.killed),
                     "orphans": sum(item.orphans for item in items),
                     "index_damaged": sum(1 for item in items if not item.index_ok),
                     "follow_ups": sum(1 for item in items if item.follow),
                     "follow_ups_ok": sum(1 for item in items if item.follow == "ok")})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| fault | instants | tried | clean | readable-partial | absent | broken | orphans | index damaged "
             "| following runs ok |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['fault']} | {row['instants']} | {row['tried']} | {row['clean']} | "
                     f"{row['readable-partial']} | {row['absent']} | {row['broken']} | {row['orphans']} | "
                     f"{row['index_damaged']} | {row['follow_ups_ok']}/{row['follow_ups']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    global SRC
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=100, help="random SIGKILL instants (default 100)")
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--follow-every", type=int, default=4, help="a following run after every N-th instant")
    parser.add_argument("--no-sites", action="store_true", help="skip the kills inside writes and the failed writes")
    parser.add_argument("--no-site-kills", action="store_true", help="skip the kills inside writes")
    parser.add_argument("--no-full-disk", action="store_true", help="skip the runs into a small tmpfs")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    parser.add_argument("--work", type=Path, help="working directory (default: a new temporary one)")
    parser.add_argument("--src", type=Path, default=SRC,
                        help="the stepscope source tree to run (default: this checkout's)")
    args = parser.parse_args(argv)
    SRC = args.src.resolve()
    work = args.work or Path(tempfile.mkdtemp(prefix="fault-campaign-"))
    work.mkdir(parents=True, exist_ok=True)
    campaign = Campaign(work, args.seed, args.follow_every)
    started = time.monotonic()
    campaign.measure_baseline()
    print(f"baseline: start-up {campaign.baseline['start_s']:.2f} s, step {campaign.baseline['step_s'] * 1e3:.0f} ms, "
          f"finish {campaign.baseline['finish_s']:.2f} s, run {campaign.baseline['total_s']:.1f} s", flush=True)
    results: list[Outcome] = []

    def keep(item: Outcome) -> None:
        results.append(item)
        flag = "  PROBLEM: " + "; ".join(item.problems) if item.problems else ""
        missed = " (it ended first)" if item.fault.startswith("kill") and not item.killed else ""
        print(f"[{len(results)}] {item.fault:11} {item.where:22} {item.outcome:16} {item.seconds:5.1f} s{missed}"
              f"{' follow=' + item.follow if item.follow else ''}{flag}  {item.detail[:110]}", flush=True)

    for number in range(args.kills):
        keep(campaign.kill_at_phase(PHASES[number % len(PHASES)], ("tree", "script")[(number // len(PHASES)) % 2]))
    if not args.no_sites:
        for site in SITES if not args.no_site_kills else ():
            for when in ("mid", "full"):
                for scope in ("tree", "script"):
                    keep(campaign.kill_in_write(site, when, scope))
        for site in SITES:
            for name in ERRNOS:
                keep(campaign.fail_write(site, name))
    for size_kb in FULL_DISK_KB if not args.no_full_disk else ():
        outcome = campaign.full_disk(size_kb)
        if outcome is None:
            print("full disk: no tmpfs could be mounted here (it needs root): skipped", flush=True)
            break
        keep(outcome)
    rows = summarize(results)
    print(table(rows))
    print(f"{len(results)} faults in {time.monotonic() - started:.0f} s; work directory {work}")
    if args.json:
        args.json.write_text(json.dumps({"baseline": campaign.baseline, "rows": rows,
                                         "results": [item.__dict__ for item in results]}, indent=1))
    return 1 if any(item.problems for item in results) else 0


if __name__ == "__main__":
    sys.exit(main())
