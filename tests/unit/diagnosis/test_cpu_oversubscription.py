from __future__ import annotations

import pytest

from diagnosis_records import ctx_of, make_record, workers
from stepscope.analysis.evidence import WorkerLoad
from stepscope.diagnosis.rules.cpu_oversubscription import oversubscribed_cpu

INPUT = {"data_wait": 0.5, "forward": 0.3, "backward": 0.15}


@pytest.mark.parametrize("signals, fires", [
    # run queue 5 per core, this run's 4 workers use the cores
    (dict(cpu_count=2, cpu_util_mean=0.99, runnable_threads_per_core=5.0, workers=workers(4, 0.45)), True),
    # thread counts known: 2 intra-op + 4 workers × 4 threads on 2 cores
    (dict(cpu_count=2, cpu_util_mean=0.98, workers=workers(4, 0.5, threads=4)), True),
    # 4 threads per worker, but the run queue says they do not run (helper threads sleep)
    (dict(cpu_count=2, cpu_util_mean=0.98, runnable_threads_per_core=1.1, workers=workers(2, 0.95, threads=4)),
     False),
    # many threads and a full run queue, but this run uses little of the cores: a neighbour's crowd
    (dict(cpu_count=2, cpu_util_mean=0.99, runnable_threads_per_core=2.4, workers=workers(2, 0.5, threads=4)),
     False),
    # one single-threaded worker: 3 threads
    (dict(cpu_count=2, cpu_util_mean=0.98, workers=workers(1, 0.9, threads=1)), False),
    # crowded, but by other processes: this run uses 0.4 cores
    (dict(cpu_count=2, cpu_util_mean=0.99, runnable_threads_per_core=5.0, workers=workers(4, 0.1)), False),
    # cores not busy: low utilisation and no run queue
    (dict(cpu_count=2, cpu_util_mean=0.4, runnable_threads_per_core=1.2, workers=workers(4, 0.45)), False),
    # a mean under 85 % (the run's start-up is in it), but 4 runnable threads per core while this
    # run's workers use the cores: saturated
    (dict(cpu_count=2, cpu_util_mean=0.8, runnable_threads_per_core=4.0, workers=workers(4, 0.4)), True),
    (None, False),
])
def test_oversubscribed_cpu(signals, fires):
    finding = oversubscribed_cpu(ctx_of(make_record(shares=INPUT, num_workers=4), signals))
    assert (finding is not None) == fires
    if fires:
        assert finding.family == "cpu_oversubscription"
        assert finding.impact >= 0.5


def test_never_prescribes_more_workers():
    signals = dict(cpu_count=2, cpu_util_mean=0.99, workers=workers(4, 0.5, threads=4))
    finding = oversubscribed_cpu(ctx_of(make_record(shares=INPUT, num_workers=4), signals))
    for item in finding.prescriptions:
        if item.setting == "num_workers":
            assert item.suggested < item.current
        if item.setting == "worker_threads":
            assert item.suggested == 1
    assert any(item.setting == "num_workers" for item in finding.prescriptions)


def test_on_a_virtual_machine_the_cores_the_hypervisor_kept_are_not_the_runs():
    # 4 workers × 4 threads; the tree runs 1.2 cores because the hypervisor gave 0.6 of the 2 to
    # other guests: saturated, and the tree uses most of what the guest got
    stolen = dict(cpu_count=2, cpu_util_mean=0.68, steal_share=0.3, runnable_threads_per_core=4.0,
                  workers=workers(4, 0.3, threads=4))
    assert oversubscribed_cpu(ctx_of(make_record(shares=INPUT, num_workers=4), stolen)) is not None
    quiet_host = dict(stolen, steal_share=0.0)  # the same numbers without steal: half the machine idles
    assert oversubscribed_cpu(ctx_of(make_record(shares=INPUT, num_workers=4), quiet_host)) is None


