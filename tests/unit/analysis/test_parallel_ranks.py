"""A job's traces analysed in parallel give the same document as in one process: on local worker
processes and on a Dask cluster, for every reference trace and for a job built from all of them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest

from stepscope.analysis.trace.trace_evidence import analyze_traces
from stepscope.executors import local_executor
from stepscope.errors import StepscopeError
from tests.unit.analysis.reference_traces import VENDORED, _rel, _root, kineto_trace_names


def _document(analysis) -> bytes:
    return orjson.dumps(analysis.to_dict(full=True), option=orjson.OPT_SERIALIZE_NUMPY)


def _job(tmp_path: Path) -> Path:
    """Every vendored Kineto reference trace as one rank of a job (distributedInfo rewritten)."""
    names = [_rel(name) for name in kineto_trace_names() if (VENDORED / _rel(name)).is_file()]
    job = tmp_path / "job"
    job.mkdir()
    for rank, name in enumerate(names):
        raw = (VENDORED / name).read_bytes()
        doc = json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": len(names)}
        (job / f"rank{rank}.json").write_bytes(orjson.dumps(doc))
    return job


@pytest.fixture(scope="module")
def pool():
    executor = local_executor(2)
    yield executor
    executor.shutdown()


@pytest.mark.parametrize("rel", kineto_trace_names())
def test_each_reference_trace_same_on_worker_processes(rel, pool):
    path = _root(_rel(rel)) / _rel(rel)
    assert _document(analyze_traces(path, executor=pool)) == _document(analyze_traces(path))


def test_a_job_of_every_reference_trace_same_in_parallel(tmp_path):
    job = _job(tmp_path)
    sequential = analyze_traces(job)
    assert len(sequential.ranks) >= 10 and len(sequential.comparison.ranks) == len(sequential.ranks)
    assert _document(analyze_traces(job, jobs=2)) == _document(sequential)


def test_a_damaged_rank_is_one_clear_error_from_a_worker(tmp_path):
    job = _job(tmp_path)
    (job / "rank3.json").write_bytes(b'{"traceEvents": [{"ph": "X", "name": ')
    with pytest.raises(StepscopeError, match="rank3.json"):
        analyze_traces(job, jobs=2)


def test_dask_local_cluster_same_as_one_process(tmp_path):
    pytest.importorskip("distributed", reason="Dask's distributed is the optional engine (stepscope[dask])")
    from stepscope.executors import dask_executor

    job = _job(tmp_path)
    with dask_executor("local", workers=2) as executor:
        on_cluster = analyze_traces(job, executor=executor)
    assert _document(on_cluster) == _document(analyze_traces(job))
