"""Verdicts derived from the training thread's account: a GIL held by another Python thread, time
off CPU that nothing explains, the wait for a core other processes caused, worker start-up at every
epoch, and MFU near its line worded the same on both sides."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from diagnosis_records import ctx_of, make_record, timed_workers
from stepscope.analysis.evidence import WorkerLoad
from stepscope.analysis.bundle import ForeignLoad, MfuEstimate, job_evidence, rank_basis
from stepscope.diagnosis.engine import CROWDED_CONFIDENCE, diagnose_job, run_rules
from stepscope.diagnosis.findings import Severity
from stepscope.diagnosis.rules._common import GAIN_ERROR
from stepscope.diagnosis.rules.gil_contention import SHARED_WAIT_CONFIDENCE
from stepscope.diagnosis.rules.launch_overhead import tiny_ops_dominate
from stepscope.pipeline.views import account_summary
from stepscope.analysis.run.account import MIN_WAIT_SAMPLES
from stepscope.record.run import PHASES, WAIT_CLASSES, StepTable, ThreadAccount, ThreadInfo

COMPUTE = {"forward": 0.5, "backward": 0.4, "optimizer": 0.05}
PEAK = 1e11


def _account(record, on_cpu: dict[str, float], runq: dict[str, float] | None = None,
             threads: tuple[ThreadInfo, ...] = (), every: int = 2):
    """Every ``every``-th step accounted, each phase split by ``on_cpu`` / ``runq`` (fractions)."""
    steps = tuple(range(2, len(record.steps), every))
    phase_ns = {name: record.steps.phase(name) for name in PHASES if name != "compile"}
    rows = {"wall_ns": [], "cpu_ns": [], "runq_ns": [], "process_cpu_ns": []}
    for step in steps:
        wall = [int(phase_ns[name][step]) if name in phase_ns else 0 for name in PHASES]
        cpu = [int(value * on_cpu.get(name, 1.0)) for name, value in zip(PHASES, wall)]
        waiting = [int(value * (runq or {}).get(name, 0.0)) for name, value in zip(PHASES, wall)]
        rows["wall_ns"].append(tuple(wall))
        rows["cpu_ns"].append(tuple(cpu))
        rows["runq_ns"].append(tuple(waiting))
        rows["process_cpu_ns"].append(tuple(cpu))
    account = ThreadAccount(every=every, every_early=every, tid=1, steps=steps,
                            **{name: tuple(value) for name, value in rows.items()}, threads=threads)
    duration = int(record.steps.duration_ns.sum())
    meta = replace(record.meta, start_ns=10**9, end_ns=10**9 + duration)
    return replace(record, meta=meta, facts=replace(record.facts, thread_account=account))


def _python_thread(record, cores: float, name: str = "logger", function: str = "train.spin") -> ThreadInfo:
    return ThreadInfo(native_id=2, name=name, function=function, cpu_ns=int(cores * record.steps.duration_ns.sum()),
                      python=True)


def _assert_stated_with_its_error(prescription, model: str) -> None:
    """The gain is stated as a range: the estimate less its measured overshoot, plus its undershoot."""
    over, under = GAIN_ERROR[model]
    low, high = prescription.expected_range
    assert low == pytest.approx(max(-1.0, prescription.expected_gain - over), abs=1e-4)
    assert high == pytest.approx(min(0.99, prescription.expected_gain + under), abs=1e-4)
    assert low < high


def _low_mfu_extra() -> dict:
    return {"flops": {"step_index": 3, "flops": 2e6}, "cpu_matmul_peak_flops": PEAK}


def test_a_python_thread_holding_the_gil_is_the_verdict_not_low_mfu():
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_low_mfu_extra())
    record = _account(record, {"forward": 0.2, "backward": 0.2, "optimizer": 0.2},
                      threads=(_python_thread(record, 0.9),))
    diagnosis = run_rules(ctx_of(record))
    top = diagnosis.findings[0]
    assert top.family == "gil_contention"
    assert "`logger`" in top.title and "train.spin" in top.prescriptions[0].action
    assert top.impact == pytest.approx(0.95 * 0.8, abs=0.02)  # the model's phases, 80 % off CPU
    assert "compute" not in {item.family for item in diagnosis.findings}
    _assert_stated_with_its_error(top.prescriptions[0], "gil")


def test_time_off_cpu_that_nothing_explains_is_said_to_be_unexplained():
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_low_mfu_extra())
    record = _account(record, {"forward": 0.1, "backward": 0.1, "optimizer": 0.1})  # no other thread
    diagnosis = run_rules(ctx_of(record))
    top = diagnosis.findings[0]
    assert top.family == "unexplained" and top.title.startswith("Not explained")
    assert "py-spy dump" in top.prescriptions[0].action
    assert "compute" not in {item.family for item in diagnosis.findings}


def test_a_thread_that_computes_gets_no_account_finding_and_no_line():
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_low_mfu_extra())
    record = _account(record, {})
    evidence = ctx_of(record)
    families = {item.family for item in run_rules(evidence).findings}
    assert not families & {"gil_contention", "unexplained"} and "compute" in families
    summary = account_summary(evidence)
    assert summary is not None and summary.on_cpu == pytest.approx(1.0, abs=0.01) and not summary.shown


def test_low_mfu_is_priced_on_the_time_the_thread_computed():
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_low_mfu_extra())
    full = next(item for item in run_rules(ctx_of(_account(record, {}))).findings if item.family == "compute")
    half = _account(record, {name: 0.5 for name in COMPUTE}, runq={name: 0.5 for name in COMPUTE})
    priced = next(item for item in run_rules(ctx_of(half)).findings if item.family == "compute")
    assert priced.impact == pytest.approx(full.impact * 0.5, rel=0.05)


def test_the_wait_for_a_core_others_caused_is_the_foreign_finding_s_measured_cost():
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_low_mfu_extra())
    evidence = replace(ctx_of(record), foreign=ForeignLoad(0.45, (), 0.0, step_cost=0.6))
    diagnosis = run_rules(evidence)
    top = diagnosis.findings[0]
    assert top.family == "foreign_load" and top.impact_measured
    assert top.impact == pytest.approx(0.6) and top.severity == Severity.CRITICAL
    assert top.title.startswith("Other processes took 60% of the step")
    _assert_stated_with_its_error(top.prescriptions[0], "foreign")
    # a low MFU beside them is their symptom
    assert "compute" not in {item.family for item in diagnosis.findings}
    # others that held the cores but took little from the step rank low, measured
    small = run_rules(replace(ctx_of(record), foreign=ForeignLoad(0.3, (), 0.0, step_cost=0.02)))
    finding = next(item for item in small.findings if item.family == "foreign_load")
    assert finding.impact == pytest.approx(0.02) and finding.severity == Severity.LOW


@pytest.mark.parametrize("value, low, high", [(0.096, 0.088, 0.104), (0.104, 0.096, 0.112)])
def test_mfu_within_its_range_of_the_line_is_borderline_on_either_side(value, low, high):
    record = make_record(step_s=0.01, shares=COMPUTE)
    estimate = MfuEstimate(value=value, low=low, high=high, peak_flops=PEAK, dtype="fp32",
                           peak_source="measured fp32 matmul peak of this CPU", on_gpu=False, flops_per_step=1e6,
                           step_time_s=0.01)
    diagnosis = run_rules(replace(ctx_of(record), mfu=estimate))
    compute = next(item for item in diagnosis.findings if item.family == "compute")
    assert compute.severity == Severity.LOW and compute.title.startswith("Compute efficiency borderline")
    assert diagnosis.findings[0].family == "healthy"  # one verdict whichever side the run fell on


def test_workers_restarted_every_epoch_are_the_finding_with_persistent_workers_first():
    # 40 steps, an epoch every 2 steps: 2 workers started anew 20 times, 6 ms each time
    record = make_record(step_s=0.01, shares={"data_wait": 0.02, **COMPUTE}, num_workers=2,
                         loader_init={index: 0.006 for index in range(0, 40, 2)})
    record = replace(record, loaders=(replace(record.loaders[0], iterators=20,
                                              init_ns=int(20 * 0.006e9)),))
    findings = run_rules(ctx_of(record)).findings
    finding = findings[0]
    assert finding.rule_id == "epoch_boundary.worker_startup"
    assert finding.prescriptions[0].action == "DataLoader(persistent_workers=True)"
    assert "each epoch start costs" in finding.title
    _assert_stated_with_its_error(finding.prescriptions[0], "restarts")
    # the input finding's own persistent_workers prescription states the same gain
    same = [item for other in findings[1:] for item in other.prescriptions if item.setting == "persistent_workers"]
    assert all(item.expected_gain == finding.prescriptions[0].expected_gain for item in same)


def _alternating_rank(rank: int, steps: int = 40, step_s: float = 0.01):
    """A rank of a 2-rank job whose data loading is slow on every other step, in turn with the other
    rank: in its slow steps it loads, in the others it waits in the all-reduce for the other rank."""
    record = make_record(steps=steps, step_s=step_s, shares={"data_wait": 0.2, **COMPUTE_SMALL}, rank=rank,
                         num_workers=0)
    columns = {name: column.copy() for name, column in record.steps.columns().items()}
    slow = np.arange(steps) % 2 == rank
    extra = int(0.012e9)
    columns["data_wait_ns"][slow] += extra
    columns["communication_ns"][~slow] += extra
    columns["duration_ns"] += extra
    columns["start_ns"] = 10**9 + np.concatenate([[0], np.cumsum(columns["duration_ns"])[:-1]])
    return replace(record, steps=StepTable.from_columns(columns))


COMPUTE_SMALL = {"forward": 0.3, "backward": 0.3, "optimizer": 0.1}


def test_a_wait_in_collectives_for_the_other_rank_s_loading_is_its_loading_not_communication():
    ranks = (_alternating_rank(0), _alternating_rank(1))
    evidences = job_evidence([rank_basis(record) for record in ranks])
    for evidence in evidences:
        assert evidence.peer is not None and evidence.peer.phase == "data_wait" and evidence.peer.explained > 0.9
        findings = run_rules(evidence).findings
        comm = next(item for item in findings if item.family == "communication")
        assert comm.rule_id == "communication.waiting_for_peer" and comm.severity == Severity.LOW
        assert findings[0].family == "input_pipeline"
    job = diagnose_job([(record.meta.rank, evidence) for record, evidence in zip(ranks, evidences)])
    assert job.findings[0].family == "input_pipeline"
    assert not any(item.family == "communication" and item.severity >= Severity.MEDIUM for item in job.findings)


def test_what_the_account_leaves_unexplained_lowers_every_other_finding_s_confidence():
    shares = {"data_wait": 0.3, **COMPUTE_SMALL}
    plain = make_record(step_s=0.01, shares=shares)
    base = {item.rule_id: item.rule_confidence for item in run_rules(ctx_of(_account(plain, {}))).findings}
    blocked = run_rules(ctx_of(_account(plain, {"forward": 0.2, "backward": 0.2, "optimizer": 0.2}))).findings
    assert blocked[0].family in ("input_pipeline", "unexplained")
    others = [item for item in blocked if item.family != "unexplained" and item.rule_id in base]
    assert "input_pipeline.loader_cpu_bound" in {item.rule_id for item in others}
    for item in others:
        left = item.extra["unexplained_share"]
        assert left == pytest.approx(0.7 * 0.8, abs=0.02)
        assert item.rule_confidence == pytest.approx(base[item.rule_id] * (1 - left), abs=0.011)


def test_the_wait_goes_to_the_group_without_which_the_rest_would_fit_in_the_cores():
    """2 cores: the training thread leaves 1 for the rest. Own intra-op threads (0.8 of a core)
    fit alone; with a neighbour (0.46) they do not: the neighbour's absence gives back the whole
    wait, however small its share of the CPU. Loads that fit, or unknown cores: by CPU share."""
    from stepscope.analysis.run.account import _takers

    crowded = {item.who: item for item in _takers(0.2, 0.8, 0.0, 0.46, cores=2)}
    assert crowded["other processes"].step_share == pytest.approx(0.2)
    assert crowded["own threads"].step_share == pytest.approx(0.2)
    assert crowded["own processes"].step_share == 0.0
    # the excess (0.26) is smaller than a group's load: a group gives back at most the excess
    partly = {item.who: item for item in _takers(0.2, 0.9, 0.0, 0.2, cores=2)}
    assert partly["other processes"].step_share == pytest.approx(0.2)  # 0.1 excess < its 0.2: all of it
    assert partly["own threads"].step_share == pytest.approx(0.2)
    for cores in (4, None):  # fits in 3 cores / unknown: by CPU share
        shared = {item.who: item for item in _takers(0.2, 0.8, 0.0, 0.2, cores=cores)}
        assert shared["other processes"].step_share == pytest.approx(0.04)
        assert shared["own threads"].step_share == pytest.approx(0.16)


def test_the_input_finding_is_priced_without_the_wait_for_cores_a_neighbour_held():
    """The step waits 50 % for data (loaded in the main process), but 60 % of that wait the thread
    was runnable while a neighbour held the cores: faster loading gives back 20 % of the step, and
    the neighbour's finding (the wait it caused) ranks first."""
    record = make_record(step_s=0.01, shares={"data_wait": 0.5, "forward": 0.3, "backward": 0.15})
    record = _account(record, on_cpu={"data_wait": 0.4}, runq={"data_wait": 0.6})
    # the machine 90 % busy on 2 cores, the training process 0.9 of them: others held 0.9 cores
    evidence = ctx_of(record, {"cpu_count": 2, "cpu_util_mean": 0.9, "workers": (WorkerLoad(1, "main", 0.9),)})
    account = evidence.account
    assert account is not None and account.taker("other processes").step_share == pytest.approx(0.3, abs=0.01)
    findings = run_rules(evidence).findings
    assert findings[0].family == "foreign_load", [item.rule_id for item in findings]
    loading = next(item for item in findings if item.family == "input_pipeline")
    assert loading.impact == pytest.approx(0.2, abs=0.01)
    assert any(item.metric == "data_wait_waiting_core_others" for item in loading.evidence)


