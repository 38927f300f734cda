"""The zoo end to end: every scenario under ``stepscope demo`` must be diagnosed as planted.

Each scenario runs as a user would run it (``python -m stepscope demo NAME``, in a subprocess, with
the machine's default threads; forked from a warm interpreter where that stands for a cold start,
see ``tests/zygote.py``) and its ``report.json`` is read back. The planted family must be
the **top** finding; the healthy scenario must have no finding above LOW severity.

The verdicts depend on the cores being free: the tests are ``serial`` (``make test`` runs them
after the parallel tests, alone). On a machine that other processes crowd (a shared developer box), stepscope says so first: the
``foreign_load`` finding then heads the report, and the test only requires that the disturbance is
reported with the processes named (the planted family may rank below it or be blurred by it).

Some families rest on evidence from other parts of capture (the sidecar sampler's signals; the
operator count of the FLOP-counted step): the test first requires that evidence to be in the
report, so a capture regression fails with the missing piece named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import run_command, scenario_env

from stepscope.diagnosis.rules import FAMILIES
from stepscope.zoo import SCENARIOS

REPO_SRC = Path(__file__).resolve().parents[2] / "src"
#: Per-scenario limit; each is meant to take well under a minute.
SCENARIO_TIMEOUT_S = 240
LOW_SEVERITIES = {"info", "low"}


def _has_signals(report: dict) -> bool:
    signals = report.get("signals") or {}
    return signals.get("cpu_util_mean") is not None and bool(signals.get("workers"))


def _has_op_count(report: dict) -> bool:
    return bool(((report.get("facts") or {}).get("compute") or {}).get("ops"))


#: Evidence a scenario's family needs beyond the steps, and how to tell it is in the report.
NEEDS = {
    "storage-latency": ("sampler signals (loading CPU vs wait)", _has_signals),
    "memory-leak": ("sampler signals (RSS growth)", _has_signals),
    "oversubscribed": ("sampler signals (run queue, busy cores)", _has_signals),
    "tiny-ops": ("operator count of the FLOP-counted step (record.facts.compute.ops)", _has_op_count),
}


#: Scenarios whose planted family needs more cores than a small CI box has: two busy DataLoader
#: workers (three OS threads each) plus the training process count as oversubscription below four.


#: Capture options a scenario's run needs. cold-files trains for 0.5 s on a disk reading ~1 GB/s
#: (longer on a slower one): at the default 10 Hz its memory trend has fewer than the 6 points it
#: needs, so the run samples at 25 Hz (8-11 points).
DEMO_OPTIONS = {"cold-files": ("--sample-hz", "25")}


def run_demo(name: str, out: Path) -> dict:
    proc = run_command([sys.executable, "-m", "stepscope", "demo", name, "-o", str(out), "--no-summary",
                        *DEMO_OPTIONS.get(name, ())], None, scenario_env(), timeout=SCENARIO_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "report.json").read_text(encoding="utf-8"))


def describe(findings: list[dict], report: dict | None = None) -> str:
    """The findings in one line; with ``report``, also the machine's side of the run, so a verdict
    that differs on another machine (a CI box) says why from the failure message alone."""
    text = "; ".join(f"{item['family']} {item['severity']} {item['impact']:.3f} ({item['title']})"
                     for item in findings) or "no findings"
    return text if report is None else f"{text}\n  machine: {machine_context(report)}"


def machine_context(report: dict) -> str:
    signals = report.get("signals") or {}
    evidence = report.get("evidence") or {}
    picked = {name: signals.get(name) for name in ("sample_count", "cpu_count", "cpu_util_mean", "steal_share",
                                                 "iowait_share", "rss_growth_bytes_per_s",
                                                 "runnable_threads_per_core", "main_cpu_util", "worker_count")}
    picked["tree_cores"] = round(sum(item.get("cpu_util", 0.0) for item in signals.get("workers") or []), 3)
    picked["cpu_demand"] = evidence.get("cpu_demand")
    picked["foreign"] = evidence.get("foreign")
    picked["periodic_stall"] = {key: value for key, value in (evidence.get("periodic_stall") or {}).items()
                                if key != "slow_steps"} or None
    steady = (report.get("summary") or {}).get("steady_state") or {}
    picked["steady"] = {key: steady.get(key) for key in ("count", "total_s", "median_s", "p90_s", "max_s")}
    return json.dumps(picked, default=str)


pytestmark = [pytest.mark.slow, pytest.mark.serial]


#: The compiled scenarios' verdicts rest on what dynamo reports, not on CPU timing: they run with the
#: parallel tests (tests/integration/test_compile.py).
SERIAL_SCENARIOS = [name for name in SCENARIOS if not name.startswith("compile-")]


def warm_wait_without_a_claim(finding: dict) -> bool:
    """cold-files on two cores: its warm epochs wait too, on the handoff of the workers' batches (the
    loaders at 0.38-0.52 of a core, computing and waiting), and that wait can cost more than the cold
    epoch. Reported first, it is an input finding that claims no CPU-bound loading and no confidence,
    or — where the workers' measured pace explains only part of it (a slower machine: once in ~18
    clean CI runs, 26 % against the cold epoch's 16 %) — the wait in next() that is not the
    DataLoader's pace, which names no cause and no fix."""
    if finding["rule_id"] == "thread_account.wait_not_the_workers":
        return finding["family"] == "unexplained" and finding["confidence"] < 0.75
    return (finding["rule_id"] == "input_pipeline.loader_cpu_bound"
            and not finding["extra"]["conclusive"]["cpu_bound"] and finding["confidence"] < 0.75)


