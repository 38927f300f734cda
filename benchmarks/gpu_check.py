"""One command that exercises every CUDA path of stepscope and prints pass/fail per check.

    python benchmarks/gpu_check.py                 # on a machine with a GPU: every check on CUDA
    python benchmarks/gpu_check.py --device cpu    # the same workloads, smaller, on the CPU (the test suite runs this)
    python benchmarks/gpu_check.py --keep DIR      # keep the scripts and run directories in DIR

Each check runs a small training script (written to a temporary directory) under `stepscope run`
as a user would, then reads the run directory back:

- ``cuda-event-timing``: phase boundaries become CUDA events once the script uses CUDA; the record
  says ``timing: cuda`` and the steady steps carry device times (``device_ns``) no longer than their
  wall time;
- ``nvml-sampling``: the sidecar sampled the GPU through NVML (utilisation and memory series);
- ``mfu-dtype``: the FLOP-counted step saw the dtype that ran (bf16 under autocast, fp32 without)
  and MFU is computed against the detected device's peak for that dtype, within (0, 1];
- ``sync-and-pinned-memory``: a step that calls ``.item()`` and copies pageable host tensors is
  diagnosed by the host-device sync rule from its ``--trace`` window, with the ``pin_memory``
  prescription;
- ``pageable-copy-without-trace``: without a trace, the FLOP-counted step records the script's
  copy of pageable host tensors to the device at its line (bytes, pinned or not, its time), and the
  line named outside the model gets the pinned-memory prescription, not "move it out of the step";
- ``trace-window``: ``--trace`` wrote one torch.profiler window, left its steps out of the statistics
  and fed its analysis (with kernels on a GPU) to the diagnosis;
- ``input-bound-on-device``: the zoo's planted input bottleneck, moved to the device, is still the
  top finding.

On ``--device cpu`` the CUDA-only checks say SKIP with the reason and the rest run on the CPU, so
the script cannot rot on machines without a GPU. Exit status: 1 when any check FAILs. The whole
run stays under 5 minutes on one GPU (each script runs a few dozen steps).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO_SRC = Path(__file__).resolve().parents[1] / "src"
#: Per script run, seconds (a GPU run with the profiler window takes well under a minute).
RUN_TIMEOUT_S = 240

TRAIN = """
import sys
import torch

device = sys.argv[1]
dtype = sys.argv[2]
steps = int(sys.argv[3])
width = 1024 if device.startswith("cuda") else 256      # on the CPU, a smaller model: the same checks
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                            torch.nn.ReLU(), torch.nn.Linear(width, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [torch.randn(256, 1024) for _ in range(8)]
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(steps * 64, width)),
                                     batch_size=64)
for step, (batch,) in enumerate(loader):
    batch = batch.to(device)
    opt.zero_grad(set_to_none=True)
    with torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=dtype == "bf16"):
        out = model(batch)
    out.float().pow(2).mean().backward()
    opt.step()
print("done", step + 1)
"""

SYNC = """
import sys
import torch

device = sys.argv[1]
size = 4096 if device.startswith("cuda") else 256
torch.manual_seed(0)
model = torch.nn.Linear(size, size).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
host = [torch.randn(512, size) for _ in range(4)]      # pageable host memory
losses = []
for step in range(30):
    batch = host[step % 4].to(device)                    # a synchronous copy from pageable memory
    opt.zero_grad(set_to_none=True)
    loss = model(batch).pow(2).mean()
    loss.backward()
    opt.step()
    losses.append(loss.item())                           # a host sync every step
print("done", len(losses))
"""

COPY = """
import sys
import torch

device = sys.argv[1]
cuda = device.startswith("cuda")
target = device if cuda else "meta"                     # on the CPU, a copy that costs nothing
size = 2048 if cuda else 256
torch.manual_seed(0)
model = torch.nn.Linear(size, size).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
host = [torch.randn(size, size) for _ in range(2)]      # pageable host memory
for step in range(40):
    batch = host[step % 2].to(target)                   # COPY LINE
    inputs = batch if cuda else host[step % 2]
    opt.zero_grad(set_to_none=True)
    model(inputs).pow(2).mean().backward()
    opt.step()
print("done")
"""

INPUT = """
import sys
import numpy as np
import torch

device = sys.argv[1]
values = 30_000 if device.startswith("cuda") else 10_000  # on the CPU, still many times the model's step