def test_workers_starting_every_epoch_are_the_epoch_boundary_s_cost_not_the_crowd_s():
    """Workers restarted every 2 steps (no persistent_workers): most of the data wait is their
    start-up, which the epoch boundary finding claims and fixes; the crowd's cost is the rest."""
    from stepscope.diagnosis.engine import run_rules

    record = make_record(steps=40, shares={"data_wait": 0.2, "forward": 0.3, "backward": 0.15}, num_workers=2,
                         loader_init={index: 0.05 for index in range(2, 40, 2)})
    evidence = ctx_of(record, dict(cpu_count=2, cpu_util_mean=0.99, runnable_threads_per_core=2.4,
                                   workers=workers(2, 0.9)))
    crowd = oversubscribed_cpu(evidence)
    steady = evidence.steady
    assert steady.loader_init_share > 0.6 and steady.data_wait_share > 0.75
    assert crowd is not None and steady.fetch_wait_share <= crowd.impact < 0.2  # not the 78 % start-up wait
    assert any(item.metric == "worker_startup_share" for item in crowd.evidence)
    top = run_rules(evidence).findings[0]
    assert top.rule_id == "epoch_boundary.worker_startup", [(item.rule_id, item.impact) for item in
                                                            run_rules(evidence).findings]


#: The training process, busy on its core.
MAIN = (WorkerLoad(pid=1, role="main", cpu_util=0.95, threads=7),)


def test_default_workers_threads_that_exist_are_not_threads_that_run():
    """Two default DataLoader workers (3 OS threads each: one computes) busy with costly samples
    beside 2 intra-op threads on 2 cores: the run queue (2.1 a core: 4.2 threads) is what the
    training process's threads and one thread per worker make. The cores are oversubscribed by the
    run's own processes, but "one thread per worker" is not the fix: it is not prescribed."""
    signals = dict(cpu_count=2, cpu_util_mean=0.98, runnable_threads_per_core=2.1, workers=MAIN + workers(2, 0.5, threads=3))
    finding = oversubscribed_cpu(ctx_of(make_record(shares=INPUT, num_workers=2), signals))
    assert finding is not None and finding.extra["threaded_workers"] is False
    assert not any(item.setting == "worker_threads" for item in finding.prescriptions)
    # the same workers with a run queue their extra threads fill (4 a core: 8 threads): threaded
    threaded = oversubscribed_cpu(ctx_of(make_record(shares=INPUT, num_workers=2),
                                         dict(signals, runnable_threads_per_core=4.0)))
    assert threaded.extra["threaded_workers"] is True
    assert any(item.setting == "worker_threads" for item in threaded.prescriptions)


def test_costly_samples_in_single_threaded_workers_are_ranked_by_cost_beside_the_crowd():
    """Blind seed 1167454856, w012, in miniature: the input finding prescribes cheaper samples (2
    workers on 2 cores: more workers cannot help), which the crowd does not contradict — it is
    shown, not superseded, and ranked with the oversubscription finding by cost. With threaded
    workers the crowd is the cause and the input finding stays moot."""
    from stepscope.diagnosis.engine import run_rules

    record = make_record(shares={"data_wait": 0.5, "forward": 0.3, "backward": 0.15}, num_workers=2, persistent=True)
    single = dict(cpu_count=2, cpu_util_mean=0.98, runnable_threads_per_core=2.1, workers=MAIN + workers(2, 0.5, threads=3))
    diagnosis = run_rules(ctx_of(record, single))
    families = [item.family for item in diagnosis.findings]
    assert "input_pipeline" in families and "cpu_oversubscription" in families, families
    loading = next(item for item in diagnosis.findings if item.family == "input_pipeline")
    assert loading.prescriptions[0].setting is None and loading.prescriptions[0].action.startswith("Make each sample")
    threaded = run_rules(ctx_of(record, dict(single, runnable_threads_per_core=4.0)))
    assert threaded.findings[0].family == "cpu_oversubscription"
    assert "input_pipeline" in {item.family for item, _ in threaded.superseded}


