"""The thread account on real runs: the run's own processes that come and go (DataLoader workers
restarted every epoch, the job's other ranks) are never "other processes", a Python thread holding
the GIL is named, and a neighbour that takes the cores is priced by the wait it caused."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from support import run_cli, run_python, write_script
from stepscope.analysis.bundle import build_evidence
from stepscope.record.store import load_record

# The single-process scripts update their weights by hand: torch.optim's first step imports
# torch._dynamo (~1.5 s of CPU and ~0.3 s more at exit in each run of a part that runs alone).

#: Workers started anew for each of 30 short epochs of cheap samples: start-up is the cost.
EPOCH_RESTARTS = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 32), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=64, num_workers=2)
    model = torch.nn.Linear(32, 1)
    for epoch in range(30):
        for x, y in loader:
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            with torch.no_grad():  # by hand: torch.optim is not what this measures
                for parameter in model.parameters():
                    parameter.add_(parameter.grad, alpha=-0.01)
"""

#: A training loop beside a pure-Python thread of the same process that never sleeps.
GIL_THREAD = """
    import threading, time, torch
    from torch.utils.data import DataLoader, TensorDataset

    def telemetry_loop():  # pure Python in slices of ~5 ms, 1 ms apart
        while True:
            end = time.perf_counter() + 0.005
            while time.perf_counter() < end:
                pass
            time.sleep(0.001)

    threading.Thread(target=telemetry_loop, name="telemetry", daemon=True).start()
    torch.manual_seed(0)
    # ~1 ms steps: 512 of them give the wait sampler (every 5 ms) enough of the loader's wait to
    # split it; 64 left it inferred (the source's), and a short run then read as storage latency
    data = TensorDataset(torch.randn(16384, 64), torch.randn(16384, 1))
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(6)], torch.nn.Linear(64, 1))
    for x, y in DataLoader(data, batch_size=32):
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():  # by hand: torch.optim is not what this measures
            for parameter in model.parameters():
                parameter.add_(parameter.grad, alpha=-0.01)
"""

#: CPU-heavy steps on one intra-op thread: what a neighbour process takes from them is the wait.
COMPUTE_LOOP = """
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    for _ in range(300):
        x = torch.randn(128, 256)
        model.zero_grad()
        model(x).pow(2).mean().backward()
        with torch.no_grad():  # by hand: torch.optim is not what this measures
            for parameter in model.parameters():
                parameter.add_(parameter.grad, alpha=-0.01)
"""


def _report(tmp_path, name: str = "out") -> dict:
    return json.loads((tmp_path / name / "report.json").read_text())


def _families(report: dict) -> list[str]:
    return [item["family"] for item in report["findings"]]


