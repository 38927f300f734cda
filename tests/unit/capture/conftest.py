"""Every test module here that uses ``StepRecorder`` runs once per recorder core: the C extension
(``_fastrec``, when built) and the Python core, which implement the same rules. ``cache_home``: a
fresh per-machine cache directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepscope.capture import recorder

CORES = {"python": recorder.PyStepRecorder}
if recorder.CStepRecorder is not None:
    CORES["c"] = recorder.CStepRecorder


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "StepRecorder" in vars(metafunc.module):
        metafunc.parametrize("recorder_core", list(CORES), indirect=True)


@pytest.fixture(autouse=True)
def recorder_core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    core = getattr(request, "param", None)
    if core is not None:
        monkeypatch.setattr(request.module, "StepRecorder", CORES[core])
    return core


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``$XDG_CACHE_HOME`` (the per-machine caches: the CPU peak, the price of an operator)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"
