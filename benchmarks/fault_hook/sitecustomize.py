"""Fault injection for stepscope's write sites, loaded by every Python process of a run that has
this directory on ``PYTHONPATH`` (the ``stepscope run`` process, its sampler, DataLoader workers).

Used by ``benchmarks/fault_campaign.py`` and ``tests/integration/test_faults.py``; nothing of
stepscope is changed: the hook wraps, at the call, what stepscope writes with.

- ``FAULT_INJECT=SITE:ERRNO[@N]``: the N-th write (default 1st) to SITE writes half of its bytes,
  then raises ``OSError(ERRNO)`` (``ENOSPC``, ``EIO``), as a filling or failing disk does;
  every later write to SITE fails the same way. For the run index, SQLite's own error for the
  condition (``database or disk is full``, ``disk I/O error``) is raised by the insert.
- ``FAULT_KILL=SITE:WHEN[@N]`` with ``FAULT_KILL_SCOPE=tree|script``: SIGKILL at the N-th write to
  SITE — ``mid``: half of the bytes written; ``full``: every byte written and synced, before the
  file is renamed into place (samples: once the N-th gzip member is whole; index: ``mid`` inside
  the open transaction, ``full`` right after its COMMIT). ``tree`` kills the training process, its sampler and its DataLoader workers; ``script``
  the training process only.
- ``FAULT_LOG=FILE``: appends ``<monotonic s> <pid> <site> <begin|end>`` for each write (timelines).

Sites: ``record`` (record.rank<R>.json.gz), ``checkpoint`` (record.rank<R>.partial.json.gz),
``samples`` (samples.rank<R>.jsonl.gz), ``report`` (report.json, report.rank<R>.json), ``html``
(report.html), ``trace`` (the torch.profiler window's Chrome trace), ``index`` (the run index).
"""

from __future__ import annotations

import errno as _errno
import os
import re
import signal
import sys
import time

_SITES = (
    ("checkpoint", re.compile(r"^record\.rank\d+\.partial\.json\.gz$")),
    ("record", re.compile(r"^record\.rank\d+\.json\.gz$")),
    ("samples", re.compile(r"^samples\.rank\d+\.jsonl\.gz$")),
    ("report", re.compile(r"^report(?:\.rank\d+)?\.json$")),
    ("html", re.compile(r"^report\.html$")),
)
_TMP = re.compile(r"^\.(.+)\.[0-9a-f]{16}\.tmp$")


def _spec(name: str) -> tuple[str, str, int] | None:
    text = os.environ.get(name, "").strip()
    if not text:
        return None
    site, _, rest = text.partition(":")
    what, _, nth = rest.partition("@")
    return site, what, int(nth or 1)


INJECT = _spec("FAULT_INJECT")
KILL = _spec("FAULT_KILL")
SCOPE = os.environ.get("FAULT_KILL_SCOPE", "tree")
LOG = os.environ.get("FAULT_LOG")
_counts: dict[str, int] = {}


def site_of(path: str) -> str | None:
    name = os.path.basename(str(path))
    match = _TMP.match(name)
    if match:
        name = match.group(1)
    for site, pattern in _SITES:
        if pattern.match(name):
            return site
    return None


def log(site: str, event: str) -> None:
    if LOG:
        try:
            with open(LOG, "a") as out:
                out.write(f"{time.monotonic():.6f} {os.getpid()} {site} {event}\n")
        except OSError:
            pass


def _error(name: str, path: str = "") -> OSError:
    code = getattr(_errno, name)
    return OSError(code, os.strerror(code), path) if path else OSError(code, os.strerror(code))


def kill_now() -> None:
    """SIGKILL the training process (``script``) or it with every process under it (``tree``)."""
    root = os.getpid()
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    if getattr(main, "name", "") == "stepscope.capture.sampler":  # the sampler: its training process
        root = os.getppid()  # is its parent
    victims = [root]
    if SCOPE == "tree":
        try:
            import psutil

            victims = [child.pid for child in psutil.Process(root).children(recursive=True)] + [root]
        except Exception:  # noqa: BLE001
            pass
    for pid in victims:
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    if os.getpid() in victims:
        os.kill(os.getpid(), signal.SIGKILL)


def _due(spec: tuple[str, str, int] | None, site: str, count: int) -> bool:
    if spec is None or spec[0] != site:
        return False
    return count >= spec[2] if spec is INJECT else count == spec[2]