def test_a_python_thread_that_takes_the_intra_op_threads_core_is_named_with_the_wait_it_caused():
    """On CPU all along, the training thread spins at the barriers of its parallel operators while
    its intra-op thread waits for the core a busy Python thread holds: the peers' wait (30 % of the
    step) is charged to the process's own threads — the Python thread's part is the excess it alone
    pushes over the cores — and the finding names the thread and says it took the cores."""
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_low_mfu_extra())
    record = _account(record, {})
    account = record.facts.thread_account
    duration = record.steps.duration_ns
    intra_op = ThreadInfo(native_id=3, name="python", function="", python=False,
                          cpu_ns=int(0.9 * duration.sum()))
    account = replace(account, peer_runq_ns=tuple(int(0.3 * duration[step]) for step in account.steps),
                      threads=(_python_thread(record, 0.3, name="telemetry", function="train.telemetry_loop"),
                               intra_op))
    # the process's other threads ran 1.2 cores beside the training thread (intra-op 0.9 + telemetry 0.3)
    process = tuple(tuple(int(cpu + 1.2 * wall) for cpu, wall in zip(cpu_row, wall_row))
                    for cpu_row, wall_row in zip(account.cpu_ns, account.wall_ns))
    record = replace(record, facts=replace(record.facts, thread_account=replace(account, process_cpu_ns=process)))
    evidence = ctx_of(record, {"cpu_count": 2, "cpu_util_mean": 1.0, "workers": (WorkerLoad(1, "main", 2.0),)})
    view = evidence.account
    assert view is not None and view.peer_waiting == pytest.approx(0.3, abs=0.01)
    assert view.taker("own threads").step_share == pytest.approx(0.3, abs=0.01)
    top = run_rules(evidence).findings[0]
    assert top.family == "gil_contention", [item.rule_id for item in run_rules(evidence).findings]
    assert top.title.startswith("Another Python thread took the cores the step needed")
    assert "`telemetry`" in top.title and "train.telemetry_loop" in top.prescriptions[0].action
    # without it, the intra-op thread (0.9) fits in the core the training thread leaves: the whole wait
    assert top.impact == pytest.approx(0.3, abs=0.02)


