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


#: Run in a process of its own: Dask leaves a thread in the process that used it (its "Dask-Offload"
#: pool), and a process with another thread never forks (the views' child, the child decode), so
#: the tests of those, run later by the same test worker, would see no fork.
_ON_A_CLUSTER = """
import sys
import orjson
from stepscope.analysis.trace.trace_evidence import analyze_traces
from stepscope.executors import dask_executor

job, on_cluster, alone = sys.argv[1:]
def document(analysis):
    return orjson.dumps(analysis.to_dict(full=True), option=orjson.OPT_SERIALIZE_NUMPY)
with dask_executor("local", workers=2) as executor:
    open(on_cluster, "wb").write(document(analyze_traces(job, executor=executor)))
open(alone, "wb").write(document(analyze_traces(job)))
"""


def test_dask_local_cluster_same_as_one_process(tmp_path):
    pytest.importorskip("distributed", reason="Dask's distributed is the optional engine (stepscope[dask])")
    from support import run_python

    job = _job(tmp_path)
    on_cluster, alone = tmp_path / "cluster.json", tmp_path / "alone.json"
    done = run_python(["-c", _ON_A_CLUSTER, str(job), str(on_cluster), str(alone)], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert on_cluster.read_bytes() == alone.read_bytes() and len(alone.read_bytes()) > 1000