def test_workers_measured_on_one_thread_do_not_fill_a_queue_of_their_own():
    """Zoo worker-tokenize as a CI run once measured it: two default workers (3 OS threads each)
    busy on their main threads, the training process on one intra-op thread waiting for data,
    2 cores, a run queue of 2.1 a core. The tree's threads that run are 1 + 2 × 1.05: they cannot
    fill 4.2; the crowd is short-lived threads, and the input finding leads. Without the measured
    threads (older files) the run queue's inference is kept."""
    from stepscope.diagnosis.engine import run_rules

    record = make_record(shares={"data_wait": 0.85, "forward": 0.08, "backward": 0.05}, num_workers=2,
                         persistent=True, intra_op_threads=1)
    main = (WorkerLoad(pid=1, role="main", cpu_util=0.2, threads=5, running_threads=1.1),)
    measured = dict(cpu_count=2, cpu_util_mean=0.97, runnable_threads_per_core=2.1,
                    workers=main + workers(2, 0.95, threads=3, running=1.05))
    assert oversubscribed_cpu(ctx_of(record, measured)) is None
    assert run_rules(ctx_of(record, measured)).findings[0].family == "input_pipeline"
    inferred = dict(measured, workers=main + workers(2, 0.95, threads=3))
    assert oversubscribed_cpu(ctx_of(record, inferred)) is not None


def test_workers_measured_on_several_threads_are_the_crowd():
    """Zoo oversubscribed as measured: 4 workers × 6 OS threads running on ~2.6 each (4 intra-op
    threads), the training process's 2, on 2 cores: threaded, and the measure is shown."""
    record = make_record(shares=INPUT, num_workers=4)
    signals = dict(cpu_count=2, cpu_util_mean=0.98, runnable_threads_per_core=4.4,
                   workers=MAIN + workers(4, 0.34, threads=6, running=2.6))
    finding = oversubscribed_cpu(ctx_of(record, signals))
    assert finding is not None and finding.extra["threaded_workers"] is True
    shown = {item.metric: item.value for item in finding.evidence}
    assert shown["worker_running_threads"] == 2.6
    assert any(item.setting == "worker_threads" for item in finding.prescriptions)
    # the same run queue with workers measured on one thread each: the training process's 2 intra-op
    # threads and 4 busy workers can fill 2 a core, so the crowd is still the run's, but one thread
    # per worker is not the fix (the run queue alone would have called them threaded)
    single = oversubscribed_cpu(ctx_of(record, dict(signals, workers=MAIN + workers(4, 0.45, threads=6, running=1.0))))
    assert single is not None and single.extra["threaded_workers"] is False
    assert not any(item.setting == "worker_threads" for item in single.prescriptions)


def test_a_light_worker_s_feeder_thread_is_no_thread_that_competes():
    """Workers whose main threads mostly sleep (slow reads) at 0.12 of a core spend a large share of
    that in their queue's feeder thread: 1.6 threads measured, 0.05 of a core beyond the main
    thread. That competes for nothing: the workers count one thread each, as the run queue alone
    would have counted them."""
    from stepscope.analysis.host_cpu import cpu_demand
    from stepscope.analysis.evidence import MacroSignals

    light = MacroSignals(cpu_count=2, cpu_util_mean=0.98, runnable_threads_per_core=2.6,
                         workers=MAIN + workers(2, 0.12, threads=3, running=1.6))
    demand = cpu_demand(light, 2, 2)
    assert demand.worker_running_threads == 1.0 and demand.running_demand == 4.0
    busy = cpu_demand(MacroSignals(**{**light.__dict__, "workers": MAIN + workers(2, 0.4, threads=3, running=1.6)}),
                      2, 2)
    assert busy.worker_running_threads == 1.6 and busy.running_demand == pytest.approx(5.2)