def test_unexplained_time_off_cpu_names_the_line_the_stack_samples_put_it_in():
    from stepscope.analysis.run.code_locations import CodeAttribution, CodeLocation, PhaseCode

    record = make_record(step_s=0.01, shares=COMPUTE, extra=_low_mfu_extra())
    record = _account(record, {"forward": 0.1, "backward": 0.9, "optimizer": 0.9})
    location = CodeLocation("/src/model.py", 40, "forward", False, 90, 0.85, 0.4, 0.3)
    code = CodeAttribution(100.0, "thread", 39, 100, (PhaseCode("forward", "main", 100, 0.5, (location,)),), None)
    top = run_rules(replace(ctx_of(record), code=code)).findings[0]
    assert top.family == "unexplained"
    assert top.prescriptions[0].action.startswith("Look at what model.py:40 forward() waits for")
    assert "model.py:40 forward() 85% of forward" in top.summary
    assert "py-spy dump" in top.prescriptions[1].action


def test_a_thread_joined_before_capture_ended_is_rated_over_the_time_it_lived():
    """It started 20 % into capture (after the imports) and ended at 60 %: its CPU over the whole
    run would understate it 2.5 times; over the time it lived it is the GIL thread it was."""
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_low_mfu_extra())
    duration = int(record.steps.duration_ns.sum())
    joined = replace(_python_thread(record, 0.9 * 0.4), since_ns=10**9 + int(0.2 * duration),
                     until_ns=10**9 + int(0.6 * duration))
    record = _account(record, {"forward": 0.2, "backward": 0.2, "optimizer": 0.2}, threads=(joined,))
    evidence = ctx_of(record)
    (thread,) = evidence.account.python_threads
    assert thread.cores == pytest.approx(0.9, abs=0.01)
    assert run_rules(evidence).findings[0].family == "gil_contention"


def _tiny_ops_extra(ops: int = 3000) -> dict:
    return {"flops": {"step_index": 3, "flops": 2e6, "ops": ops}, "cpu_matmul_peak_flops": PEAK}


def test_tiny_operators_are_priced_by_the_time_on_cpu_beyond_their_math_and_outrank_a_cheaper_gil_thread():
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_tiny_ops_extra())
    # the model's phases 70 % on CPU, the rest off CPU while a Python thread ran (the GIL)
    record = _account(record, {"forward": 0.7, "backward": 0.7, "optimizer": 0.7},
                      threads=(_python_thread(record, 0.3),))
    diagnosis = run_rules(ctx_of(record))
    families = [item.family for item in diagnosis.findings]
    assert families[:2] == ["launch_overhead", "gil_contention"], families
    launch = diagnosis.findings[0]
    # 0.95 of the step in the model × 0.7 on CPU, less the FLOPs' time at the peak (MFU ≤ 0.3 %)
    assert launch.impact_basis == "measured" and launch.impact == pytest.approx(0.95 * 0.7, abs=0.01)
    assert any(item.metric == "model_on_cpu_beyond_math" for item in launch.evidence)
    assert "launch_overhead" not in {item.family for item, _ in diagnosis.superseded}


