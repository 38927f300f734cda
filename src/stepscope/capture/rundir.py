"""The default run directory: ``./stepscope-runs/<timestamp>-<name>/``.

Under torchrun every rank must pick the *same* directory without talking to the others. The
timestamp therefore comes from the launching agent when there is one: ``TORCHELASTIC_RUN_ID`` if
torchrun was given a real ``--rdzv-id``, else the start time of the parent process (the elastic
agent, shared by all local ranks). On several nodes pass ``--out`` on a shared filesystem.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

RUNS_DIR = "stepscope-runs"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "run"


def _parent_start_time() -> float | None:
    try:
        import psutil

        return psutil.Process(os.getppid()).create_time()
    except Exception:  # noqa: BLE001
        return None


def default_run_dir(name: str, base: str | Path = RUNS_DIR) -> Path:
    """Directory for a new run of ``name`` (a script or module name)."""
    stem = _safe(Path(name).stem if name.endswith(".py") else name)
    in_torchrun = "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "")
    if in_torchrun and run_id and run_id.lower() != "none":
        return Path(base) / f"{_safe(run_id)}-{stem}"
    started = _parent_start_time() if in_torchrun else None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started or time.time()))
    path = Path(base) / f"{stamp}-{stem}"
    if not in_torchrun:
        suffix = 1
        while path.exists():
            suffix += 1
            path = Path(base) / f"{stamp}-{stem}-{suffix}"
    return path