class Augmented(torch.utils.data.Dataset):
    def __len__(self):
        return 40 * 8

    def __getitem__(self, index):
        raw = np.random.default_rng(index).standard_normal(values)
        for _ in range(3):
            raw = np.sort(raw)[::-1] * 0.999
        features = torch.from_numpy(raw[:64].astype(np.float32))
        return features, features[:1]


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for inputs, targets in torch.utils.data.DataLoader(Augmented(), batch_size=8, num_workers=0):
    inputs, targets = inputs.to(device), targets.to(device)
    opt.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(inputs), targets).backward()
    opt.step()
print("done")
"""


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # "PASS" | "FAIL" | "SKIP"
    detail: str


class Runner:
    """Writes the scripts once and runs them under `stepscope run` into fresh run directories."""

    def __init__(self, work: Path, device: str):
        self.work = work
        self.device = device
        self.cuda = device.startswith("cuda")
        for name, text in (("train.py", TRAIN), ("sync.py", SYNC), ("pageable.py", COPY), ("input.py", INPUT)):
            (work / name).write_text(textwrap.dedent(text), encoding="utf-8")
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = str(REPO_SRC) + os.pathsep + self.env.get("PYTHONPATH", "")
        self.runs = 0
        self._done: dict[tuple[str, tuple[str, ...], tuple[str, ...]], tuple[Path, dict, dict]] = {}

    def run(self, script: str, *args: str, options: tuple[str, ...] = ()) -> tuple[Path, dict, dict]:
        """Run ``script args`` under capture; returns (run dir, report.json, the record document).
        Checks that need the same run share it (each only reads it)."""
        key = (script, args, options)
        if key not in self._done:
            self._done[key] = self._run(script, *args, options=options)
        return self._done[key]

    def _run(self, script: str, *args: str, options: tuple[str, ...] = ()) -> tuple[Path, dict, dict]:
        self.runs += 1
        out = self.work / f"run{self.runs}"
        command = [sys.executable, "-m", "stepscope", "run", "--no-summary", "-o", str(out), *options,
                   script, *args]
        proc = subprocess.run(command, cwd=self.work, env=self.env, capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)
        if proc.returncode != 0:
            raise AssertionError(f"`stepscope run {script}` exited {proc.returncode}: {proc.stderr[-800:]}")
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
        sys.path.insert(0, str(REPO_SRC))
        from stepscope.record.store import load_record

        return out, report, {"record": load_record(out)}


def check_cuda_event_timing(runner: Runner) -> str:
    _, report, loaded = runner.run("train.py", runner.device, "fp32", "24")
    record = loaded["record"]
    if not runner.cuda:
        assert record.meta.timing == "cpu" and not record.steps.has_device_time, "device times on a CPU run"
        raise Skip("no CUDA device: host timing checked instead (timing=cpu, no device columns)")
    assert record.meta.timing == "cuda", f"timing is {record.meta.timing!r}, expected 'cuda'"
    steady = [index for index in range(len(record.steps)) if index not in report["summary"]["steps"]["excluded"]][2:]
    device = record.steps.device_ns[steady]
    wall = record.steps.duration_ns[steady]
    assert (device > 0).all(), f"{int((device <= 0).sum())} steady steps without a device time"
    assert (device <= wall * 1.05 + 200_000).all(), "a device time longer than its step's wall time"
    return f"{len(steady)} steady steps with CUDA-event device times (median {int(sorted(device)[len(device) // 2]) / 1e6:.2f} ms)"


def check_nvml_sampling(runner: Runner) -> str:
    out, report, loaded = runner.run("train.py", runner.device, "fp32", "24")
    samples = loaded["record"].samples
    if not runner.cuda:
        assert report["signals"] is not None, "no sampler signals"
        raise Skip("no CUDA device: the CPU sampler was checked instead")
    assert samples is not None, "no samples file"
    util = samples["gpu_util"]
    memory = samples["gpu_mem_used_bytes"]
    assert util.shape[1] >= 1 and (util >= 0).any(), "NVML gave no GPU utilisation"
    assert (memory > 0).any(), "NVML gave no GPU memory in use"
    return f"{util.shape[1]} GPU(s) sampled, mean utilisation {report['signals']['gpu_util_mean']}"


def check_mfu_dtype(runner: Runner) -> str:
    seen = []
    for dtype in ("bf16", "fp32"):
        _, report, _ = runner.run("train.py", runner.device, dtype, "24")
        compute = report["facts"]["compute"]
        assert compute is not None, "the FLOP-counted step did not run"
        ran = max(compute["matmul_flops_by_dtype"], key=compute["matmul_flops_by_dtype"].get)
        assert ran == dtype, f"the counted step ran {ran}, the script asked for {dtype}"
        mfu = report["summary"]["mfu"]
        note = report["summary"]["mfu_note"] or ""
        if mfu is None and not runner.cuda and ("other processes" in note or "exceed" in note):
            # a crowded machine: MFU withheld, or a CPU peak measured while the cores were shared
            raise Skip(f"CPU MFU withheld on a crowded machine ({note}); dtypes seen: {ran}")
        assert mfu is not None, f"no MFU: {note}"
        assert mfu["dtype"] == dtype and 0 < mfu["value"] <= 1, mfu
        if runner.cuda:  # the record lists the CPU first, then the CUDA devices
            names = [item["name"] for item in report["run"]["devices"] if item.get("kind") == "cuda"]
            assert names, f"no CUDA device in the record: {report['run']['devices']}"
            assert names[0] in mfu["peak_source"], f"peak of {mfu['peak_source']!r}, device {names[0]!r}"
        seen.append(f"{dtype}: MFU {mfu['value']:.1%} of {mfu['peak_source']}")
    return "; ".join(seen)


def check_sync_and_pinned_memory(runner: Runner) -> str:
    if not runner.cuda:  # the trace window itself is checked by trace-window
        raise Skip("no CUDA device: host-device syncs and copies need one")
    _, report, _ = runner.run("sync.py", runner.device, options=("--trace",))
    trace = report["trace"]
    assert trace is not None, "the --trace window was not analyzed"
    syncs = trace_field(trace, SYNCS_PER_STEP) or 0
    assert syncs >= 1, f"no syncs found per step: {syncs}"
    findings = [item for item in report["findings"] if item["family"] == "host_device_sync"]
    assert findings, "no host_device_sync finding: " + "; ".join(item["title"] for item in report["findings"])
    settings = {p["setting"] for item in findings for p in item["prescriptions"]}
    memcpy = trace_field(trace, MEMCPY_SHARE) or 0
    if memcpy >= 0.05:
        assert "pin_memory" in settings, f"memcpy {memcpy:.1%} without a pin_memory prescription"
    return f"{findings[0]['title']} (syncs per step {syncs:.1f}, memcpy {memcpy:.1%} of the step)"


def check_pageable_copy_without_trace(runner: Runner) -> str:
    _, report, loaded = runner.run("pageable.py", runner.device)
    compute = loaded["record"].facts.compute
    assert compute is not None, "the FLOP-counted step did not run"
    line = next(number for number, text in enumerate(textwrap.dedent(COPY).splitlines(), 1) if "COPY LINE" in text)
    size = 2048 if runner.cuda else 256
    copies = [item for item in compute.copies if item.to_device and item.line == line]
    assert copies, f"no copy to the device recorded at pageable.py:{line}: {compute.copies}"
    copy = copies[0]
    assert copy.file.endswith("pageable.py") and not copy.pinned and not copy.non_blocking, copy
    assert copy.bytes == size * size * 4 and copy.count == 1 and copy.wall_ns > 0, copy
    if not runner.cuda:
        raise Skip(f"no CUDA device: the copy's record checked (cpu→meta at pageable.py:{line}, {copy.bytes} bytes); "
                   "the verdict needs a copy that costs time")
    named = [item for item in report["findings"] if item["family"] == "outside_model"
             and f"pageable.py:{line}" in item["title"]]
    assert named, "the copy's line is not named: " + "; ".join(item["title"] for item in report["findings"])
    first = named[0]["prescriptions"][0]["action"]
    assert "pin_memory()" in first and "non_blocking=True" in first, first
    return f"{named[0]['title']} (copy {copy.wall_ns / 1e6:.2f} ms in the counted step)"


#: Paths into report.json's ``trace`` section that the CUDA checks read; the CPU run checks that
#: they exist (values may be null there), so a renamed key fails here too, not only on a GPU.
SYNCS_PER_STEP = "syncs.syncs_per_step"
MEMCPY_SHARE = "shares.memcpy"
KERNELS_PER_STEP = "launches.kernels_per_step"


def trace_field(trace: dict, path: str):
    """``trace[a][b]`` for ``path`` "a.b"; None where a group is null; AssertionError where a key is
    missing (the report's schema changed under this script)."""
    value = trace
    for key in path.split("."):
        if value is None:
            return None
        assert key in value, f"report.json's trace has no {path!r} (keys here: {sorted(value)})"
        value = value[key]
    return value


def check_trace_window(runner: Runner) -> str:
    out, report, _ = runner.run("train.py", runner.device, "fp32", "24", options=("--trace",))
    traces = sorted((out / "traces").glob("*.json*"))
    assert len(traces) == 1, f"{len(traces)} trace files"
    assert report["summary"]["steps"]["excluded"], "the window's steps were not left out"
    trace = report["trace"]
    assert trace is not None and trace["steps"] >= 1, "the window's trace did not feed the diagnosis"
    values = {path: trace_field(trace, path) for path in (SYNCS_PER_STEP, MEMCPY_SHARE, KERNELS_PER_STEP)}
    if runner.cuda:
        assert trace["device"], "no GPU kernels in the trace window"
        assert (values[KERNELS_PER_STEP] or 0) > 0, f"no kernels per step: {values}"
    return f"{traces[0].name}: {trace['steps']} steps, device {trace['device'] or 'none (CPU)'}"


def check_input_bound_on_device(runner: Runner) -> str:
    _, report, _ = runner.run("input.py", runner.device)
    top = report["findings"][0] if report["findings"] else None
    assert top is not None, "no findings"
    families = [item["family"] for item in report["findings"]]
    if top["family"] == "foreign_load":  # a crowded machine is reported first
        assert "input_pipeline" in families, families
    else:
        assert top["family"] == "input_pipeline", families
    return top["title"]


class Skip(Exception):
    """The check does not apply on this device (the message says why)."""


CHECKS: tuple[tuple[str, Callable[[Runner], str]], ...] = (
    ("cuda-event-timing", check_cuda_event_timing),
    ("nvml-sampling", check_nvml_sampling),
    ("mfu-dtype", check_mfu_dtype),
    ("sync-and-pinned-memory", check_sync_and_pinned_memory),
    ("pageable-copy-without-trace", check_pageable_copy_without_trace),
    ("trace-window", check_trace_window),
    ("input-bound-on-device", check_input_bound_on_device),
)


def run_checks(device: str, only: list[str] | None = None, keep: Path | None = None) -> list[CheckResult]:
    results = []
    with tempfile.TemporaryDirectory(prefix="stepscope-gpu-check-") as scratch:
        work = Path(scratch)
        if keep is not None:  # the scripts and every run directory stay there
            work = keep
            work.mkdir(parents=True, exist_ok=True)
        runner = Runner(work, device)
        for name, check in CHECKS:
            if only and name not in only:
                continue
            begin = time.perf_counter()
            try:
                detail, status = check(runner), "PASS"
            except Skip as skip:
                detail, status = str(skip), "SKIP"
            except (AssertionError, subprocess.TimeoutExpired, OSError, KeyError, TypeError) as exc:
                detail, status = f"{type(exc).__name__}: {exc}", "FAIL"
            results.append(CheckResult(name, status, f"{detail} [{time.perf_counter() - begin:.1f} s]"))
            print(f"{status:4}  {name:24} {results[-1].detail}", flush=True)
    return results


def default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    parser.add_argument("--only", nargs="*", help="run only these checks")
    parser.add_argument("--json", action="store_true", help="print the results as JSON at the end")
    parser.add_argument("--keep", type=Path, default=None, help="write the scripts and run directories here")
    args = parser.parse_args(argv)
    if args.keep is not None and args.keep.exists() and not args.keep.is_dir():
        parser.error(f"--keep {args.keep}: not a directory; give a directory to keep the runs in")
    device = args.device or default_device()
    print(f"stepscope GPU check on {device}", flush=True)
    begin = time.perf_counter()
    results = run_checks(device, args.only, args.keep)
    failed = [item.name for item in results if item.status == "FAIL"]
    passed = sum(item.status == "PASS" for item in results)
    skipped = sum(item.status == "SKIP" for item in results)
    print(f"gpu check: {passed} passed, {len(failed)} failed, {skipped} skipped "
          f"in {time.perf_counter() - begin:.0f} s")
    if args.json:
        print(json.dumps([item.__dict__ for item in results], indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