@pytest.mark.parametrize("name", SERIAL_SCENARIOS)
def test_planted_family_is_the_top_finding(zoo_run, name):
    scenario = SCENARIOS[name]
    assert scenario.planted_family in FAMILIES, f"unknown family {scenario.planted_family!r}"
    report = zoo_run(name).report
    findings = report["findings"]
    top = findings[0] if findings else None
    if name in NEEDS:
        what, present = NEEDS[name]
        assert present(report), f"the report lacks {what}"
    assert top is not None, "no findings at all"
    if name == "jsonl-text":  # its corpus has broken lines: SkipBadSamples' counts reach the report
        assert report["summary"]["skipped_samples"]["total"] > 0
    if top["family"] == "foreign_load" and scenario.planted_family != "foreign_load":
        # the disturbance is said, by the cores they held or by the wait they measurably caused
        assert top["title"].startswith(("Other processes used", "Other processes took")), describe(findings, report)
        print(f"the machine was crowded by other processes: {describe(findings, report)}")
        return
    risk = report.get("risk")
    if scenario.planted_family == "memory_pressure" and top["family"] != "memory_pressure":
        # a risk stands beside the speed verdict when a measured slowdown leads (here the loop's
        # own data wait, 5-10 % of its steps): the leak is the report's risk line, urgent, high
        assert risk is not None and risk["rule_id"].startswith("memory_pressure."), describe(findings, report)
        leak = findings[risk["finding"] - 1]
        assert leak["family"] == "memory_pressure" and leak["severity"] in {"high", "critical"}, describe(findings)
        assert "runs out" in risk["what"] and top["impact_basis"].startswith("measured"), describe(findings, report)
        return
    if name == "cold-files" and top["family"] in ("input_pipeline", "unexplained"):
        assert warm_wait_without_a_claim(top), describe(findings, report)
        assert any(item["rule_id"] == "storage_io.cold_data" for item in findings), describe(findings, report)
        return
    assert top["family"] == scenario.planted_family, describe(findings, report)
    assert report["verdict"]["family"] == scenario.planted_family
    if scenario.planted_family == "healthy":
        assert all(item["severity"] in LOW_SEVERITIES for item in findings), describe(findings, report)
    else:
        assert top["severity"] not in LOW_SEVERITIES, describe(findings, report)
        assert top["prescriptions"], "a finding without a prescription"


@pytest.mark.parametrize("name, threshold, code", [("input-cpu", "high", 3), ("healthy", "medium", 0)])
def test_fail_on_gates_the_zoo_runs(zoo_run, name, threshold, code):
    """`--fail-on` as CI uses it: the input-bound run trips a HIGH gate, the healthy one a MEDIUM gate not
    (unless other processes crowded the run: the gate counts that finding too, as it should)."""
    levels = ["info", "low", "medium", "high", "critical"]
    if any(item["family"] == "foreign_load" and levels.index(item["severity"]) >= levels.index(threshold)
           for item in zoo_run(name).report["findings"]):
        code = 3
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_SRC) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-m", "stepscope", "report", str(zoo_run(name).dir), "--fail-on", threshold],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr[-2000:]


def test_the_bookkeeping_title_names_the_function_that_owns_the_time(zoo_run):
    """metrics-confusion: the pure-Python update_confusion() owns "other"; its call site in main()
    only converts two tensors to lists (the signal sampler once named the call site)."""
    top = zoo_run("metrics-confusion").report["findings"][0]
    assert top["family"] == "outside_model" and "update_confusion()" in top["title"], top["title"]
    assert "main()" not in top["title"]


def test_cold_files_are_storage_and_no_memory_growth(zoo_run):
    report = zoo_run("cold-files").report
    families = [item["family"] for item in report["findings"]]
    assert families[0] in ("storage_io", "foreign_load") or warm_wait_without_a_claim(report["findings"][0]), \
        describe(report["findings"], report)
    assert "memory_pressure" not in families, describe(report["findings"], report)
    cold = next(item for item in report["findings"] if item["rule_id"] == "storage_io.cold_data")
    assert "first epoch" in cold["title"] and cold["extra"]["conclusive"]["storage"]
    assert report["signals"]["rss_growth_basis"] == "anonymous"


def test_a_slow_ranks_own_work_outside_the_model_is_the_straggler_with_its_line(zoo_run):
    """slow-rank: rank 1 sleeps 20 ms per step in rank_chore(); rank 0 waits in the all-reduce. The
    straggler is rank 1, named with that line and a share within 10 points of the sleep's, and no
    communication advice is given (the wait is rank 1's work, not the network's)."""
    run = zoo_run("slow-rank")
    report = run.report
    top = report["findings"][0]
    assert top["family"] == "straggler", describe(report["findings"], report)
    assert top["rank"] == 1 and top["extra"]["phase"] == "other"
    assert "rank_chore()" in top["title"], top["title"]
    assert "communication" not in {item["family"] for item in report["findings"]}
    text = json.dumps(report["findings"])
    assert "bucket_cap_mb" not in text and "no_sync" not in text and "compress" not in text.lower()
    from stepscope.analysis.run.steady import steady_state
    from stepscope.record.store import load_record

    steady = steady_state(load_record(run.dir, 1))
    sleep_share = 0.020 / steady.step_time_mean_s  # the planted sleep's share of rank 1's step
    named = float(top["title"].split("rank_chore() takes ")[1].split("%")[0]) / 100
    assert abs(named - sleep_share) <= 0.10, (named, sleep_share, top["title"])
