"""Fault injection for multi-rank jobs: a rank of a real two-rank torchrun job (gloo, DDP) under
``stepscope run`` is killed from outside at a random step, as the OOM killer or a lost node kills it.

The single-process campaign (``fault_campaign.py``) checks what one run leaves; a job adds what the
ranks owe each other: the surviving rank, stuck in a collective with a dead peer, must end; the job's
merged report must still come (written by the last rank to finish, ``capture/job_end.py``) and name
the rank that failed first, at which step, killed by which signal; no process of the job (torchrun's
agent, the ranks, their samplers) may outlive it; the run index stays whole.

Each kill: a rank (0 or 1, in turn) and a step (uniform in the steps after the first few) drawn from
the seed; the script writes ``<monotonic> <rank> <pid> step <n>`` to a progress file before each
step, and the named rank's training process gets SIGKILL as soon as it reaches the drawn step. The
kill lands a few milliseconds after that mark: inside the step, or after its work (its sleep counts
to the next step), so the report must name the step after the mark or the one after that.

    python benchmarks/fault_jobs.py --kills 12            # ~4 min on 2 busy cores
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fault_campaign  # noqa: E402  (the one-run campaign's checks: classify, orphans, the index)

STEPS = 24
JOB = '''
import os, sys, time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
progress = open(os.environ["FAULT_PROGRESS"], "a", buffering=1)
torch.manual_seed(rank)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(int(sys.argv[1])):
    progress.write(f"{time.monotonic():.6f} {rank} {os.getpid()} step {step}\\n")
    opt.zero_grad()
    model(torch.randn(32, 64)).pow(2).mean().backward()
    opt.step()
    time.sleep(0.04)
print("rank", rank, "done")
'''


@dataclass
class JobOutcome:
    rank: int
    step: int
    outcome: str = ""  # merged / no-merged-report / broken
    failure: str = ""  # the merged report's first failure, as the summary says it
    orphans: int = 0
    index_ok: bool = True
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


class JobCampaign:
    def __init__(self, work: Path, seed: int):
        self.work = work
        (work / "single").mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(seed)
        self.script = work / "job.py"
        self.script.write_text(JOB)
        self.index = work / "index.sqlite"
        self.count = 0
        # the one-run campaign's index check (its `runs` listing and integrity check)
        self.single = fault_campaign.Campaign(work / "single", seed, 0)

    def kill_rank(self, rank: int, step: int) -> JobOutcome:
        self.count += 1
        result = JobOutcome(rank, step)
        run_dir = self.work / f"job{self.count}"
        progress = self.work / f"progress.{self.count}"
        progress.write_text("")
        token = uuid.uuid4().hex
        env = {key: value for key, value in os.environ.items() if not key.startswith("FAULT_")}
        env.update(PYTHONPATH=os.pathsep.join(filter(None, (str(fault_campaign.SRC), env.get("PYTHONPATH")))),
                   STEPSCOPE_INDEX=str(self.index), FAULT_TOKEN=token, FAULT_PROGRESS=str(progress),
                   PYTHONUNBUFFERED="1")
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                   "-m", "stepscope", "run", "--no-monitor", "--stacks-hz", "0", "-o", str(run_dir),
                   str(self.script), str(STEPS)]
        began = time.monotonic()
        err_path = self.work / f"log.{self.count}.err"
        with open(err_path, "wb") as err:
            process = subprocess.Popen(command, cwd=self.work, env=env, stdout=subprocess.DEVNULL, stderr=err,
                                       start_new_session=True)
            pid = _wait_for_step(progress, rank, step, process)
            if pid is None:
                result.problems.append(f"rank {rank} never reached step {step} (exit {process.poll()})")
            else:
                os.kill(pid, signal.SIGKILL)
            try:
                process.wait(timeout=240)
            except subprocess.TimeoutExpired:
                result.problems.append("the job did not end within 240 s of the kill")
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        stderr = err_path.read_text(errors="replace")
        left = fault_campaign._orphans(token, process.pid)
        result.orphans = len(left)
        if left:
            result.problems.append(f"{len(left)} process(es) of the job left after {fault_campaign.ORPHAN_WAIT_S:g} s: "
                                   + "; ".join(left[:3]))
        frames = re.findall(r'File "[^"]*/stepscope/[^"]*"', stderr)
        if frames:
            result.problems.append(f"a traceback shows stepscope's frames: {frames[0]}")
        report = run_dir / "report.json"
        if report.exists():
            failure = (json.loads(report.read_text()).get("job") or {}).get("failure")
            if failure is None:
                result.problems.append("the merged report names no failure")
            else:
                result.failure = (f"rank {failure['rank']} first, step {failure.get('step')}, "
                                  f"{failure.get('signal') or failure.get('how')}")
                # the kill lands a few ms after the mark for step index k: inside step k+1 (1-based), or
                # once that step's work is done, in the time before the next (step k+2)
                if failure["rank"] != rank or failure.get("signal") != "SIGKILL" or \
                        failure.get("step") not in (step + 1, step + 2):
                    result.problems.append(f"the failure named is not the kill: {failure}")
            result.outcome = "merged"
        else:
            result.outcome = "no-merged-report"
            result.problems.append("no merged report")
        kind, detail = fault_campaign.classify(run_dir)
        if kind == "broken":
            result.problems.append(detail)
        self.single.index = self.index
        result.index_ok, problem = self.single.check_index()
        if not result.index_ok:
            result.problems.append(problem)
        if result.problems:
            result.outcome = "broken"
        result.seconds = time.monotonic() - began
        return result


def _wait_for_step(progress: Path, rank: int, step: int, process: subprocess.Popen,
                   timeout: float = 180) -> int | None:
    """The pid of ``rank``'s training process once it has written its mark for ``step``."""
    wanted = f" {rank} "
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        for line in progress.read_text().splitlines():
            parts = line.split()
            if len(parts) == 5 and f" {parts[1]} " == wanted and int(parts[4]) == step:
                return int(parts[2])
        time.sleep(0.005)
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=12, help="ranks killed, one job each (default 12)")
    parser.add_argument("--seed", type=int, default=33)
    parser.add_argument("--work", type=Path, help="working directory (default: a new temporary one)")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    args = parser.parse_args(argv)
    if args.kills < 1:
        parser.error("--kills must be at least 1")
    if args.work is not None and args.work.exists() and not args.work.is_dir():
        parser.error(f"--work {args.work}: not a directory; pass a directory (it is created when missing)")
    work = args.work or Path(tempfile.mkdtemp(prefix="fault-jobs-"))
    campaign = JobCampaign(work, args.seed)
    started = time.monotonic()
    results = []
    for number in range(args.kills):
        rank, step = number % 2, campaign.rng.randint(2, STEPS - 3)
        item = campaign.kill_rank(rank, step)
        results.append(item)
        flag = "  PROBLEM: " + "; ".join(item.problems) if item.problems else ""
        print(f"[{number + 1}] rank {rank} at step {step:2d}: {item.outcome:16} {item.seconds:5.1f} s  "
              f"{item.failure}{flag}", flush=True)
    merged = sum(item.outcome == "merged" for item in results)
    print(f"{len(results)} ranks killed in {time.monotonic() - started:.0f} s: {merged} merged reports naming "
          f"the killed rank, {sum(item.outcome == 'broken' for item in results)} broken, "
          f"{sum(item.orphans for item in results)} processes left, "
          f"{sum(not item.index_ok for item in results)} damaged indexes; work directory {work}")
    if args.json:
        args.json.write_text(json.dumps([item.__dict__ for item in results], indent=1))
    return 1 if any(item.problems for item in results) else 0


if __name__ == "__main__":
    sys.exit(main())