class FaultyFile:
    """A file of a faulted site: its writes count, fail or kill as the environment says."""

    def __init__(self, handle, site: str, path: str):
        self._handle, self._site, self._path = handle, site, path

    def write(self, data) -> int:
        count = _counts[self._site] = _counts.get(self._site, 0) + 1
        log(self._site, "begin")
        if _due(INJECT, self._site, count) or (_due(KILL, self._site, count) and KILL[1] == "mid"):
            half = bytes(data)[: max(1, len(data) // 2)]
            self._handle.write(half)
            self._handle.flush()
            if INJECT is not None and INJECT[0] == self._site:
                raise _error(INJECT[1], self._path)
            kill_now()
        written = self._handle.write(data)
        self._full = _due(KILL, self._site, count) and KILL[1] == "full"
        log(self._site, "end")
        if self._full and self._site == "samples":  # a stream: killed once this write is whole
            self._handle.flush()
            kill_now()
        return written

    def close(self) -> None:
        self._handle.close()
        if getattr(self, "_full", False):
            kill_now()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __getattr__(self, name):
        return getattr(self._handle, name)


def _install_files() -> None:
    import stepscope.safe_write as safe_write

    original = safe_write.create_exclusive

    def create_exclusive(path, *args, **kwargs):
        handle = original(path, *args, **kwargs)
        site = site_of(str(path))
        return handle if site is None else FaultyFile(handle, site, str(path))

    safe_write.create_exclusive = create_exclusive


def _patch_profiler(module) -> None:
    profile = getattr(module, "profile", None)
    if profile is None or getattr(profile, "_fault_hook", False):
        return
    original = profile.export_chrome_trace

    def export_chrome_trace(self, path):
        count = _counts["trace"] = _counts.get("trace", 0) + 1
        log("trace", "begin")
        result = original(self, path)
        if _due(INJECT, "trace", count) or (_due(KILL, "trace", count) and KILL[1] == "mid"):
            size = os.path.getsize(path)
            os.truncate(path, size // 2)  # the export stopped half-way
            if INJECT is not None and INJECT[0] == "trace":
                raise _error(INJECT[1], str(path))
            kill_now()
        if _due(KILL, "trace", count):
            kill_now()
        log("trace", "end")
        return result

    profile.export_chrome_trace = export_chrome_trace
    profile._fault_hook = True


class _AfterImport:
    """Patches ``torch.profiler.profiler`` once it is imported (torch is never imported here)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch.profiler.profiler":
            return None
        import importlib.machinery

        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = getattr(finder, "find_spec", lambda *a: None)(name, path, target)
            if spec is not None and spec.loader is not None:
                loader = spec.loader
                exec_module = loader.exec_module

                def run(module, exec_module=exec_module):
                    exec_module(module)
                    _patch_profiler(module)

                loader.exec_module = run
                return spec
        return None


def _install_sqlite() -> None:
    import sqlite3

    index = os.environ.get("STEPSCOPE_INDEX")
    if not index:
        return
    target = os.path.realpath(index)
    messages = {"ENOSPC": "database or disk is full", "EIO": "disk I/O error"}
    original = sqlite3.connect

    class FaultyConnection(sqlite3.Connection):
        def execute(self, sql, *args):
            statement = sql.lstrip().upper()
            if statement.startswith("INSERT OR REPLACE INTO RUNS"):
                count = _counts["index"] = _counts.get("index", 0) + 1
                log("index", "begin")
                if _due(INJECT, "index", count):
                    raise sqlite3.OperationalError(messages.get(INJECT[1], "disk I/O error"))
                result = super().execute(sql, *args)
                if _due(KILL, "index", count) and KILL[1] == "mid":
                    kill_now()
                self._fault_commit = _due(KILL, "index", count) and KILL[1] == "full"
                return result
            result = super().execute(sql, *args)
            if statement.startswith("COMMIT"):
                log("index", "end")
                if getattr(self, "_fault_commit", False):
                    kill_now()
            return result

    def connect(database, *args, **kwargs):
        if not kwargs.get("uri") and isinstance(database, (str, os.PathLike)) \
                and os.path.realpath(database) == target and "factory" not in kwargs:
            kwargs["factory"] = FaultyConnection
        return original(database, *args, **kwargs)

    sqlite3.connect = connect


if INJECT is not None or KILL is not None or LOG:
    _install_files()
    _install_sqlite()
    sys.meta_path.insert(0, _AfterImport())
