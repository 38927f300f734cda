"""Hooks into torch that report boundaries to a :class:`~stepscope.capture.recorder.StepRecorder`.

What is patched (and restored by :meth:`TorchHooks.uninstall`):

- ``torch.utils.data.DataLoader.__iter__`` — time worker start-up, register the loader's settings,
  report worker pids; ``_BaseDataLoaderIter.__next__`` — the data wait of every DataLoader iterator
  (single- and multi-process, map-style and iterable datasets, framework-created iterators).
- forward: for the first steps (:data:`DISCOVERY_STEPS`), ``torch.nn.Module.__call__`` is wrapped to
  find the *root* modules (those called at depth 0); afterwards only the root modules' classes are
  wrapped, so nested submodule calls cost nothing. Hooks are never attached to module instances:
  they would end up in the user's ``torch.save(model)`` pickles and ``deepcopy`` copies.
  Under ``torch.compile`` tracing the wrapper steps aside.
- backward: ``torch.autograd.backward``, which ``Tensor.backward`` (and Lightning, Hugging Face and
  Accelerate through it) looks up and calls at call time; re-entries are counted, not double-timed.
- optimizer: the global ``register_optimizer_step_pre_hook`` / ``post_hook``.

Every wrapper degrades to the original call if anything of ours fails, with one warning per cause.
"""

from __future__ import annotations

import functools

import dataclasses
import json
import os
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from stepscope.capture.patching import patch_attribute
from stepscope.capture.recorder import BACKWARD, DATA_WAIT, FASTREC, NEVER, StepRecorder
from stepscope.capture.warn import WarningSink
from stepscope.safe_write import create_exclusive

#: Steps during which every module call is watched to discover the root modules.
DISCOVERY_STEPS = 2
#: After discovery, the committed steps are looked at this often for a backward without a forward
#: seen (a root module that appeared later: discovery again).
REDISCOVERY_CHECK_EVERY = 8


#: The training thread's CPU time inside ``next()`` is read on one step in this many (reading a
#: thread's CPU clock is a system call, ~0.8 µs here, twice per fetch): the analysis takes the
#: ratio over the steps that have it (``data_wait_cpu_ns`` is -1 on the others).
LOADER_CPU_EVERY = 4


#: ``torch.Tensor`` once the loader hook is installed (batch_length's fast path)
_TENSOR: Any = None


def batch_length(batch: Any, _depth: int = 0) -> int:
    """Number of samples in a batch: the leading dimension of its first tensor-like leaf, else -1.

    Leaves are found in tuples, lists, any ``Mapping`` (dicts, Hugging Face ``BatchEncoding``,
    TensorDict-like objects) and dataclasses, nested up to 4 levels; the first leaf with a
    dimension counts.
    """
    kind = type(batch)
    if kind is _TENSOR:  # the common leaf: a plain tensor (torch.Size holds ints)
        shape = batch.shape
        return shape[0] if shape else -1
    if (kind is tuple or kind is list) and _depth < 4:  # the common container: no ABC checks
        for child in batch:
            if type(child) is _TENSOR:
                shape = child.shape
                if shape:
                    return shape[0]
                continue
            length = batch_length(child, _depth + 1)
            if length >= 0:
                return length
        return -1
    shape = getattr(batch, "shape", None)
    if shape is not None and not isinstance(batch, type):
        try:
            return int(shape[0]) if len(shape) else -1
        except (TypeError, IndexError, ValueError):
            return -1
    if _depth >= 4:
        return -1
    if isinstance(batch, (str, bytes)):
        return -1
    if isinstance(batch, Mapping):
        children: Any = batch.values()
    elif isinstance(batch, (list, tuple)):
        children = batch
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        children = (getattr(batch, item.name, None) for item in dataclasses.fields(batch))
    else:
        return -1
    try:
        for child in children:
            length = batch_length(child, _depth + 1)
            if length >= 0:
                return length
    except Exception:  # noqa: BLE001 - an odd container: unknown
        return -1
    return -1


def loader_batch_size(loader: Any) -> int | None:
    """The loader's batch size: ``batch_size``, else its batch sampler's (Hugging Face and Accelerate
    loaders set ``batch_size=None`` and hand a batch sampler that holds it), else its sampler's."""
    size = getattr(loader, "batch_size", None)
    if isinstance(size, int):
        return size
    for first in (getattr(loader, "batch_sampler", None), getattr(loader, "sampler", None)):
        sampler = first  # `sampler=BatchSampler(...)` with `batch_size=None` batches in the dataset
        for _ in range(3):  # wrappers (accelerate's BatchSamplerShard) keep the real one inside
            if sampler is None:
                break
            size = getattr(sampler, "batch_size", None)
            if isinstance(size, int):
                return size
            sampler = getattr(sampler, "batch_sampler", None)
    return None


