"""`stepscope run --set KEY=VALUE` and `--max-steps N`: change settings of an unmodified script.

Keys (:data:`KEYS`):

- ``dataloader.num_workers``, ``.pin_memory``, ``.persistent_workers``, ``.prefetch_factor``,
  ``.batch_size``: every ``torch.utils.data.DataLoader`` (subclasses included) is constructed
  with the value in place of the script's. Arguments that are only valid with workers follow the
  effective worker count: ``prefetch_factor`` and ``persistent_workers=true`` are skipped on a
  loader left with ``num_workers=0``, and ``num_workers=0`` drops the script's own
  ``prefetch_factor``/``persistent_workers``. ``batch_size`` on a loader built with a
  ``torch.utils.data.BatchSampler`` rebuilds that sampler with the new size (same sampler and
  ``drop_last``); a custom batch sampler, or automatic batching turned off (``batch_size=None``),
  is left alone. Each skip is a line in the record.
- ``torch.num_threads``: ``torch.set_num_threads(N)`` right after the script imports torch, and
  the script's own later calls in the training process are replaced by N (noted in the record),
  so the trial measures the setting asked for. DataLoader workers keep what their
  ``worker_init_fn`` sets.

Bounds: a value past :func:`maximum` is refused before anything runs (``num_workers=1000000000``
forks until the machine stalls, ``torch.num_threads=99999`` crashes the process in the thread
pool). ``dataloader.num_workers`` and ``torch.num_threads`` may be at most :data:`CORES_FACTOR`
times the cores this process may run on (its CPU affinity), and never less than
:data:`MIN_CORE_BOUND` — past that, extra workers or threads only queue for the same cores;
``dataloader.prefetch_factor`` at most :data:`MAX_PREFETCH_FACTOR` (torch's default is 2; each
worker holds that many batches); ``dataloader.batch_size`` at most :data:`MAX_BATCH_SIZE`.

Pure parsing lives here (no torch import); :class:`OverrideApplier` runs inside capture.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from stepscope.errors import UsageError
from stepscope.executors import usable_cores
from stepscope.switches import OFF_WORDS, ON_WORDS


#: Worker and thread counts may be at most this many times the usable cores ...
CORES_FACTOR = 4
#: ... and at least this bound on a machine with few cores.
MIN_CORE_BOUND = 8
#: The deepest prefetch per worker (torch's default is 2).
MAX_PREFETCH_FACTOR = 64
#: The largest batch (2^24 samples; torch's BatchSampler holds a list of this many items).
MAX_BATCH_SIZE = 1 << 24


@dataclass(frozen=True)
class KeySpec:
    kind: str  # "int" | "bool"
    minimum: int = 0
    help: str = ""
    #: the largest value: a number, "cores" (:data:`CORES_FACTOR` x the usable cores), None (a bool)
    maximum: int | str | None = None


#: Every key `--set` accepts.
KEYS: dict[str, KeySpec] = {
    "dataloader.num_workers": KeySpec("int", 0, "worker processes of every DataLoader", "cores"),
    "dataloader.pin_memory": KeySpec("bool", help="page-locked batches"),
    "dataloader.persistent_workers": KeySpec("bool", help="keep workers between epochs (needs workers)"),
    "dataloader.prefetch_factor": KeySpec("int", 1, "batches in flight per worker (needs workers)",
                                          MAX_PREFETCH_FACTOR),
    "dataloader.batch_size": KeySpec("int", 1, "samples per batch", MAX_BATCH_SIZE),
    "torch.num_threads": KeySpec("int", 1, "intra-op threads of the training process", "cores"),
}

#: Prescription ``setting`` names (stepscope.diagnosis) -> `--set` key.
SETTING_KEYS: dict[str, str] = {
    "num_workers": "dataloader.num_workers",
    "pin_memory": "dataloader.pin_memory",
    "persistent_workers": "dataloader.persistent_workers",
    "prefetch_factor": "dataloader.prefetch_factor",
    "batch_size": "dataloader.batch_size",
    "intra_op_threads": "torch.num_threads",
}


def accepted_keys() -> str:
    return ", ".join(sorted(KEYS))


def maximum(key: str) -> tuple[int, str] | None:
    """The largest value ``key`` accepts and where that bound comes from; None for a bool."""
    bound = KEYS[key].maximum
    if bound is None:
        return None
    if bound == "cores":
        cores = usable_cores()
        return (max(MIN_CORE_BOUND, CORES_FACTOR * cores),
                f"{CORES_FACTOR} x the {cores} usable core{'s' if cores != 1 else ''}, at least {MIN_CORE_BOUND}")
    return int(bound), _FIXED_BOUNDS.get(key, "the key's bound")


_FIXED_BOUNDS = {"dataloader.prefetch_factor": "batches held by each worker; torch's default is 2",
                 "dataloader.batch_size": "2^24 samples"}


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else repr(f"{text[:20]}…{text[-8:]}") + f" ({len(text)} characters)"


def parse_value(key: str, text: str) -> int | bool:
    """The typed value of ``key=text``; :class:`UsageError` when it does not fit the key."""
    spec = KEYS[key]
    cleaned = str(text).strip().lower()
    if spec.kind == "bool":
        if cleaned in ON_WORDS:
            return True
        if cleaned in OFF_WORDS:
            return False
        raise UsageError(f"--set {key}: expected true or false, got {text!r}")
    bound = maximum(key)
    try:
        value = int(cleaned, 10)
    except ValueError:
        if not (cleaned.isascii() and cleaned.isdigit() and bound is not None):
            raise UsageError(f"--set {key}: expected an integer >= {spec.minimum}, got {_shown(str(text))}") from None
        value = bound[0] + 1  # more digits than int() reads: past any bound
    if value < spec.minimum:
        raise UsageError(f"--set {key}: expected an integer >= {spec.minimum}, got {value}")
    if bound is not None and value > bound[0]:
        raise UsageError(f"--set {key}: {_shown(cleaned) if len(cleaned) > 40 else value} is past the bound of "
                         f"{bound[0]} ({bound[1]}); give a value from {spec.minimum} to {bound[0]}")
    return value


def parse_settings(items: Iterable[str]) -> dict[str, int | bool]:
    """``["dataloader.num_workers=4", …]`` -> ``{"dataloader.num_workers": 4, …}``, validated.

    Raises:
        UsageError: no ``=``, an unknown key (the message lists the accepted ones), a value of the
            wrong type or range, a key given twice, or settings that contradict each other
            (``prefetch_factor``/``persistent_workers=true`` with ``num_workers=0``).
    """
    settings: dict[str, int | bool] = {}
    for item in items:
        key, sep, text = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}; accepted keys: {accepted_keys()}")
        if key not in KEYS:
            raise UsageError(f"--set: unknown key {key!r}; accepted keys: {accepted_keys()}")
        if key in settings:
            raise UsageError(f"--set {key} given twice")
        settings[key] = parse_value(key, text)
    if settings.get("dataloader.num_workers") == 0:
        for key in ("dataloader.prefetch_factor", "dataloader.persistent_workers"):
            if key in settings and settings[key] is not False:
                raise UsageError(f"--set {key} needs DataLoader workers, but dataloader.num_workers=0")
    return settings


def parse_max_steps(value: int | None) -> int | None:
    if value is not None and value < 1:
        raise UsageError(f"--max-steps must be at least 1, got {value}")
    return value


def describe(settings: dict[str, int | bool]) -> str:
    """``dataloader.num_workers=4 torch.num_threads=1`` (the form `--set` takes)."""
    return " ".join(f"{key}={_text(value)}" for key, value in settings.items())


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


class MaxStepsReached(SystemExit):
    """Raised into the script when ``--max-steps`` steps are complete: a clean exit with status 0.

    A ``SystemExit`` so that the script's ``except Exception`` blocks let it through and its
    ``finally`` blocks and ``atexit`` handlers run, as for ``sys.exit(0)``.
    """

    def __init__(self, steps: int):
        super().__init__(0)
        self.steps = steps


class OverrideApplier:
    """Applies parsed settings inside the training process and counts where they took effect."""

    def __init__(self, settings: dict[str, int | bool]):
        self.settings = dict(settings)
        self.applied: dict[str, int] = {key: 0 for key in settings}
        self.skipped: dict[str, list[str]] = {key: [] for key in settings}
        self.owner_pid = os.getpid()

    def _skip(self, key: str, line: str) -> None:
        lines = self.skipped[key]
        if line not in lines and len(lines) < 20:
            lines.append(line)

    @property
    def loader_settings(self) -> dict[str, int | bool]:
        return {key.split(".", 1)[1]: value for key, value in self.settings.items()
                if key.startswith("dataloader.")}

    # -- DataLoader ------------------------------------------------------------------------
    def install_loader(self, patch: Callable[[Any, str, Any], Any]) -> None:
        """Patch ``DataLoader.__init__`` (through ``patch(owner, name, replacement)``)."""
        from torch.utils.data import DataLoader

        if not self.loader_settings:
            return
        original = DataLoader.__init__
        signature = inspect.signature(original)
        applier = self

        def __init__(loader, *args, **kwargs):  # noqa: N807
            if os.getpid() == applier.owner_pid:
                try:
                    bound = signature.bind(loader, *args, **kwargs)
                    arguments = dict(bound.arguments)
                    arguments.pop(next(iter(signature.parameters)))  # self
                    extra = arguments.pop("kwargs", None)  # a subclass's **kwargs, if any
                    if isinstance(extra, dict):
                        arguments.update(extra)
                    args, kwargs = (), applier.loader_kwargs(arguments, type(loader).__qualname__)
                except TypeError:  # arguments torch itself will refuse: let it say so
                    pass
            original(loader, *args, **kwargs)

        __init__.__wrapped__ = original  # type: ignore[attr-defined]
        patch(DataLoader, "__init__", __init__)

    def loader_kwargs(self, arguments: dict[str, Any], name: str = "DataLoader") -> dict[str, Any]:
        """The constructor arguments with the overrides applied (see the module docstring)."""
        out = dict(arguments)
        wanted = self.loader_settings
        if "num_workers" in wanted:
            out["num_workers"] = wanted["num_workers"]
            self.applied["dataloader.num_workers"] += 1
            if wanted["num_workers"] == 0:
                if out.get("prefetch_factor") is not None:
                    out["prefetch_factor"] = None
                if out.get("persistent_workers"):
                    out["persistent_workers"] = False
        workers = int(out.get("num_workers") or 0)
        for key in ("prefetch_factor", "persistent_workers"):
            if key not in wanted:
                continue
            if workers == 0 and wanted[key] not in (False, None):
                self._skip(f"dataloader.{key}", f"{name} with num_workers=0: {key} needs workers")
                continue
            out[key] = wanted[key]
            self.applied[f"dataloader.{key}"] += 1
        if "pin_memory" in wanted:
            out["pin_memory"] = wanted["pin_memory"]
            self.applied["dataloader.pin_memory"] += 1
        if "batch_size" in wanted:
            self._batch_size(out, int(wanted["batch_size"]), name)
        return out

    def _batch_size(self, out: dict[str, Any], size: int, name: str) -> None:
        key = "dataloader.batch_size"
        batch_sampler = out.get("batch_sampler")
        if batch_sampler is not None:
            from torch.utils.data import BatchSampler

            if type(batch_sampler) is BatchSampler:
                out["batch_sampler"] = BatchSampler(batch_sampler.sampler, size, batch_sampler.drop_last)
                self.applied[key] += 1
            else:
                self._skip(key, f"{name} with a custom batch_sampler "
                                f"({type(batch_sampler).__qualname__}): batch_size left as it is")
            return
        if "batch_size" in out and out["batch_size"] is None:
            self._skip(key, f"{name} with batch_size=None (the dataset or sampler makes the batches): "
                            "left as it is")
            return
        out["batch_size"] = size
        self.applied[key] += 1

    # -- torch threads -----------------------------------------------------------------------
    def install_threads(self, torch: Any, patch: Callable[[Any, str, Any], Any]) -> None:
        key = "torch.num_threads"
        if key not in self.settings:
            return
        threads = int(self.settings[key])
        original = torch.set_num_threads
        original(threads)
        self.applied[key] = 1
        applier = self

        def set_num_threads(count):
            if os.getpid() != applier.owner_pid:  # a DataLoader worker: its own choice
                return original(count)
            if count != threads:
                applier._skip(key, f"the script's torch.set_num_threads({count}) replaced by {threads}")
            return original(threads)

        set_num_threads.__wrapped__ = original  # type: ignore[attr-defined]
        set_num_threads.__doc__ = original.__doc__
        patch(torch, "set_num_threads", set_num_threads)

    def frozen(self, max_steps: int | None, stopped: bool):
        from stepscope.record.run import Override, Overrides

        return Overrides(
            settings=tuple(Override(key=key, value=value, applied=self.applied[key],
                                    skipped=tuple(self.skipped[key])) for key, value in self.settings.items()),
            max_steps=max_steps, stopped_at_max_steps=stopped)


__all__ = ["CORES_FACTOR", "KEYS", "MAX_BATCH_SIZE", "MAX_PREFETCH_FACTOR", "MIN_CORE_BOUND", "SETTING_KEYS",
           "MaxStepsReached", "OverrideApplier", "accepted_keys", "describe", "maximum", "parse_max_steps",
           "parse_settings", "parse_value", "usable_cores"]