def test_workers_restarted_every_epoch_count_for_the_part_of_the_window_they_lived():
    """Zoo cold-files as a CI run measured it beside four busy processes of another job (0.85 of a
    core): workers restarted every epoch, six worker processes in the window, two at a time, each on
    one thread; a run queue of 3.3 a core. Counted as if all six ran at once, the tree's threads
    (1 + 6) could fill the queue and its cores (2.2 on 2) were most of the machine: "oversubscribed",
    critical. Each counted for the third of the window it lived, they cannot: the crowd is not the
    run's."""
    from stepscope.analysis.host_cpu import cpu_demand
    from stepscope.analysis.evidence import MacroSignals

    main = (WorkerLoad(pid=1, role="main", cpu_util=0.4, threads=5, running_threads=1.1),)
    restarted = tuple(WorkerLoad(pid=100 + index, role="dataloader_worker", cpu_util=0.3, threads=3,
                                 running_threads=1.0, presence=1 / 3) for index in range(6))
    signals = dict(cpu_count=2, cpu_util_mean=0.99, runnable_threads_per_core=3.3, workers=main + restarted)
    demand = cpu_demand(MacroSignals(**signals), 2, 1)
    assert demand.busy_workers == 2 and demand.running_demand == pytest.approx(3.0)
    assert demand.tree_cores == pytest.approx(0.4 + 0.6)
    record = make_record(shares={"data_wait": 0.6, "forward": 0.2, "backward": 0.1}, num_workers=2,
                         intra_op_threads=1)
    assert oversubscribed_cpu(ctx_of(record, signals)) is None
    # the same six as persistent workers, all at once, with threads that run: the run's own crowd
    crowded = dict(signals, workers=main + tuple(WorkerLoad(pid=200 + index, role="dataloader_worker",
                                                            cpu_util=0.3, threads=3, running_threads=2.0)
                                                 for index in range(6)))
    assert oversubscribed_cpu(ctx_of(record, crowded)) is not None


def test_workers_that_timed_themselves_keeping_pace_leave_the_crowd_the_model_s_time_not_the_wait():
    """Blind w036 of seed 348790310: a crowd of the run's own threads (2 intra-op + a worker on 2.2
    threads, run queue 2.1 a core), the step waiting 50 % in next(), but the one worker made a batch
    in 0.38 ms of the 2.7 ms step; the wait was the training process's own (a Python thread spinning
    beside it, +66 % when removed). Priced at the whole wait, "oversubscribed" led; the workers'
    pace explains none of it, so the crowd costs the model's time it slows. Workers that do set the
    pace (their waits for a core included) keep the wait as the crowd's."""
    from diagnosis_records import timed_workers

    record = make_record(shares=INPUT, num_workers=1, intra_op_threads=2)
    main = (WorkerLoad(pid=1, role="main", cpu_util=1.7, threads=9),)
    signals = dict(cpu_count=2, cpu_util_mean=0.97, runnable_threads_per_core=2.1,
                   workers=main + workers(1, 0.22, threads=3, running=2.2))
    untimed = oversubscribed_cpu(ctx_of(record, signals))
    assert untimed is not None and untimed.impact == pytest.approx(0.5, abs=0.01)
    keeping_pace = ctx_of(timed_workers(record, 0.0004, 0.00037, 0.00002), signals)
    found = oversubscribed_cpu(keeping_pace)
    compute = keeping_pace.steady.compute_share
    assert found.impact == pytest.approx((1 - 1 / 2.1) * compute, abs=0.01) and found.impact < 0.3
    assert "none of that wait is theirs" in found.summary
    # the same worker slowed to 9 ms a batch by the queue (5 ms of it waiting for a core): its pace is the wait
    slowed = oversubscribed_cpu(ctx_of(timed_workers(record, 0.009, 0.004, 0.005), signals))
    assert slowed.impact == pytest.approx(untimed.impact) and "keep pace" not in slowed.summary