class LoaderRegistry:
    """DataLoaders seen, with settings and counters (plain dicts; frozen into LoaderInfo later)."""

    def __init__(self, roles_file: Path | None):
        self.loaders: dict[int, dict[str, Any]] = {}
        self.roles_file = roles_file
        self._known_pids: set[int] = set()
        self._roles: Any = None  # the roles file, created (exclusively) at the first worker

    def register(self, loader: Any) -> dict[str, Any]:
        key = id(loader)
        info = self.loaders.get(key)
        if info is None or info["_ref"] is not loader:
            dataset = getattr(loader, "dataset", None)
            from torch.utils.data import IterableDataset

            info = {
                "_ref": loader,
                "loader_id": len(self.loaders),
                "cls": f"{type(loader).__module__}.{type(loader).__qualname__}",
                "dataset_type": f"{type(dataset).__module__}.{type(dataset).__qualname__}",
                "iterable_dataset": isinstance(dataset, IterableDataset),
                "batch_size": loader_batch_size(loader),
                "num_workers": int(getattr(loader, "num_workers", 0) or 0),
                "pin_memory": bool(getattr(loader, "pin_memory", False)),
                "prefetch_factor": getattr(loader, "prefetch_factor", None),
                "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
                "drop_last": bool(getattr(loader, "drop_last", False)),
                "batches": 0,
                "iterators": 0,
                "worker_pids": [],
                "first_seen_ns": time.perf_counter_ns(),
                "wait_ns": 0,
                "init_ns": 0,
            }
            self.loaders[key] = info
        return info

    def note_workers(self, info: dict[str, Any], iterator: Any) -> None:
        workers = getattr(iterator, "_workers", None) or ()
        new = []
        for worker in workers:
            pid = getattr(worker, "pid", None)
            if pid and pid not in self._known_pids:
                self._known_pids.add(pid)
                info["worker_pids"].append(pid)
                new.append(pid)
        if new and self.roles_file is not None:
            now = time.monotonic_ns()
            lines = "".join(
                json.dumps({"pid": pid, "role": "dataloader_worker", "loader_id": info["loader_id"], "ts_ns": now}) + "\n"
                for pid in new
            )
            try:
                if self._roles is None:
                    self._roles = create_exclusive(self.roles_file, append=True)
                self._roles.write(lines.encode("utf-8"))
                self._roles.flush()
            except OSError as exc:
                path, self.roles_file = self.roles_file, None  # warned once by the caller; no further attempts
                self.close()
                raise OSError(exc.errno, exc.strerror, str(path)) from None  # the file, not a bare errno

    def close(self) -> None:
        roles, self._roles = self._roles, None
        if roles is not None:
            try:
                roles.close()
            except OSError:
                pass

    def snapshot(self) -> list[dict[str, Any]]:
        # copies taken in one C call each: capture's checkpoint thread reads this while the script runs
        return [{k: v for k, v in dict(info).items() if k not in ("_ref", "in_process")}
                for info in list(self.loaders.values())]


def _frameless(rec: Any) -> Any:
    """The C extension when ``rec`` runs on its core (its hooks then need no Python frame), else None."""
    return FASTREC if FASTREC is not None and isinstance(rec, FASTREC.Core) else None


def _like(wrapper: Any, original: Any) -> Any:
    """A C wrapper dressed as the callable it wraps (``__wrapped__``, name, docstring)."""
    wrapper.__wrapped__ = original
    wrapper.__doc__ = getattr(original, "__doc__", None)
    wrapper.__name__ = getattr(original, "__name__", type(wrapper).__name__)
    wrapper.__qualname__ = getattr(original, "__qualname__", wrapper.__name__)
    return wrapper


def _has_parameters(module: Any) -> bool:
    """Whether a module holds parameters (its own first, then its children's)."""
    try:
        if module._parameters:
            return True
        return next(module.parameters(), None) is not None
    except Exception:  # noqa: BLE001 - an odd module: not a model
        return False