def test_a_measured_operator_cost_states_its_lower_end_from_the_measure_s_error():
    """The model's time beyond its math also counts the rest of the model away from peak: on
    generated workloads it overshot the gain of removing tiny operators by up to 14 points of the
    step (90th percentile), which the cost's lower end takes off."""
    from stepscope.diagnosis.rules.launch_overhead import MEASURED_OVERSHOOT

    record = _account(make_record(step_s=0.01, shares=COMPUTE, extra=_tiny_ops_extra()), {})  # all on CPU
    launch = next(item for item in run_rules(ctx_of(record)).findings if item.family == "launch_overhead")
    assert launch.extra["impact_low"]["value"] == pytest.approx(launch.impact - MEASURED_OVERSHOOT, abs=1e-3)
    assert any(item.metric == "tiny_ops_cost_low" for item in launch.evidence)
    estimated = next(item for item in run_rules(ctx_of(make_record(step_s=0.01, shares=COMPUTE,
                                                                   extra=_tiny_ops_extra()))).findings
                     if item.family == "launch_overhead")
    assert "impact_low" not in estimated.extra  # an estimate ranks apart: no near tie to check


def test_tiny_operators_beside_a_single_process_loader_s_reads_are_a_near_tie_by_the_reads_whole_wait():
    """Blind seed 1898856003's w015 in miniature: a single-process loader reading from a slow store
    (40 % of the step waiting, off CPU 80 % of it) beside tiny operators measured at 52 % of the
    step. The reads are priced on the blocked part (32 %) but their removal gained 51 % (the tiny
    operators' 44 %): the verdict keeps its order and shows a near tie, since the operators' lower
    end (38 %) does not clear the reads' whole wait (40 %)."""
    from stepscope.diagnosis.near_tie import NEAR_TIE_CONFIDENCE

    shares = {"data_wait": 0.4, "forward": 0.22, "backward": 0.3, "optimizer": 0.03}
    record = make_record(step_s=0.01, shares=shares, extra=_tiny_ops_extra())
    record = _account(record, {"forward": 0.97, "backward": 0.97, "optimizer": 0.97, "data_wait": 0.2})
    findings = run_rules(ctx_of(record, dict(cpu_count=2, main_cpu_util=0.6, cpu_util_mean=0.35))).findings
    top = findings[0]
    reads = next(item for item in findings if item.family == "storage_io")
    assert top.family == "launch_overhead" and reads.impact == pytest.approx(0.4 * 0.8, abs=0.01)
    assert reads.extra["impact_high"]["value"] == pytest.approx(0.4, abs=0.01)
    assert top.confidence == NEAR_TIE_CONFIDENCE and top.extra["near_tie"]["family"] == "storage_io"
    assert "upper end, 40.0%" in top.summary


def test_tiny_operators_without_an_account_are_an_estimate_and_say_so():
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_tiny_ops_extra())
    launch = next(item for item in run_rules(ctx_of(record)).findings if item.family == "launch_overhead")
    assert launch.impact_basis.startswith("estimate") and launch.impact == pytest.approx(0.9, abs=0.01)


def test_tiny_operators_that_spend_little_time_on_cpu_beyond_their_math_are_no_finding():
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_tiny_ops_extra())
    record = _account(record, {"forward": 0.1, "backward": 0.1, "optimizer": 0.1})  # off CPU: not the operators
    assert tiny_ops_dominate(ctx_of(record)) is None


@pytest.mark.parametrize("ops, step_s, on_cpu, fires", [
    (1000, 0.03, 1.0, True), (1000, 0.03, 0.1, False), (60, 0.0015, 1.0, False), (150, 0.03, 1.0, False)],
    ids=["many-priced-10%-measured", "many-off-cpu", "a-small-model-s-few", "priced-1.5%"])
def test_tiny_operators_priced_below_the_level_fire_where_their_measured_cost_reaches_it(ops, step_s, on_cpu, fires):
    """A bare operator's price leaves out the module calls around each (blind w007 of seed
    1417138115: 4,090 operators of 13 µs priced at 13 % of the step, the thread on a CPU beyond the
    math 44 %; removing them gained 58 %). Many tiny operators priced at 5-15 % fire on the measured
    cost when it reaches 15 %; not a thread off CPU, not a small model's few operators in a short
    step (tiny too, and the time beyond their math is the model's own work), not fewer."""
    record = make_record(step_s=step_s, shares=COMPUTE, extra=_tiny_ops_extra(ops))
    record = _account(record, dict.fromkeys(COMPUTE, on_cpu))
    found = tiny_ops_dominate(ctx_of(record))
    assert (found is not None) == fires
    priced = ops * 3e-6 / step_s
    assert priced < 0.15
    if fires:
        assert found.impact_basis == "measured" and found.impact == pytest.approx(0.95, abs=0.01)
        assert next(item.value for item in found.evidence if item.metric == "overhead_share_estimate") == \
            pytest.approx(priced, abs=1e-3)


def test_time_off_cpu_beyond_what_the_python_thread_ran_is_not_the_gil_s():
    # the model's phases 80 % off CPU (a sleep in the step), the other Python thread on a CPU for
    # only 10 % of the run: it held the GIL at most that long
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_low_mfu_extra())
    record = _account(record, {"forward": 0.2, "backward": 0.2, "optimizer": 0.2},
                      threads=(_python_thread(record, 0.1),))
    found = next(item for item in run_rules(ctx_of(record)).findings if item.family == "gil_contention")
    assert found.impact == pytest.approx(0.1, abs=0.01)


@pytest.mark.parametrize("other_on_cpu, outside_shown", [(0.9, True), (0.2, False)])
def test_time_outside_the_model_the_thread_spent_on_a_cpu_is_its_own_code_s_not_the_gil_s(other_on_cpu, outside_shown):
    """Half the step outside the model beside a GIL thread: where the training thread ran on a CPU
    there (a list growing 4 MiB a step, blind w012 of seed 1417138115), that code is a finding of its
    own, ranked by its cost; where it sat waiting, the time is the GIL thread's symptom."""
    shares = {"forward": 0.2, "backward": 0.25, "optimizer": 0.05}  # the rest, half the step, is "other"
    record = make_record(step_s=0.01, shares=shares, extra=_low_mfu_extra())
    record = _account(record, {"forward": 0.2, "backward": 0.2, "optimizer": 0.2, "other": other_on_cpu},
                      threads=(_python_thread(record, 0.9),))
    diagnosis = run_rules(ctx_of(record))
    families = [item.family for item in diagnosis.findings]
    gil = next(item for item in diagnosis.findings if item.family == "gil_contention")
    assert gil.extra["other_waiting"] == pytest.approx(0.5 * (1.0 - other_on_cpu), abs=0.01)
    if outside_shown:
        assert families[:2] == ["outside_model", "gil_contention"], families
        assert not diagnosis.superseded
    else:
        assert "outside_model" not in families
        assert [(item.family, by) for item, by in diagnosis.superseded] == [("outside_model", gil.rule_id)]


