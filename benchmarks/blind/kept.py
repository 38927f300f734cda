"""A finished blind evaluation read back: its file (``blind_eval.py --out``), the workloads whose runs
were kept (``--keep``), and a kept run re-diagnosed with the current code — what the scripts that
re-read evaluations (``blind_rescore.py``, ``gain_error.py``) share."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def evaluations(paths: list[Path], tool: str) -> list[tuple[Path, dict]] | None:
    """Each file's evaluation, read before any work starts; None, with one line on stderr naming the
    file, where one cannot be read."""
    out = []
    for path in paths:
        try:
            out.append((path, json.loads(path.read_text())))
        except (OSError, ValueError) as exc:
            print(f"{tool}: cannot read {path}: {exc}", file=sys.stderr)
            return None
    return out


def kept_rows(data: dict) -> Iterator[dict]:
    """The evaluation's workloads that have a ground truth and a kept run directory."""
    for row in data.get("workloads") or []:
        if "truth" in row and row.get("directory"):
            yield row


def each_kept(path: Path, data: dict, work: Callable[[dict], T], failed: str) -> Iterator[tuple[dict, T]]:
    """``(row, work(row))`` for each kept workload of the evaluation read from ``path``; a workload
    whose ``work`` fails (its run unreadable, its re-diagnosis failing) is left out with one line on
    stderr: the evaluation's name, the workload's, ``failed`` and why."""
    for row in kept_rows(data):
        try:
            result = work(row)
        except (OSError, RuntimeError, ValueError) as exc:
            print(f"{path.name} {row.get('name')}: {failed}: {exc}", file=sys.stderr)
            continue
        yield row, result


def rediagnose(run_dir: Path) -> dict:
    """report.json as the current code writes it for the run in ``run_dir``."""
    result = subprocess.run([sys.executable, "-m", "stepscope", "report", str(run_dir), "--format", "json"],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"stepscope report {run_dir}: exit {result.returncode}: {result.stderr.strip()[-400:]}")
    return json.loads(result.stdout)