class _AskCompiler:
    """``torch.compiler``'s compiling flag where a torch release does not keep it as a module global."""

    def __init__(self, is_compiling: Callable[[], bool]):
        self._ask = is_compiling

    @property
    def _is_compiling_flag(self) -> bool:
        return bool(self._ask())


def _compiler_state(torch: Any) -> Any:
    """What the forward wrapper reads to step aside under ``torch.compile`` / ``torch.export``
    tracing: ``torch.compiler`` itself when it keeps the flag that ``is_compiling()`` returns
    (reading it saves that call's two Python frames on every root forward; ``is_compiling()``'s
    other test, ``torch.jit.is_scripting()``, is always false in a Python wrapper); otherwise an
    object that asks ``is_compiling()``."""
    compiler = getattr(torch, "compiler", None)
    if isinstance(getattr(compiler, "_is_compiling_flag", None), bool):
        return compiler
    return _AskCompiler(getattr(compiler, "is_compiling", lambda: False))


def _disable_in_forked_children(hooks: TorchHooks) -> None:
    reference = weakref.ref(hooks)

    def after_in_child() -> None:
        target = reference()
        if target is not None:
            target.live = False

    os.register_at_fork(after_in_child=after_in_child)


class TorchHooks:
    """Installs and removes every patch; one instance per capture."""

    def __init__(self, recorder: StepRecorder, warnings: WarningSink, roles_file: Path | None = None,
                 watch_forward: bool = True, overrides: Any = None, batches_file: Path | None = None):
        self.rec = recorder
        self.batches_file = batches_file  # each worker's time per batch (capture/worker_batches.py)
        self.overrides = overrides  # stepscope.capture.overrides.OverrideApplier (`run --set`) or None
        self.warn = warnings
        self.registry = LoaderRegistry(roles_file)
        self.watch_forward = watch_forward
        self.owner_pid = os.getpid()
        self.live = True  # False in forked children (DataLoader workers): they must record nothing
        _disable_in_forked_children(self)
        self._undo: list[Callable[[], None]] = []
        self._codes: set[Any] = set()  # code objects of the installed wrappers
        self.compile_requested = False  # the script called torch.compile
        self.installed = False
        self._root_classes: set[type] = set()
        self._discovering = False
        self._committed_at_discovery = 0
        self._unseen_at_discovery = 0  # the recorder's unseen_forward_steps when discovery ended
        self._last_optimizer_id = 0
        self._last_optimizer: Any = None  # weakref to the last optimizer that stepped
        #: id(module) -> (weak reference, key): whether a root module holds parameters, found once
        self._module_keys: dict[int, tuple[Any, int]] = {}

    # -- install / uninstall -----------------------------------------------------------------
    def install(self) -> None:
        import torch

        self.installed = True
        if self.overrides is not None:  # `run --set`; the record counts where each value took effect
            try:
                self.overrides.install_threads(torch, self._patch)
                self.overrides.install_loader(self._patch)
            except Exception as exc:  # noqa: BLE001
                self.warn.once("overrides", f"--set not fully applied ({type(exc).__name__}: {exc})")
        for name, installer in (
            ("DataLoader", self._install_loader),
            ("backward", self._install_backward),
            ("optimizer", self._install_optimizer),
            ("forward", self._install_forward if self.watch_forward else None),
            ("collectives", self._install_collectives),
            ("torch.compile", self._install_compile_flag),
        ):
            if installer is None:
                continue
            try:
                installer(torch)
            except Exception as exc:  # noqa: BLE001 - degrade, never break the run
                self.warn.once(f"hook:{name}", f"could not hook {name} ({type(exc).__name__}: {exc}); "
                               f"{name} time is counted as 'other'")
        if self.batches_file is not None:
            try:
                from stepscope.capture import worker_batches

                worker_batches.install(self.batches_file, self._patch)
            except Exception as exc:  # noqa: BLE001
                self.warn.once("hook:worker-batches", f"DataLoader workers' batches not timed "
                                                      f"({type(exc).__name__}: {exc})")

    def uninstall(self) -> None:
        self.installed = False
        self.registry.close()
        while self._undo:
            undo = self._undo.pop()
            try:
                undo()
            except Exception:  # noqa: BLE001
                pass

    def _install_compile_flag(self, torch: Any) -> None:
        """Note that the script called ``torch.compile`` (the FLOP step then keeps out of what
        dynamo guards on, :mod:`stepscope.capture.flops`)."""
        original = torch.compile
        hooks = self

        @functools.wraps(original)
        def compile(*args: Any, **kwargs: Any) -> Any:  # noqa: A001 - torch's own name
            hooks.compile_requested = True
            return original(*args, **kwargs)

        self._patch(torch, "compile", compile)

    def _patch(self, owner: Any, name: str, replacement: Any) -> Any:
        code = getattr(replacement, "__code__", None)
        if code is not None:
            self._codes.add(code)
        return patch_attribute(owner, name, replacement, self._undo)

    def wrapper_codes(self) -> frozenset[Any]:
        """The code objects of every wrapper installed: torch.compile must not compile them as frames
        (:mod:`stepscope.capture.compile_watch` marks them skipped, so dynamo compiles the frames
        below them, as without capture)."""
        return frozenset(self._codes)

    # -- DataLoader --------------------------------------------------------------------------
    def _install_loader(self, torch: Any) -> None:
        from torch.utils.data import DataLoader
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        global _TENSOR
        _TENSOR = torch.Tensor
        hooks, rec, registry = self, self.rec, self.registry
        original_iter = DataLoader.__iter__
        original_next = _BaseDataLoaderIter.__next__
        thread_time_ns = time.thread_time_ns

        def __iter__(loader):  # noqa: N807
            if not hooks.live:
                return original_iter(loader)
            start = rec.enter(DATA_WAIT)
            try:
                iterator = original_iter(loader)
            finally:
                end = rec.leave(DATA_WAIT)
            try:
                elapsed = end - start
                info = registry.register(loader)
                info["iterators"] += 1
                info["init_ns"] += elapsed
                info["wait_ns"] += elapsed
                info["in_process"] = not getattr(iterator, "_num_workers", 0)
                iterator._stepscope_loader = info
                rec.loader_init(elapsed)
            except Exception as exc:  # noqa: BLE001
                hooks.warn.once("loader-iter", f"DataLoader start-up not recorded ({exc})")
                return iterator
            try:
                registry.note_workers(info, iterator)
            except OSError as exc:
                hooks.warn.once("loader-roles", f"could not write {exc.filename} ({exc.strerror}): the sampler "
                                                "sees the DataLoader workers as other child processes")
            except Exception as exc:  # noqa: BLE001
                hooks.warn.once("loader-iter", f"DataLoader workers not recorded ({exc})")
            return iterator

        fetch_begin, fetch_end = rec.fetch_begin, rec.fetch_end

        def __next__(iterator):  # noqa: N807
            if not hooks.live:
                return original_next(iterator)
            start = fetch_begin()  # a batch request may end the previous step (and run --max-steps)
            info = getattr(iterator, "_stepscope_loader", None)
            # the training thread's CPU inside next() tells CPU-bound loading in the main process
            # (num_workers=0); read on one step in LOADER_CPU_EVERY (see there)
            measure = info is not None and info["in_process"] and rec.count % LOADER_CPU_EVERY == 0
            cpu_start = thread_time_ns() if measure else 0
            # everything under __next__ is data loading: nn.Module transforms called by the dataset
            # or the collate function are not the model's forward (the forward wrappers let them through)
            depth, rec.forward_depth = rec.forward_depth, 1
            try:
                batch = original_next(iterator)
            except BaseException:
                rec.leave(DATA_WAIT)
                raise
            finally:
                rec.forward_depth = depth
            end = fetch_end(thread_time_ns() - cpu_start if measure else -1, batch_length(batch))
            if info is not None:
                info["batches"] += 1
                info["wait_ns"] += end - start
            return batch

        fast = _frameless(rec)
        if fast is not None:  # the same wrapper in C: no Python frame per batch, none in tracebacks
            __next__ = _like(fast.NextCall(original_next, rec, hooks, batch_length, torch.Tensor, LOADER_CPU_EVERY),
                             original_next)
        self._patch(DataLoader, "__iter__", __iter__)
        self._patch(_BaseDataLoaderIter, "__next__", __next__)

    # -- collectives (the communication phase, see collectives.py) --------------------------
    def _install_collectives(self, torch: Any) -> None:
        from stepscope.capture.collectives import CollectiveHooks

        self.collectives = CollectiveHooks(self.rec, self.warn)
        self._undo.append(self.collectives.uninstall)
        self.collectives.install(torch)

    # -- backward ----------------------------------------------------------------------------
    def _install_backward(self, torch: Any) -> None:
        hooks, rec = self, self.rec
        original_autograd = torch.autograd.backward
        enter, leave = rec.enter, rec.leave

        def timed(original):
            def wrapper(*args, **kwargs):
                if not hooks.live:
                    return original(*args, **kwargs)
                enter(BACKWARD)
                try:
                    return original(*args, **kwargs)
                finally:
                    leave(BACKWARD)

            wrapper.__wrapped__ = original
            wrapper.__doc__ = original.__doc__
            wrapper.__name__ = getattr(original, "__name__", "backward")
            return wrapper

        fast = _frameless(rec)
        if fast is not None:
            wrapper = _like(fast.PhaseCall(original_autograd, rec, hooks, BACKWARD), original_autograd)
        else:
            wrapper = timed(original_autograd)
        self._patch(torch.autograd, "backward", wrapper)

    # -- optimizer ---------------------------------------------------------------------------
    def _install_optimizer(self, torch: Any) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        hooks, rec = self, self.rec
        started, finished = rec.optimizer_started, rec.optimizer_finished

        def on_new(optimizer):  # another optimizer than the last one steps
            hooks._last_optimizer_id, hooks._last_optimizer = id(optimizer), weakref.ref(optimizer)

        def pre(optimizer, args, kwargs):
            if hooks.live:
                key = id(optimizer)
                if key != hooks._last_optimizer_id:
                    on_new(optimizer)
                started(key)  # the same optimizer stepping again ends the step (and run --max-steps)

        def post(optimizer, args, kwargs):
            if hooks.live:
                finished(id(optimizer))

        fast = _frameless(rec)
        if fast is not None:
            pre, post = fast.OptimizerHook(rec, hooks, True, on_new), fast.OptimizerHook(rec, hooks, False)
        pre_handle = register_optimizer_step_pre_hook(pre)
        post_handle = register_optimizer_step_post_hook(post)
        self._undo.append(pre_handle.remove)
        self._undo.append(post_handle.remove)

    def param_dtypes(self) -> tuple[str, ...]:
        """Dtypes of the parameters of the last optimizer that stepped (sorted, unique)."""
        from stepscope.capture.flops import dtype_key

        optimizer = self._last_optimizer() if self._last_optimizer is not None else None
        if optimizer is None:
            return ()
        return tuple(sorted({dtype_key(param.dtype) for group in optimizer.param_groups
                             for param in group["params"]}))

    # -- forward -----------------------------------------------------------------------------
    def _install_forward(self, torch: Any) -> None:
        self._module_cls = torch.nn.Module
        self._grad_enabled = torch.is_grad_enabled  # False under no_grad() and inference_mode()
        self._compiler = _compiler_state(torch)
        self._start_discovery()
        if self.rec.on_commit is None:  # hooks without a capture session (whose callback calls ours)
            self.rec.on_commit = self._own_commit_callback

    def _wrapper(self, original: Callable[..., Any], discover: bool) -> Callable[..., Any]:
        hooks, rec, compiler = self, self.rec, self._compiler

        grad_enabled = self._grad_enabled
        keys = self._module_keys
        fast = _frameless(rec)
        if fast is not None and not discover:
            # a root class's wrapper, in C (no frame per forward, none in tracebacks). Discovery
            # wraps nn.Module.__call__ itself, which torch.compile traces through: a Python function there
            return _like(fast.ForwardCall(original, rec, hooks, keys, compiler, grad_enabled, _has_parameters),
                         original)
        forward_begin, forward_end = rec.forward_begin, rec.forward_end

        def __call__(module, *args, **kwargs):  # noqa: N807
            if rec.forward_depth or not hooks.live or compiler._is_compiling_flag:
                return original(module, *args, **kwargs)
            if discover:
                hooks._root_classes.add(type(module))
            known = keys.get(id(module))
            if known is not None and known[0]() is module:
                key = known[1]
            else:  # first call of this module: whether it holds parameters, kept by id (with a weak reference)
                key = id(module) if _has_parameters(module) else 0
                try:
                    keys[id(module)] = (weakref.ref(module), key)
                except TypeError:  # not weakly referenceable: looked up every call
                    pass
            # the model (key non-zero; a loss module has no parameters) may delimit steps
            forward_begin(key, grad_enabled() if key else True)
            rec.forward_depth = 1
            try:
                return original(module, *args, **kwargs)
            finally:
                rec.forward_depth = 0
                forward_end(key)

        return __call__

    def _start_discovery(self) -> None:
        module_cls = self._module_cls
        original = module_cls.__call__
        self._discovering = True
        self._committed_at_discovery = self.rec.count
        self._patch(module_cls, "__call__", self._wrapper(original, discover=True))
        self._discovery_undo = self._undo[-1]

    def _own_commit_callback(self, index: int) -> None:
        self.rec.next_commit_call = self.after_commit(index)

    def after_commit(self, index: int) -> int:
        """After committed step ``index`` (the capture session calls it); returns the next index it
        must be called at: every step while discovering root modules, then every
        :data:`REDISCOVERY_CHECK_EVERY` steps, to see whether a step committed since had a backward
        and no forward timed (the recorder counts them; a new root module: discovery again)."""
        rec = self.rec
        if not self.installed:  # a commit while capture ends: nothing left to patch or unpatch
            return NEVER
        if self._discovering:
            if rec.count - self._committed_at_discovery < DISCOVERY_STEPS:
                return index + 1
            self._finish_discovery()
            return index + REDISCOVERY_CHECK_EVERY
        if rec.unseen_forward_steps != self._unseen_at_discovery:  # a backward without a forward timed
            self._start_discovery()
            return index + 1
        return index + REDISCOVERY_CHECK_EVERY

    def _finish_discovery(self) -> None:
        self._discovering = False
        self._unseen_at_discovery = self.rec.unseen_forward_steps
        undo = self._discovery_undo
        if undo not in self._undo:  # already undone by uninstall()
            return
        self._undo.remove(undo)
        undo()
        for cls in list(self._root_classes):
            if getattr(cls, "_stepscope_wrapped", False):
                continue
            original = cls.__call__
            wrapper = self._wrapper(original, discover=False)
            wrapper._stepscope_wrapped = True  # type: ignore[attr-defined]
            self._patch(cls, "__call__", wrapper)


