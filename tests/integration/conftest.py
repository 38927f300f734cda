"""Every test here runs real training end to end (torch, worker processes, Lightning, torchrun):
marked ``slow``, so ``make test-fast`` (``pytest -m "not slow"``) leaves them to ``make test``.

``zoo_run(name)`` runs a zoo scenario once per test session and hands every test the same run
(``.report``: its ``report.json``; ``.dir``: the run directory): the zoo's planted-family test,
the stability test and the detailed distributed and capture tests share the runs."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import pytest

HERE = Path(__file__).resolve().parent


class ZooRun(NamedTuple):
    report: dict
    dir: Path


@pytest.fixture(scope="session")
def zoo_run(tmp_path_factory):
    from test_zoo import run_demo

    runs: dict[str, ZooRun] = {}

    def run(name: str) -> ZooRun:
        if name not in runs:
            out = tmp_path_factory.mktemp(f"zoo-{name}") / "run"
            runs[name] = ZooRun(run_demo(name, out), out)
        return runs[name]

    return run


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.slow)
