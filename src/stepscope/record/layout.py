"""File names inside a run directory (one place, so every writer and reader agrees).

::

    stepscope-runs/<timestamp>-<script>/
        record.rank<R>.json.gz     the RunRecord of rank R (record/store.py)
        record.rank<R>.partial.json.gz   its last checkpoint while the rank runs (left by a killed run)
        samples.rank<R>.jsonl.gz   the sidecar sampler's samples for rank R (record/samples.py)
        roles.rank<R>.jsonl        pids the training process reports (DataLoader workers), for the sampler
        traces/                    torch.profiler windows (Kineto JSON)
        report.json                the machine-readable summary and findings (rank 0 / merged)
        rank<R>.lock               the owner of rank R's files: job, pid (flock'ed while it runs; kept
                                   after it only for a rank without its record or a failed job)

Every file is created new (``O_EXCL | O_NOFOLLOW``) or replaced atomically through
:mod:`stepscope.safe_write`; see :func:`stepscope.capture.rundir.claim_run_dir` for when a
directory is refused.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

REPORT_FILE = "report.json"
#: The trials of `run --verify` (:mod:`stepscope.verify`), beside the record.
VERIFICATION_FILE = "verification.json"
TRACES_DIR = "traces"
_RECORD_RE = re.compile(r"^record\.rank(\d+)\.json\.gz$")
_PARTIAL_RE = re.compile(r"^record\.rank(\d+)\.partial\.json\.gz$")


def record_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"record.rank{rank}.json.gz"


def partial_record_path(run_dir: Path, rank: int) -> Path:
    """The last checkpoint of a rank's record while it runs; removed once the record is written."""
    return Path(run_dir) / f"record.rank{rank}.partial.json.gz"


def samples_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"samples.rank{rank}.jsonl.gz"


def roles_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"roles.rank{rank}.jsonl"


def worker_batches_path(run_dir: Path, rank: int) -> Path:
    """The DataLoader workers' lines, one per batch (capture/worker_batches.py); read into the
    record at the end of the run."""
    return Path(run_dir) / f"worker_batches.rank{rank}.txt"


def lock_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.lock"


def report_path(run_dir: Path) -> Path:
    return Path(run_dir) / REPORT_FILE


def record_ranks(run_dir: Path) -> list[int]:
    """Ranks that have a record in ``run_dir``, sorted."""
    return _ranks(run_dir, _RECORD_RE)


def partial_record_ranks(run_dir: Path) -> list[int]:
    """Ranks that left a checkpoint (``record.rank<R>.partial.json.gz``) in ``run_dir``, sorted."""
    return _ranks(run_dir, _PARTIAL_RE)


def _ranks(run_dir: Path, pattern: re.Pattern[str]) -> list[int]:
    return sorted(int(match.group(1)) for child in Path(run_dir).iterdir() if (match := pattern.match(child.name)))


def rank_may_still_write(run_dir: Path, rank: int) -> bool:
    """False when the rank's lock exists and nobody holds it (the rank ended)."""
    lock = lock_path(run_dir, rank)
    try:
        descriptor = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return True  # not started yet (or on another node, still claiming)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True  # held: the rank is alive
    else:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
        return False
    finally:
        os.close(descriptor)