class ChildProcesses:
    """Processes the script starts itself through ``multiprocessing`` (``torch.multiprocessing``
    spawn/fork, pools), apart from DataLoader workers; with the CPU time of the process's children.

    ``BaseProcess.start`` is wrapped (restored by :meth:`uninstall`); a process started while the
    training thread is inside a DataLoader (worker start-up) is a worker, not counted here. CPU
    times come from ``getrusage``: ``RUSAGE_CHILDREN`` covers the children that ended and were
    waited for (joined), which is how spawned training processes end. Both are counted from the
    start of the first child: the parent's imports and set-up before it are not compared.
    """

    def __init__(self, in_loader: Callable[[], bool]):
        self.in_loader = in_loader
        self.pids: list[int] = []
        self.owner_pid = os.getpid()
        self._undo: Callable[[], None] | None = None
        self._usage = self._rusage()

    @staticmethod
    def _rusage() -> tuple[float, float] | None:
        try:
            import resource

            own = resource.getrusage(resource.RUSAGE_SELF)
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
        except (ImportError, OSError, ValueError):
            return None
        return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime

    def install(self) -> None:
        from multiprocessing.process import BaseProcess

        tracker = self
        original = BaseProcess.start

        def start(process):
            try:
                mine = os.getpid() == tracker.owner_pid and not tracker.in_loader()
                if mine and not tracker.pids:  # CPU is compared from the first child on
                    tracker._usage = tracker._rusage()
            except Exception:  # noqa: BLE001 - bookkeeping only
                mine = False
            result = original(process)
            try:
                if mine and process.pid:
                    tracker.pids.append(int(process.pid))
            except Exception:  # noqa: BLE001 - bookkeeping only
                pass
            return result

        start.__wrapped__ = original  # type: ignore[attr-defined]
        BaseProcess.start = start  # type: ignore[method-assign]

        def undo() -> None:
            if BaseProcess.start is start:
                BaseProcess.start = original  # type: ignore[method-assign]

        self._undo = undo

    def uninstall(self) -> dict[str, Any]:
        """Restore ``start``; the facts (``child_pids``, ``children_cpu_s``, ``main_cpu_s``: CPU
        seconds since the first child started)."""
        if self._undo is not None:
            self._undo()
            self._undo = None
        facts: dict[str, Any] = {"child_pids": tuple(self.pids)}
        now = self._rusage()
        if self.pids and now is not None and self._usage is not None:
            facts["main_cpu_s"] = round(now[0] - self._usage[0], 3)
            facts["children_cpu_s"] = round(now[1] - self._usage[1], 3)
        return facts