def _slept(record, phase_kinds: dict[str, dict[str, int]]):
    """The record with the wait sampler's samples: per steady step, ``phase -> {wait class: samples}``."""
    waits = tuple((step, PHASES.index(phase), WAIT_CLASSES.index(kind), count)
                  for step in range(len(record.steps)) for phase, kinds in phase_kinds.items()
                  for kind, count in kinds.items())
    account = replace(record.facts.thread_account, waits=waits, wait_interval_ns=5_000_000)
    return replace(record, facts=replace(record.facts, thread_account=account))


def _gil_thread_record(shares: dict[str, float] = COMPUTE, on_cpu: float = 0.2):
    record = make_record(step_s=0.01, shares=shares, extra=_low_mfu_extra())
    return _account(record, dict.fromkeys(shares, on_cpu), threads=(_python_thread(record, 0.9),))


def test_a_step_asleep_in_a_sleep_beside_a_computing_thread_is_not_the_gil_s():
    # the same account as the GIL's verdict above, but the sampler saw the thread asleep in a
    # sleep, not on a lock: the other thread ran while the step slept, it did not hold it up
    record = _slept(_gil_thread_record(), {phase: {"sleep": 3} for phase in COMPUTE})
    view = ctx_of(record).account
    assert view.phase("forward").off_split == (("unexplained", 1.0),)
    assert view.gil_wait == 0.0
    findings = run_rules(ctx_of(record)).findings
    assert findings[0].family == "unexplained", [item.title for item in findings]
    assert "gil_contention" not in {item.family for item in findings}


def test_the_gil_s_cost_is_the_part_of_the_time_off_cpu_asleep_on_a_lock():
    record = _slept(_gil_thread_record(), {phase: {"lock": 1, "sleep": 1} for phase in COMPUTE})
    found = next(item for item in run_rules(ctx_of(record)).findings if item.family == "gil_contention")
    assert found.impact == pytest.approx(0.95 * 0.8 / 2, abs=0.02)
    assert any(item.metric == "gil_lock_samples" and "a lock" in item.scope for item in found.evidence)