@pytest.mark.serial  # "other processes" is measured against a quiet machine
def test_workers_restarted_every_epoch_are_the_run_s_own_and_their_start_up_is_the_finding(tmp_path):
    write_script(tmp_path, "epochs.py", EPOCH_RESTARTS)
    result = run_cli(["run", "--no-monitor", "-o", "out", "epochs.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    report = _report(tmp_path)
    assert "foreign_load" not in _families(report), report["findings"][0]["title"]
    foreign = report["evidence"]["foreign"]
    assert foreign is None or foreign["cpu_share"] < 0.25
    startup = report["findings"][0]
    assert startup["rule_id"] == "epoch_boundary.worker_startup", [item["title"] for item in report["findings"]]
    assert startup["prescriptions"][0]["action"] == "DataLoader(persistent_workers=True)"


@pytest.mark.serial  # the GIL's cost depends on the cores the two threads get
def test_a_python_thread_holding_the_gil_is_named_with_its_function(tmp_path):
    write_script(tmp_path, "gil.py", GIL_THREAD)
    result = run_cli(["run", "--no-monitor", "-o", "out", "gil.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    report = _report(tmp_path)
    top = report["findings"][0]
    assert top["family"] == "gil_contention", [item["title"] for item in report["findings"]]
    assert "`telemetry`" in top["title"] and "telemetry_loop" in top["prescriptions"][0]["action"]
    account = report["evidence"]["thread_account"]
    assert account["off_cpu"] + account["waiting_core"] > 0.3
    assert any(phase["off_cause"] == "gil" for phase in account["phases"])
    # the summary's account line (rich wraps it: read it with the line breaks folded)
    summary = " ".join(result.stderr.split())
    assert "Thread on CPU" in summary and "waiting for a core" in summary


def _quiet_busy_quiet(tmp_path, tag: str) -> tuple[dict, dict, float]:
    """Runs quiet, beside two busy loops, quiet again: (quiet report, busy report, the busy run's
    slowdown against the faster quiet run, 1 - quiet / busy step median)."""
    names = [f"quiet{tag}", f"busy{tag}", f"quiet2{tag}"]
    quiet = run_cli(["run", "-o", names[0], "compute.py"], tmp_path)
    assert quiet.returncode == 0, quiet.stderr
    # two busy loops on a 2-core machine: the training thread shares the cores 3 ways
    neighbours = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        busy = run_cli(["run", "-o", names[1], "compute.py"], tmp_path)
    finally:
        for process in neighbours:
            process.kill()
            process.wait()
    assert busy.returncode == 0, busy.stderr
    # a second quiet run after it: the quiet step is the faster of the two (one disturbed quiet
    # baseline once made the busy run look faster)
    again = run_cli(["run", "-o", names[2], "compute.py"], tmp_path)
    assert again.returncode == 0, again.stderr
    median = {name: _report(tmp_path, name)["summary"]["steady_state"]["median_s"] for name in names}
    slowdown = 1 - min(median[names[0]], median[names[2]]) / median[names[1]]
    return _report(tmp_path, names[0]), _report(tmp_path, names[1]), slowdown


@pytest.mark.serial  # a quiet machine, then one busy neighbour
def test_a_neighbour_s_cost_is_the_wait_for_a_core_it_caused(tmp_path):
    write_script(tmp_path, "compute.py", COMPUTE_LOOP)
    quiet_report, busy_report, slowdown = _quiet_busy_quiet(tmp_path, "")
    assert "foreign_load" not in _families(quiet_report)
    top = busy_report["findings"][0]
    assert top["family"] == "foreign_load", [item["title"] for item in busy_report["findings"]]
    # the cost is measured (the wait for a core), material, and of the order of the slowdown it
    # caused. Three busy threads on two cores cost the step about a third, but the scheduler does
    # not always split the cores evenly: once the neighbours held 1.26 cores, not 2, and the
    # measured 0.148 matched a slowdown of 0.159 -- the match is the claim, not the third
    assert top["impact_basis"] == "measured" and top["impact"] > 0.1, (top["impact"], slowdown)
    if abs(top["impact"] - slowdown) > 0.25:
        # the slowdown is three single runs' wall clocks on a shared machine (once 0.09 beside a
        # measured 0.385 in a full suite, right in every rerun): the triple is measured once more,
        # and the measured cost must then match its slowdown
        _, busy_report, slowdown = _quiet_busy_quiet(tmp_path, "_again")
        top = busy_report["findings"][0]
        assert top["family"] == "foreign_load", [item["title"] for item in busy_report["findings"]]
    assert top["impact"] == pytest.approx(slowdown, abs=0.25)


@pytest.mark.serial  # "other processes" is measured against a quiet machine
def test_the_job_s_other_ranks_are_never_other_processes(tmp_path):
    write_script(tmp_path, "ranks.py", """
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        dist.init_process_group("gloo")
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(150):
            opt.zero_grad()
            model(torch.randn(64, 256)).pow(2).mean().backward()
            opt.step()
        dist.barrier()
        dist.destroy_process_group()
    """)
    result = run_python(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                         "-m", "stepscope", "run", "--stacks-hz", "0", "-o", "out", "ranks.py"], tmp_path, timeout=240,
                        cold=True)  # the scan of other processes (every 2 s) needs the ranks' own start too
    assert result.returncode == 0, result.stderr[-3000:]
    records = [load_record(tmp_path / "out", rank) for rank in (0, 1)]
    for rank, record in enumerate(records):
        evidence = build_evidence(record)  # this rank alone, as its own report sees it
        assert evidence.signals is not None and (evidence.signals.job_cores or 0.0) > 0.3, rank
        assert evidence.foreign is None or evidence.foreign.cpu_share < 0.25, (rank, evidence.foreign)
        other = records[1 - rank].meta.pid
        assert other not in [pid for pid, _, _ in evidence.signals.foreign_processes]
