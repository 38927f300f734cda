"""`stepscope report RUN_DIR` reads every rank's record: cross-rank rules see the other ranks."""

from __future__ import annotations

import json

from records import make_record
from stepscope.cli.main import main
from stepscope.record import layout
from stepscope.record.store import save_record


def _rank(rank: int, data_wait_s: float):
    from dataclasses import replace

    import numpy as np

    from stepscope.record.run import StepTable

    record = make_record(40)
    record = replace(record, meta=replace(record.meta, rank=rank, world_size=2))
    columns = record.steps.columns()
    extra = np.int64(data_wait_s * 1e9)
    columns["data_wait_ns"] = columns["data_wait_ns"] + extra
    columns["duration_ns"] = columns["duration_ns"] + extra
    columns["start_ns"] = columns["start_ns"] + np.arange(len(record.steps), dtype=np.int64) * extra
    return replace(record, steps=StepTable.from_columns(columns))


def test_the_straggler_rule_sees_every_rank(tmp_path, capsys):
    save_record(_rank(0, 0.0), layout.record_path(tmp_path, 0))
    save_record(_rank(1, 0.02), layout.record_path(tmp_path, 1))  # rank 1 waits 20 ms more per step
    assert main(["report", str(tmp_path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    straggler = [item for item in report["findings"] if item["family"] == "straggler"]
    assert straggler and straggler[0]["rank"] == 1
    assert report["evidence"]["ranks"] == [0, 1]


def test_jobs_reads_the_ranks_in_workers_or_here_with_the_same_output(tmp_path, capsys):
    save_record(_rank(0, 0.0), layout.record_path(tmp_path, 0))
    save_record(_rank(1, 0.02), layout.record_path(tmp_path, 1))
    outputs = []
    for jobs in ("1", "2"):
        assert main(["report", str(tmp_path), "--format", "json", "--jobs", jobs]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    assert main(["report", str(tmp_path), "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stepscope: error: --jobs must be >= 1") and err.count("\n") == 1
