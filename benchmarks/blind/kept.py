"""A finished blind evaluation read back: its file (``blind_eval.py --out``), the workloads whose runs
were kept (``--keep``), and a kept run re-diagnosed with the current code — what the scripts that
re-read evaluations (``blind_rescore.py``, ``gain_error.py``) share."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


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


def rediagnose(run_dir: Path) -> dict:
    """report.json as the current code writes it for the run in ``run_dir``."""
    result = subprocess.run([sys.executable, "-m", "stepscope", "report", str(run_dir), "--format", "json"],
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"stepscope report {run_dir}: exit {result.returncode}: {result.stderr.strip()[-400:]}")
    return json.loads(result.stdout)