def test_too_few_samples_leave_the_inferred_cause():
    record = _gil_thread_record()
    steps = len(record.steps)
    sparse = _slept(record, {"forward": {"sleep": 1}})
    sparse = replace(sparse, facts=replace(sparse.facts, thread_account=replace(
        sparse.facts.thread_account, waits=sparse.facts.thread_account.waits[: MIN_WAIT_SAMPLES // 2])))
    assert steps > MIN_WAIT_SAMPLES // 2
    view = ctx_of(sparse).account
    assert view.phase("forward").off_split == () and view.phase("forward").off_cause == "gil"


def test_a_single_process_loader_asleep_on_a_lock_waits_for_the_gil_and_in_a_read_for_its_source():
    shares = {"data_wait": 0.5, **{name: share / 2 for name, share in COMPUTE.items()}}
    record = _gil_thread_record(shares)
    unmeasured = ctx_of(record).account.phase("data_wait")
    assert unmeasured.off_cause == "io" and unmeasured.off_part("gil") == 0.0  # inferred: the source's
    locked = ctx_of(_slept(record, {"data_wait": {"lock": 3, "pipe": 1}})).account.phase("data_wait")
    assert locked.off_split == (("gil", 0.75), ("io", 0.25)) and locked.off_cause == "gil"
    gil = next(item for item in run_rules(ctx_of(_slept(record, {"data_wait": {"lock": 3, "pipe": 1}}))).findings
               if item.family == "gil_contention")
    assert "data_wait" in gil.claims and "single-process loader" in gil.summary


def test_the_wait_for_the_gil_after_a_single_process_loader_s_reads_is_charged_to_both_causes():
    # half the step in a single-process loader's fetch, off CPU 80 % of it: half of that asleep in reads,
    # half on a lock while another Python thread held the GIL. Each read releases the GIL and the thread
    # takes it: fewer or faster reads remove the wait to take it back as removing the thread would
    shares = {"data_wait": 0.5, **{name: share / 2 for name, share in COMPUTE.items()}}
    record = _slept(_gil_thread_record(shares), {"data_wait": {"lock": 1, "pipe": 1}})
    findings = {item.family: item for item in run_rules(ctx_of(record, dict(cpu_count=2, main_cpu_util=0.3,
                                                                              cpu_util_mean=0.4))).findings}
    source, gil = findings["storage_io"], findings["gil_contention"]
    after_reads = 0.5 * 0.8 * 0.5
    assert source.impact == pytest.approx(0.5 * 0.8, abs=0.01)  # the whole blocked wait, reads and GIL
    assert source.extra["impact_low"]["value"] == pytest.approx(0.5 * 0.8 - after_reads, abs=0.01)  # the reads
    assert "take the GIL back" in source.summary
    assert gil.extra["impact_low"]["value"] == pytest.approx(gil.impact - after_reads, abs=0.01)
    assert "after the single-process loader's blocking reads" in gil.summary
    # a fetch that never blocked in a read: the GIL's wait there is the thread's alone
    locked = _slept(_gil_thread_record(shares), {"data_wait": {"lock": 1}})
    alone = next(item for item in run_rules(ctx_of(locked)).findings if item.family == "gil_contention")
    assert "impact_low" not in alone.extra


def _busy_workers(record, own_share: float):
    """The record's evidence with its one DataLoader worker measured busy and the training thread's
    wait for a core (in the model's phases) charged ``own_share`` to the run's own processes."""
    from stepscope.analysis.run.account import CoreTaker

    evidence = ctx_of(record)
    account = replace(evidence.account, takers=(CoreTaker("own processes", 0.9, own_share),))
    return replace(evidence, account=account, loader_cpu=replace(evidence.loader_cpu, util=0.9, source="workers"))


def test_the_wait_for_a_core_busy_workers_cause_beyond_the_data_wait_is_the_input_finding_s_cost():
    shares = {"data_wait": 0.2, "forward": 0.4, "backward": 0.3}
    record = make_record(step_s=0.01, shares=shares, num_workers=1, persistent=True)
    record = _account(record, on_cpu={"forward": 0.5, "backward": 0.5}, runq={"forward": 0.5, "backward": 0.5})
    evidence = _busy_workers(record, 0.35)  # of a wait for a core of 0.35 of the step, all in the model's phases
    loading = next(item for item in run_rules(evidence).findings if item.family == "input_pipeline")
    assert loading.impact == pytest.approx(0.2 + 0.35, abs=0.02)
    assert any(item.metric == "core_wait_workers_caused" for item in loading.evidence)
    assert "compute" in loading.claims
    # workers started anew every epoch spend that CPU starting: the epoch boundary's, not priced here
    restarted = make_record(step_s=0.01, shares=shares, num_workers=1, loader_init={3: 0.01, 13: 0.01, 23: 0.01})
    restarted = _account(restarted, on_cpu={"forward": 0.5, "backward": 0.5}, runq={"forward": 0.5, "backward": 0.5})
    found = [item for item in run_rules(_busy_workers(restarted, 0.35)).findings if item.family == "input_pipeline"]
    assert found and not any(e.metric == "core_wait_workers_caused" for item in found for e in item.evidence)


def test_a_single_process_loader_s_unsplit_wait_beside_a_busy_python_thread_is_said_uncertain():
    """Blind seed 446669882, w023, in miniature: a 25 % data wait in a loader without workers
    beside a Python thread that ran a quarter of a core, the training thread on CPU in the accounted
    steps and no samples of it asleep to split the wait: the wait may be the GIL's, so the input
    finding says so and stays below the calibration's upper band. A thread that ran far less than
    the wait (it holds the GIL at most while it runs) leaves the input finding as it was."""
    shares = {"data_wait": 0.25, "forward": 0.3, "backward": 0.35, "optimizer": 0.05}

    def input_finding(cores: float, data_wait: float = 0.25):
        model = (1.0 - data_wait) / (1.0 - shares["data_wait"])
        record = make_record(step_s=0.01, num_workers=0, shares={
            name: data_wait if name == "data_wait" else share * model for name, share in shares.items()})
        # the fetch in the training thread, on CPU (the loading's CPU is measured: CPU-bound)
        steps = record.steps
        record = replace(record, steps=StepTable.from_columns({**steps.columns(), "data_wait_cpu_ns": steps.data_wait_ns}))
        threads = (_python_thread(record, cores, name="telemetry"),) if cores else ()
        record = _account(record, {}, threads=threads)
        return next(item for item in run_rules(ctx_of(record)).findings if item.family == "input_pipeline")

    assert input_finding(0.0).confidence > 0.9  # alone, the CPU-bound wait is the loading's
    unsure = input_finding(0.25)
    assert unsure.rule_confidence <= 0.6 and unsure.confidence < 0.8
    assert any(item.metric == "busy_python_thread_cores" for item in unsure.evidence)
    assert "`telemetry`" in unsure.summary and "may be the GIL's" in unsure.summary
    sure = input_finding(0.1, data_wait=0.6)
    assert sure.confidence > 0.9 and not any(item.metric == "busy_python_thread_cores" for item in sure.evidence)


def test_the_foreign_cost_states_its_lower_end_the_thread_s_own_wait_in_the_model():
    """The neighbour is charged the training thread's wait for a core and its intra-op threads'
    (their barrier waits for them); the lower end is the training thread's own wait in forward,
    backward and optimizer. Here the data wait (35 % of the step, on CPU) costs more than that end:
    the verdict stays the neighbour's, at a near tie's confidence, saying why."""
    record = make_record(step_s=0.01, shares={"data_wait": 0.35, "forward": 0.35, "backward": 0.25,
                                              "optimizer": 0.05})
    record = _account(record, on_cpu={"forward": 0.7, "backward": 0.7, "optimizer": 0.7},
                      runq={"forward": 0.3, "backward": 0.3, "optimizer": 0.3})
    account = record.facts.thread_account
    peers = tuple(int(0.25 * sum(row)) for row in account.wall_ns)  # the intra-op threads waited 25 % of each step
    record = replace(record, facts=replace(record.facts, thread_account=replace(account, peer_runq_ns=peers)))
    # 2 cores, 95 % busy, the training process 1.0 of them: others held 0.9 cores
    evidence = ctx_of(record, {"cpu_count": 2, "cpu_util_mean": 0.95, "workers": (WorkerLoad(1, "main", 1.0),)})
    assert evidence.account.model_waiting == pytest.approx(0.195, abs=0.005)
    findings = run_rules(evidence).findings
    top = findings[0]
    assert top.family == "foreign_load", [item.rule_id for item in findings]
    assert top.impact == pytest.approx(0.195 + 0.25, abs=0.01)
    assert top.extra["impact_low"]["value"] == pytest.approx(0.195, abs=0.005)
    assert any(item.metric == "foreign_step_cost_low" for item in top.evidence)
    assert "near_tie" in top.extra and top.confidence <= 0.67, (top.confidence, top.extra)


def test_tiny_operators_are_priced_at_the_cost_this_machine_measured():
    """On a machine twice as slow per operator as the reference, the estimate doubles and says
    where its price comes from."""
    from stepscope.analysis.bundle import REFERENCE_OP_COST_S
    from stepscope.record.run import OpCost

    record = make_record(step_s=0.01, shares=COMPUTE, extra=_tiny_ops_extra(1000))
    assumed = ctx_of(record).op_overhead
    slower = replace(record, facts=replace(record.facts, op_cost=OpCost(2 * REFERENCE_OP_COST_S, 2 * REFERENCE_OP_COST_S)))
    measured = ctx_of(slower).op_overhead
    assert assumed.share == pytest.approx(0.3) and not assumed.measured
    assert measured.measured and measured.share == pytest.approx(0.6)
    launch = next(item for item in run_rules(ctx_of(slower)).findings if item.family == "launch_overhead")
    assert launch.impact_basis == ("estimate: operators × 6.0 µs (91% of a tiny layer's per-operator cost measured "
                                   "on this machine) of host cost each")


def test_the_intra_op_threads_wait_is_charged_to_what_ran_beside_them_not_to_themselves():
    """A neighbour holds one of the two cores; the training thread never waits for a core (it spins
    at the parallel operators' barrier, on CPU), its intra-op thread does: 30 % of each step. The
    process's other CPU is that intra-op thread's own, so its wait is the neighbour's (charged by
    CPU share with the intra-op thread as a taker, the neighbour carried a third of it and a data
    wait of 11 % outranked it: the blind evaluation's w030, +46 % without the neighbour)."""
    record = make_record(step_s=0.01, shares={"data_wait": 0.11, "forward": 0.35, "backward": 0.45,
                                              "optimizer": 0.09})
    record = _account(record, on_cpu={})
    account = record.facts.thread_account
    peers = tuple(int(0.3 * sum(row)) for row in account.wall_ns)
    intra_op = ThreadInfo(native_id=3, name="python", function="", python=False,
                          cpu_ns=int(0.5 * record.steps.duration_ns.sum()))
    # the process's other threads (the intra-op one) ran 0.5 cores beside the training thread
    process = tuple(tuple(int(cpu + 0.5 * wall) for cpu, wall in zip(cpu_row, wall_row))
                    for cpu_row, wall_row in zip(account.cpu_ns, account.wall_ns))
    account = replace(account, peer_runq_ns=peers, threads=(intra_op,), process_cpu_ns=process)
    record = replace(record, facts=replace(record.facts, thread_account=account))
    # 2 cores all busy: the training process 1.5 of them, a neighbour the rest
    evidence = ctx_of(record, {"cpu_count": 2, "cpu_util_mean": 1.0, "workers": (WorkerLoad(1, "main", 1.5),),
                               "foreign_processes": ((77, "python", 0.5),)})
    view = evidence.account
    assert view is not None and view.waiting_core == 0.0 and view.peer_waiting == pytest.approx(0.3, abs=0.01)
    assert view.taker("other processes").step_share == pytest.approx(0.3, abs=0.01)
    assert view.taker("own threads").step_share == pytest.approx(0.0, abs=0.001)
    top = run_rules(evidence).findings[0]
    assert top.family == "foreign_load", [(item.rule_id, item.impact) for item in run_rules(evidence).findings]
    assert top.impact == pytest.approx(0.3, abs=0.02)
    assert "intra-op threads" in top.title


def _timed_workers(record, wall_s: float, runq_s: float, workers: int = 2):
    """``record`` with ``workers`` DataLoader workers taking turns, one timed batch a step, each
    ``wall_s`` long: ``runq_s`` waiting for a core, the rest on a CPU."""
    return timed_workers(record, wall_s, wall_s - runq_s, runq_s, workers)


def _gil_thread_beside_workers(worker_wall_s: float, worker_runq_s: float):
    """A training thread waiting for a core 40 % of its model phases (off CPU 10 %), a Python thread
    at 0.3 of a core and two DataLoader workers at 0.4 each, whose timed batches take ``worker_wall_s``, of it
    ``worker_runq_s`` waiting for a core: the Python thread and the workers are each charged the whole wait (without either
    group the rest would fit in the core the training thread leaves)."""
    shares = {"data_wait": 0.1, "forward": 0.45, "backward": 0.35, "optimizer": 0.05}
    record = make_record(step_s=0.01, shares=shares, num_workers=2, extra=_low_mfu_extra())
    runq = {name: 0.4 for name in COMPUTE}
    record = _account(record, {name: 0.5 for name in COMPUTE}, runq,
                      threads=(_python_thread(record, 0.3, name="telemetry", function="train.telemetry_loop"),))
    account = record.facts.thread_account  # the process's CPU: the training thread's and the Python thread's 0.3
    process = tuple(tuple(int(cpu + 0.3 * wall) for cpu, wall in zip(cpu_row, wall_row))
                    for cpu_row, wall_row in zip(account.cpu_ns, account.wall_ns))
    record = replace(record, facts=replace(record.facts, thread_account=replace(account, process_cpu_ns=process)))
    record = _timed_workers(record, worker_wall_s, worker_runq_s)
    loads = (WorkerLoad(1, "main", 1.3), WorkerLoad(4242, "dataloader_worker", 0.4),
             WorkerLoad(4243, "dataloader_worker", 0.4))
    evidence = ctx_of(record, {"cpu_count": 2, "cpu_util_mean": 1.0, "workers": loads})
    return evidence, next(item for item in run_rules(evidence).findings if item.family == "gil_contention")


def test_a_wait_for_a_core_that_starved_workers_share_gives_the_gil_price_a_lower_end_and_no_high_confidence():
    """Blind seed 968692081, w038: the workers waited for a core half their time per batch, so they
    take the cores the GIL thread leaves; its price (mostly that wait) comes back only in part."""
    evidence, found = _gil_thread_beside_workers(0.02, 0.01)
    account = evidence.account
    assert account.taker("own processes").step_share >= 0.5 * account.python_core_wait > 0
    assert found.impact > account.gil_wait and found.confidence < 0.7
    assert found.extra["impact_low"]["value"] == pytest.approx(account.gil_wait, abs=1e-3)
    assert "come back only in part" in found.summary
    assert any(item.metric == "workers_waiting_core_share" and item.value == pytest.approx(0.5) for item in found.evidence)
    # workers as fast on a CPU that never waited for one (the same floor) take none of the thread's
    # cores: the same price, confident
    _, alone = _gil_thread_beside_workers(0.01, 0.0)
    assert alone.impact == pytest.approx(found.impact) and alone.confidence > 0.9
    assert "impact_low" not in alone.extra and "come back only in part" not in alone.summary


def test_starved_workers_beside_busy_cores_are_busy_and_their_wait_for_a_core_is_the_input_finding_s():
    """Every core busy, the loaders' CPU while the step waits (0.3 of a core) is not conclusive; the
    workers' own timing is: half of each batch waiting for a core, never off CPU. The wait for a
    core their CPU caused in the model's phases is then the input finding's cost too: cheaper
    samples give it back."""
    shares = {"data_wait": 0.2, "forward": 0.4, "backward": 0.3}
    record = make_record(step_s=0.01, shares=shares, num_workers=2, persistent=True)
    record = _account(record, on_cpu={"forward": 0.5, "backward": 0.5}, runq={"forward": 0.5, "backward": 0.5})
    record = _timed_workers(record, 0.008, 0.004)
    evidence = _busy_workers(record, 0.35)
    from stepscope.analysis.evidence import MacroSignals
    from stepscope.diagnosis.rules._common import loader_cpu_util, starved_workers

    evidence = replace(evidence, loader_cpu=replace(evidence.loader_cpu, util=0.3),
                       signals=MacroSignals(cpu_count=2, cpu_util_mean=1.0))

    assert loader_cpu_util(evidence)[0] is None and starved_workers(evidence) == pytest.approx(0.5)
    loading = next(item for item in run_rules(evidence).findings if item.family == "input_pipeline")
    caused = next(item for item in loading.evidence if item.metric == "core_wait_workers_caused")
    assert caused.value == pytest.approx(0.35, abs=0.02)
    assert loading.impact == pytest.approx(0.2 + 0.35, abs=0.02) and "compute" in loading.claims
    assert "starved" in loading.summary
    # workers that wait on reads (off CPU a third of each batch) are not starved: nothing is added
    idle = _timed_workers(record, 0.008, 0.003)
    idle = replace(idle, facts=replace(idle.facts, worker_batches=replace(
        idle.facts.worker_batches, cpu_ns=tuple(round(0.002 * 1e9) for _ in idle.facts.worker_batches.cpu_ns))))
    evidence = replace(_busy_workers(idle, 0.35), signals=evidence.signals, loader_cpu=evidence.loader_cpu)
    assert starved_workers(evidence) is None
    assert not any(e.metric == "core_wait_workers_caused" for item in run_rules(evidence).findings
                   for e in item.evidence)


def test_workers_that_measured_themselves_blocked_beside_busy_cores_are_idle_not_starved():
    """Every core busy (a neighbour), the loaders' CPU while the step waits (0.1 of a core) was not
    conclusive: they might have been starved. The one worker's own timing says otherwise: 16 of its
    20 ms a batch off CPU and not waiting for a core, 3 ms waiting for one. It is blocked (slow
    reads), so the storage/latency finding names it, not "make each sample cheaper" (blind w021 of
    seed 1699417522: slow reads +75 %, the neighbour +16 %)."""
    from stepscope.analysis.evidence import MacroSignals
    from stepscope.diagnosis.rules._common import blocked_workers, loader_cpu_util

    shares = {"data_wait": 0.5, "forward": 0.25, "backward": 0.2}
    record = make_record(step_s=0.022, shares=shares, num_workers=1, persistent=True)
    record = _account(record, on_cpu={"forward": 0.5, "backward": 0.5}, runq={"forward": 0.45, "backward": 0.45})

    def worker(cpu_s: float, runq_s: float):
        timed = _timed_workers(record, 0.020, runq_s, workers=1)
        batches = replace(timed.facts.worker_batches, cpu_ns=tuple(round(cpu_s * 1e9) for _ in timed.facts.worker_batches.cpu_ns))
        evidence = ctx_of(replace(timed, facts=replace(timed.facts, worker_batches=batches)))
        return replace(evidence, loader_cpu=replace(evidence.loader_cpu, util=0.1, source="sampler"),
                       signals=MacroSignals(cpu_count=2, cpu_util_mean=0.95))

    blocked = worker(0.001, 0.003)
    assert blocked_workers(blocked) == pytest.approx(0.8)
    util, source = loader_cpu_util(blocked)
    assert util == 0.1 and "blocked, not starved (measured in the workers)" in source
    top = run_rules(blocked).findings[0]
    assert top.rule_id == "storage_io.loader_waits_on_io", [(item.rule_id, item.impact) for item in run_rules(blocked).findings]
    # a worker that waited for a core as long as it slept may have been starved: not conclusive
    for cpu_s, runq_s in ((0.001, 0.008), (0.012, 0.003)):  # waiting 40 %; or on CPU most of it, off CPU 25 %
        evidence = worker(cpu_s, runq_s)
        assert blocked_workers(evidence) is None and loader_cpu_util(evidence)[0] is None


def _gil_thread_beside_a_neighbour(neighbour_cores: float):
    """A training thread waiting for a core 40 % of its model phases (off CPU 10 %), a Python thread
    at 0.3 of a core, and another tenant's process at ``neighbour_cores`` on a 2-core machine."""
    record = make_record(step_s=0.01, shares=COMPUTE, extra=_low_mfu_extra())
    record = _account(record, {name: 0.5 for name in COMPUTE}, {name: 0.4 for name in COMPUTE},
                      threads=(_python_thread(record, 0.3, name="telemetry", function="train.telemetry_loop"),))
    account = record.facts.thread_account
    process = tuple(tuple(int(cpu + 0.3 * wall) for cpu, wall in zip(cpu_row, wall_row))
                    for cpu_row, wall_row in zip(account.cpu_ns, account.wall_ns))
    record = replace(record, facts=replace(record.facts, thread_account=replace(account, process_cpu_ns=process)))
    evidence = ctx_of(record, {"cpu_count": 2, "cpu_util_mean": (0.8 + neighbour_cores) / 2,
                               "workers": (WorkerLoad(1, "main", 0.8),),
                               "foreign_processes": ((77, "python", neighbour_cores),)})
    return evidence, next(item for item in run_rules(evidence).findings if item.family == "gil_contention")


def test_a_wait_for_a_core_a_neighbour_shares_gives_the_gil_price_a_lower_end_and_no_high_confidence():
    """Blind seed 926838169, w009: the GIL thread and a neighbour were each charged most of the same
    wait for a core (51 % and 46 %); removing the thread gained 20 %, the neighbour 51 %. A neighbour
    with more to run takes the cores the thread leaves: the price states the GIL's own wait as its
    lower end, in the prescription's range too, and the confidence stays below the upper band."""
    evidence, found = _gil_thread_beside_a_neighbour(0.9)
    account = evidence.account
    shared = account.taker("other processes").step_share
    assert shared >= 0.5 * account.python_core_wait > account.gil_wait > 0
    assert found.impact > account.gil_wait and found.confidence < 0.7
    assert found.extra["impact_low"]["value"] == pytest.approx(account.gil_wait, abs=1e-3)
    assert "come back only in part" in found.summary and "other processes are charged" in found.summary
    assert any(item.metric == "other_processes_core_wait_share" and item.value == pytest.approx(shared, abs=1e-3)
               for item in found.evidence)
    prescription = found.prescriptions[0]
    over, _ = GAIN_ERROR["gil"]  # the gain model's low end, or the GIL's own wait where that is lower
    assert prescription.expected_range[0] == pytest.approx(min(found.impact - over, account.gil_wait), abs=1e-3)
    assert "at least" in prescription.why
    assert found.rule_confidence == pytest.approx(SHARED_WAIT_CONFIDENCE * CROWDED_CONFIDENCE)
    # a light neighbour (charged less than half the thread's part of the wait): one price, and the
    # rule's own confidence (both lowered as on any crowded machine)
    quiet, alone = _gil_thread_beside_a_neighbour(0.1)
    assert quiet.account.taker("other processes").step_share < 0.5 * quiet.account.python_core_wait
    assert alone.rule_confidence == pytest.approx(0.8 * CROWDED_CONFIDENCE) and "impact_low" not in alone.extra
    assert "come back only in part" not in alone.summary
    _assert_stated_with_its_error(alone.prescriptions[0], "gil")
