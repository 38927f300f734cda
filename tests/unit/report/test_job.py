"""The job report: every rank's record merged; missing ranks named with why; findings by rule."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from records import make_record
from stepscope.pipeline.diagnose import diagnose
from stepscope.pipeline.inputs import is_job_dir, load_run, wait_for_ranks
from stepscope.record import layout
from stepscope.record.run import StepTable
from stepscope.record.store import save_record


def build_job_report(run_dir):
    return diagnose(load_run(run_dir))


def _rank(rank: int, world: int, *, data_wait: int = 0, comm: int = 0):
    record = make_record(40, rank=rank)
    record = replace(record, meta=replace(record.meta, world_size=world))
    columns = record.steps.columns()
    count = len(record.steps)
    columns["data_wait_ns"] = columns["data_wait_ns"] * 0 + data_wait
    columns["communication_ns"] = np.full(count, comm)
    columns["other_ns"] = columns["other_ns"] * 0 + 50
    columns["duration_ns"] = (columns["data_wait_ns"] + columns["forward_ns"] + columns["backward_ns"]
                              + columns["optimizer_ns"] + columns["communication_ns"] + columns["other_ns"])
    columns["start_ns"] = 10_000 + np.concatenate(([0], np.cumsum(columns["duration_ns"])[:-1]))
    return replace(record, steps=StepTable.from_columns(columns))


def test_straggler_job_is_merged_with_the_rank_table_and_a_missing_rank(tmp_path):
    save_record(_rank(0, 3, comm=4000), layout.record_path(tmp_path, 0))  # waits 4 µs per step
    save_record(_rank(1, 3, data_wait=4000), layout.record_path(tmp_path, 1))  # loads 4 µs per step
    assert is_job_dir(tmp_path)
    report = build_job_report(tmp_path)
    job = report.job
    assert [row.rank for row in job.rows] == [0, 1] and job.world_size == 3
    assert job.rows[0].communication_s > 0 and job.rows[1].data_wait_s > 0
    assert job.spread.slowest_rank == 1
    (missing,) = job.missing
    assert missing.rank == 2 and "never started" in missing.reason
    top = report.findings[0]
    assert top.family == "straggler" and top.rank == 1 and "for data" in top.title
    assert "communication" not in {item.family for item in report.findings}  # rank 0 waits for rank 1
    assert report.to_dict()["job"]["missing"][0]["rank"] == 2


def test_a_missing_rank_is_said_once_in_the_summary(tmp_path):
    from records import summary_text

    save_record(_rank(0, 3), layout.record_path(tmp_path, 0))
    save_record(_rank(1, 3), layout.record_path(tmp_path, 1))
    report = build_job_report(tmp_path)
    text = summary_text(report)
    assert text.count("rank 2 missing") == 1, text  # in the rank table, not again among the warnings
    assert "rank 2 missing: no files at all" in text
    assert any(message.startswith("rank 2 missing") for message in report.to_dict()["warnings"])  # JSON keeps it


def test_a_rank_that_ended_is_not_waited_for(tmp_path):
    save_record(_rank(0, 2), layout.record_path(tmp_path, 0))
    layout.lock_path(tmp_path, 1).write_text("{}")  # rank 1 claimed the directory, then died
    assert wait_for_ranks(tmp_path, 2, timeout_s=30) == [0]


def test_the_slow_rank_s_own_finding_is_named_as_the_straggler_s_cause():
    """The zoo's straggler job, recorded: rank 0 waits for rank 1 in the all-reduce, rank 1 waits
    for its slow loader. Rank 1's own input finding is the straggler's cause and says so."""
    run_dir = Path(__file__).resolve().parents[2] / "data" / "runs" / "straggler-two-ranks"
    findings = build_job_report(run_dir).findings
    straggler = findings[0]
    assert straggler.family == "straggler" and straggler.rank == 1
    assert straggler.extra["phase"] == "data_wait"
    (cause,) = [item for item in findings if item.cause_of == straggler.rule_id]
    assert cause.family in ("input_pipeline", "storage_io") and cause.ranks == (1,)
    assert cause.title.endswith("(why rank 1 straggles)")


def test_every_rank_gets_the_same_evidence_whichever_rank_is_shown():
    """``report --rank 1`` and the job report build rank 1's evidence with the same facts about the
    other ranks (they differed: --rank 1 saw no sibling ranks)."""
    run_dir = Path(__file__).resolve().parents[2] / "data" / "runs" / "straggler-two-ranks"
    from stepscope.pipeline.diagnose import ReportOptions

    inputs = load_run(run_dir)
    job, one = diagnose(inputs), diagnose(inputs, ReportOptions(focus=1))
    assert one.evidence.to_dict() == job.ranks[1].evidence.to_dict()
    assert [item.rank for item in one.evidence.ranks] == [0, 1]
    assert one.findings == job.ranks[1].diagnosis.findings and one.job is not None


def _job_with_windows_and_damage(tmp_path: Path, ranks: int) -> Path:
    """The recorded straggler job widened to ``ranks`` ranks: each with a profiler window trace, one
    rank's record damaged, one rank's samples damaged."""
    import gzip
    import json
    import shutil

    source = Path(__file__).parents[2] / "data" / "runs" / "straggler-two-ranks"
    seed = Path(__file__).parents[2] / "data" / "traces" / "reference" / "hta" / "trace_compare" / "base" / "base.json.gz"
    for rank in range(ranks):
        record = json.loads(gzip.decompress((source / f"record.rank{rank % 2}.json.gz").read_bytes()))
        record["meta"].update(rank=rank, local_rank=rank, world_size=ranks)
        shutil.copy(seed, tmp_path / f"window.rank{rank}.json.gz")
        record["profiler_windows"] = [{"first_step": 5, "last_step": 8, "trace_path": f"window.rank{rank}.json.gz"}]
        layout.record_path(tmp_path, rank).write_bytes(gzip.compress(json.dumps(record).encode()))
        shutil.copy(source / f"samples.rank{rank % 2}.jsonl.gz", tmp_path / f"samples.rank{rank}.jsonl.gz")
    layout.record_path(tmp_path, 2).write_bytes(b"\x1f\x8b not a gzip")
    layout.samples_path(tmp_path, 3).write_bytes(gzip.compress(b'{"type": "header", "kind": "other"}\n'))
    return tmp_path


def test_a_jobs_ranks_read_in_worker_processes_give_the_same_report(tmp_path):
    """The per-rank map (record, samples, window views, basis) in 2 worker processes and in this
    one: the same report, byte for byte, with the damaged rank missing and the damaged samples noted."""
    run_dir = _job_with_windows_and_damage(tmp_path, 6)
    here, workers = load_run(run_dir, jobs=1), load_run(run_dir, jobs=2)
    assert set(workers.bases) == {0, 1, 3, 4, 5} and set(workers.windows) == {0, 1, 3, 4, 5}
    assert [item.rank for item in workers.missing] == [2] and "record unreadable" in workers.missing[0].reason
    assert any(note.startswith("rank 3: the sampler's samples could not be read") for note in workers.notes)
    assert workers.record(3).samples is None and workers.record(4).samples is not None
    first, second = diagnose(here).to_dict(), diagnose(workers).to_dict()
    assert first == second
    assert first["job"]["missing"][0]["rank"] == 2 and first["findings"]


def test_the_rank_that_failed_first_is_named_with_its_step_and_how_it_ended(tmp_path):
    from stepscope.analysis.run.ranks import MissingRank, first_failure

    clean, dead_rank, late = _rank(0, 3), 1, _rank(2, 3)
    late = replace(late, meta=replace(late.meta, exit_code=1, exception="RuntimeError", end_wall_ns=2_000))
    assert first_failure([clean], []) is None
    # rank 1 left no record (killed outright) before rank 2's exception: it failed first, in the step
    # rank 2 was in when it failed
    dead = MissingRank(dead_rank, "no record", 1.0, last_seen_wall_ns=1_000)
    failure = first_failure([clean, late], [dead])
    assert (failure.rank, failure.how, failure.signal, failure.exit_code) == (1, "killed", "SIGKILL", -9)
    assert (failure.step, failure.inferred, failure.then) == (41, True, (2,))
    assert failure.text.startswith("rank 1 failed first, in step 41 (the step the ranks that failed after it")
    # a signal, and os._exit(n) told apart from an exit by the note capture leaves
    stopped = replace(clean, meta=replace(clean.meta, exit_code=143, interrupted_by="SIGTERM", end_wall_ns=500))
    assert first_failure([stopped, late], [dead]).text.startswith(
        "rank 0 failed first, in step 41 (40 steps completed): killed by SIGTERM (exit -15)")
    exited = replace(late, meta=replace(late.meta, exception=None), warnings=("the script ended the process with "
                                                                            "os._exit(1): what it had captured",))
    assert first_failure([clean, exited], []).how == "os._exit"
    never = MissingRank(1, "no files at all", started=False)  # not a failure: it never started capture
    assert first_failure([clean], [never]) is None


def test_the_last_rank_of_a_failed_job_merges_it(tmp_path):
    """job_end.decide_merge: a clean rank 0 claims the merge; otherwise, once a rank failed, the
    rank that finds every other rank finished (record saved, or lock released) merges, once."""
    from stepscope.capture import job_end
    from stepscope.capture.session import prepare_run_dir

    run_dir = prepare_run_dir(tmp_path / "job", rank=1)  # this process plays rank 1
    assert not job_end.decide_merge(run_dir, 1, 2, own_failed=False, finish_wait_s=0)  # a clean rank 1: rank 0's job
    assert not job_end.decide_merge(run_dir, 1, 2, own_failed=True, finish_wait_s=0)  # rank 0 may still run
    layout.lock_path(run_dir, 0).write_text('{"job": "other"}')  # rank 0 started and ended (lock not held)
    assert job_end.decide_merge(run_dir, 1, 2, own_failed=True, finish_wait_s=0)  # the last one standing
    assert '"merges": true' in layout.lock_path(run_dir, 1).read_text()
