"""Idle DataLoader workers set the pace: work taken off the training thread is then more waiting,
not a shorter step, in every step that waited for data (``engine.loader_pace``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from diagnosis_records import ctx_of, make_record
from stepscope.analysis.run.account import PhaseAccount, ThreadAccountView
from stepscope.diagnosis.engine import _paced_by_the_loader, loader_pace, run_rules
from stepscope.diagnosis.findings import Severity
from stepscope.diagnosis.rules._common import finding

SHARES = {"data_wait": 0.3, "forward": 0.25, "backward": 0.25, "optimizer": 0.05}
IDLE = dict(cpu_count=2, worker_cpu_util_mean=0.05, iowait_share=0.2)
BUSY = dict(cpu_count=2, worker_cpu_util_mean=0.95)


def _account(off_cpu: float, cause: str = "workers") -> ThreadAccountView:
    """The training thread's account: the data wait ``off_cpu`` off CPU (``cause``), the rest on CPU."""
    wait = PhaseAccount("data_wait", 0.003, 0.3, 1.0 - off_cpu, 0.0, off_cpu, cause)
    return ThreadAccountView(accounted_steps=20, phases=(wait,), on_cpu=0.7, waiting_core=0.0, off_cpu=0.3,
                             spread=0.01, other_thread_cores=0.0, python_threads=(), takers=(), representative=1.0)


def _evidence(record, signals, off_cpu: float = 0.95, cause: str = "workers"):
    return replace(ctx_of(record, signals), account=_account(off_cpu, cause))


def _own_work(impact: float):
    return finding("launch_overhead.tiny_ops", "launch_overhead", "many tiny operators", impact, 0.75, [], [],
                   claims=("compute", "other"))


def _loading(impact: float):
    return finding("storage_io.loader_waits_on_io", "storage_io", "the loaders wait", impact, 0.75, [], [],
                   claims=("data_wait",))


def test_idle_workers_that_every_step_waits_for_leave_the_thread_s_own_work_nothing_to_save():
    evidence = _evidence(make_record(shares=SHARES, num_workers=1), IDLE)
    assert loader_pace(evidence) == pytest.approx(1.0)
    own, loading = _paced_by_the_loader([_own_work(0.4), _loading(0.25)], evidence)
    assert own.impact == 0.0 and own.severity == Severity.INFO
    assert own.extra["paced_by_loader"] == 1.0 and own.extra["impact_unpaced"] == 0.4
    assert any(item.metric == "paced_by_loader" for item in own.evidence)
    assert loading.impact == 0.25  # the loader's own finding is what shortens the step


def test_steps_that_did_not_wait_keep_their_share_of_the_saving():
    # three long steps (a checkpoint) in which the data was ready: 0.6 s of the 0.97 s steady time
    record = make_record(shares=SHARES, num_workers=1, added={10: {"other": 0.2}, 20: {"other": 0.2},
                                                              30: {"other": 0.2}})
    evidence = _evidence(record, IDLE)
    unwaited = evidence.steady.unwaited_share
    assert 0.6 < unwaited < 0.7
    assert loader_pace(evidence) == pytest.approx(1.0 - unwaited)
    (own,) = _paced_by_the_loader([_own_work(0.4)], evidence)
    assert own.impact == pytest.approx(0.4 * unwaited, abs=1e-4)
    # a measured cost scaled by a model of the pace is an estimate, and says what it was checked on
    assert not own.impact_measured and own.impact_basis.startswith("estimate: its measured cost × the ")
    assert "did not wait for idle DataLoader workers" in own.impact_basis and "within 15 points" in own.impact_basis


@pytest.mark.parametrize("workers, signals, off_cpu, cause", [
    (1, BUSY, 0.95, "workers"), (0, IDLE, 0.95, "workers"), (1, None, 0.95, "workers"),
    (1, IDLE, 0.4, "workers"), (1, IDLE, 0.95, "gil")],
    ids=["busy-workers", "no-workers", "no-sampler", "thread-on-cpu-in-next", "gil"])
def test_busy_absent_or_unmeasured_workers_set_no_pace(workers, signals, off_cpu, cause):
    """Nor do idle workers when the training thread spent the wait on CPU or runnable (receiving
    batches beside a Python thread that held the cores: removing that thread gained 52-59 % in the
    blind evaluation), or waiting for the GIL."""
    evidence = _evidence(make_record(shares=SHARES, num_workers=workers), signals, off_cpu, cause)
    assert loader_pace(evidence) is None
    assert _paced_by_the_loader([_own_work(0.4)], evidence)[0].impact == 0.4


def test_the_pace_reaches_the_verdict():
    """The whole diagnosis: 40 % of the step outside the model, 30 % waiting for idle workers in
    every step. Unpaced, the time outside the model would rank first; it saves nothing here."""
    shares = {"data_wait": 0.3, "forward": 0.15, "backward": 0.1, "optimizer": 0.05}
    findings = run_rules(_evidence(make_record(shares=shares, num_workers=1), IDLE)).findings
    assert findings[0].family == "storage_io", [(item.rule_id, item.impact) for item in findings]
    outside = [item for item in findings if item.family == "outside_model"]
    assert outside and outside[0].extra["impact_unpaced"] >= 0.35 and outside[0].impact == 0.0
