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

The settings are read from the environment at each write, and the write sites are patched when
their modules are imported (or at once where they already were), so a process forked from an
interpreter that loaded this hook at its own start behaves as one started with its environment.

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


def _inject() -> tuple[str, str, int] | None:
    return _spec("FAULT_INJECT")


def _kill() -> tuple[str, str, int] | None:
    return _spec("FAULT_KILL")


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
    path = os.environ.get("FAULT_LOG")
    if path:
        try:
            with open(path, "a") as out:
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
    if os.environ.get("FAULT_KILL_SCOPE", "tree") == "tree":
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


def _due(spec: tuple[str, str, int] | None, site: str, count: int, every_after: bool = False) -> bool:
    """Whether the ``count``-th write to ``site`` is the one ``spec`` names (``every_after``: or a later one)."""
    if spec is None or spec[0] != site:
        return False
    return count >= spec[2] if every_after else count == spec[2]


def _injected(site: str, count: int) -> tuple[str, str, int] | None:
    """The injected error's spec where the ``count``-th write to ``site`` fails (it and every later one)."""
    inject = _inject()
    return inject if _due(inject, site, count, every_after=True) else None


class FaultyFile:
    """A file of a faulted site: its writes count, fail or kill as the environment says."""

    def __init__(self, handle, site: str, path: str):
        self._handle, self._site, self._path = handle, site, path

    def write(self, data) -> int:
        count = _counts[self._site] = _counts.get(self._site, 0) + 1
        log(self._site, "begin")
        inject, kill = _injected(self._site, count), _kill()
        if inject or (_due(kill, self._site, count) and kill[1] == "mid"):
            half = bytes(data)[: max(1, len(data) // 2)]
            self._handle.write(half)
            self._handle.flush()
            if inject:
                raise _error(inject[1], self._path)
            kill_now()
        written = self._handle.write(data)
        self._full = _due(kill, self._site, count) and kill[1] == "full"
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


def _patch_safe_write(safe_write) -> None:
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
        inject, kill = _injected("trace", count), _kill()
        if inject or (_due(kill, "trace", count) and kill[1] == "mid"):
            size = os.path.getsize(path)
            os.truncate(path, size // 2)  # the export stopped half-way
            if inject:
                raise _error(inject[1], str(path))
            kill_now()
        if _due(kill, "trace", count):
            kill_now()
        log("trace", "end")
        return result

    profile.export_chrome_trace = export_chrome_trace
    profile._fault_hook = True


class _AfterImport:
    """Patches each module of ``_PATCHES`` once it is imported (none is imported here)."""

    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
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
                    patch(module)

                loader.exec_module = run
                return spec
        return None


def _patch_sqlite(sqlite3) -> None:
    messages = {"ENOSPC": "database or disk is full", "EIO": "disk I/O error"}
    original = sqlite3.connect

    class FaultyConnection(sqlite3.Connection):
        def execute(self, sql, *args):
            statement = sql.lstrip().upper()
            if statement.startswith("INSERT OR REPLACE INTO RUNS"):
                count = _counts["index"] = _counts.get("index", 0) + 1
                log("index", "begin")
                inject, kill = _injected("index", count), _kill()
                if inject:
                    raise sqlite3.OperationalError(messages.get(inject[1], "disk I/O error"))
                result = super().execute(sql, *args)
                if _due(kill, "index", count) and kill[1] == "mid":
                    kill_now()
                self._fault_commit = _due(kill, "index", count) and kill[1] == "full"
                return result
            result = super().execute(sql, *args)
            if statement.startswith("COMMIT"):
                log("index", "end")
                if getattr(self, "_fault_commit", False):
                    kill_now()
            return result

    def connect(database, *args, **kwargs):
        index = os.environ.get("STEPSCOPE_INDEX")
        if index and not kwargs.get("uri") and isinstance(database, (str, os.PathLike)) \
                and os.path.realpath(database) == os.path.realpath(index) and "factory" not in kwargs:
            kwargs["factory"] = FaultyConnection
        return original(database, *args, **kwargs)

    sqlite3.connect = connect


#: The modules whose write sites are patched, and how.
_PATCHES = {"torch.profiler.profiler": _patch_profiler, "stepscope.safe_write": _patch_safe_write,
            "sqlite3": _patch_sqlite}

for _name, _patch in _PATCHES.items():
    if _name in sys.modules:
        _patch(sys.modules[_name])
sys.meta_path.insert(0, _AfterImport())
