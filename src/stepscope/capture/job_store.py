"""Ranks' records reach rank 0 through the job's own c10d store, for nodes without a shared filesystem.

Under torchrun every worker can reach the elastic agent's TCPStore (``TORCHELASTIC_USE_AGENT_STORE``,
at ``MASTER_ADDR:MASTER_PORT``; torch's own ``init_process_group`` connects to it the same way).
At the end of the run, once its record is saved, every rank but 0 puts its record and samples file
into that store under a key of this job and attempt; rank 0, before merging, fetches each rank
whose record is not in its own run directory, writes it there (atomically, never over one already
present), and deletes the keys. On a shared filesystem the files are already there and rank 0 only
deletes the keys. No socket of our own: the store is torch's, and it lives as long as the agent
hosting it, which is node 0's, which waits for rank 0.

Nothing here may break the run: a store that cannot be reached, a value too large, a rank that
never sends — each is one warning; rank 0 then merges what it has, as before.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from stepscope.record import layout

#: A file larger than this is not sent (it would sit in the store host's memory until fetched).
MAX_VALUE_BYTES = 256 * 1024 * 1024
_FILES = {"record": layout.record_path, "samples": layout.samples_path}


def _prefix() -> str:
    return (f"stepscope/{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}/"
            f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/")


def agent_store(timeout_s: float = 10.0) -> Any | None:
    """A client of the torchrun agent's store, or None outside torchrun (or without torch.distributed)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    from torch.distributed import TCPStore

    return TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))


def send_files(run_dir: Path, rank: int, store: Any | None = None) -> list[str]:
    """Put rank ``rank``'s record and samples into the store (rank != 0). Returns warnings."""
    warnings: list[str] = []
    try:
        store = store if store is not None else agent_store()
        if store is None:
            return warnings
        prefix = f"{_prefix()}{rank}/"
        sent = []
        for name, path_of in _FILES.items():
            path = path_of(run_dir, rank)
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if size > MAX_VALUE_BYTES:
                warnings.append(f"the {name} file ({size >> 20} MiB) is too large to send to rank 0 through the "
                                "job's store; copy it into rank 0's run directory to merge it")
                continue
            store.set(prefix + name, path.read_bytes())
            sent.append(name)
        store.set(prefix + "done", ",".join(sent))
    except Exception as exc:  # noqa: BLE001 - sending is optional: rank 0 then merges what it has
        warnings.append(f"could not send this rank's record to rank 0 through the job's store "
                        f"({type(exc).__name__}: {exc}); on a shared filesystem rank 0 reads it anyway")
    return warnings


def collect_files(run_dir: Path, world_size: int, timeout_s: float, store: Any | None = None,
                  poll_s: float = 0.1) -> tuple[list[int], list[str]]:
    """Rank 0: bring every other rank's files into ``run_dir`` from the store, waiting at most
    ``timeout_s`` for ranks that have neither a record here nor sent one. A rank whose lock here
    is released without a record (it ended, shared filesystem) is not waited for.

    Returns (ranks fetched from the store, warnings)."""
    fetched: list[int] = []
    warnings: list[str] = []
    try:
        store = store if store is not None else agent_store()
    except Exception as exc:  # noqa: BLE001
        return fetched, [f"could not reach the job's store to collect the other ranks' records "
                         f"({type(exc).__name__}: {exc}); merging the records in {run_dir}"]
    if store is None:
        return fetched, warnings
    deadline = time.monotonic() + max(0.0, timeout_s)
    settled: set[int] = set()
    try:
        while True:
            for rank in range(1, world_size):
                if rank in settled:
                    continue
                prefix = f"{_prefix()}{rank}/"
                if store.check([prefix + "done"]):
                    sent = [name for name in store.get(prefix + "done").decode().split(",") if name]
                    if _fetch(store, prefix, run_dir, rank, sent):
                        fetched.append(rank)
                    for name in [*sent, "done"]:
                        store.delete_key(prefix + name)
                    settled.add(rank)
                elif not layout.rank_may_still_write(run_dir, rank):
                    settled.add(rank)  # shared filesystem, the rank ended: its record is here, or it is missing
            if len(settled) >= world_size - 1 or time.monotonic() >= deadline:
                return sorted(fetched), warnings
            time.sleep(poll_s)
    except Exception as exc:  # noqa: BLE001 - e.g. the store's host went away
        warnings.append(f"collecting the other ranks' records through the job's store stopped "
                        f"({type(exc).__name__}: {exc}); merging what {run_dir} holds")
        return sorted(fetched), warnings


def _fetch(store: Any, prefix: str, run_dir: Path, rank: int, sent: list[str]) -> bool:
    from stepscope.safe_write import atomic_write

    wrote = False
    for name in sent:
        path = _FILES[name](run_dir, rank)
        if path.exists():
            continue  # shared filesystem: the rank's own file is here already
        atomic_write(path, store.get(prefix + name))  # never seen half-written by a reader of the directory
        wrote = wrote or name == "record"
    return wrote
