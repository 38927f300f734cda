"""Collectives on an unmodified script: the ``communication`` phase.

Three sources, all installed by :class:`CollectiveHooks` once torch is imported:

1. **Python collectives** (``torch.distributed.all_reduce``, ``all_gather(_into_tensor)``,
   ``reduce_scatter(_tensor)``, ``broadcast``, ``barrier``, ``all_to_all(_single)``, ``send``/``recv``,
   ``isend``/``irecv``, ...): the module attributes are wrapped, so code that calls ``dist.all_reduce``
   is timed; code that bound the function before capture started (``from torch.distributed import
   all_reduce`` at import time of a module loaded earlier) is not. The time the training thread
   spends in the call is the ``communication`` phase; with ``async_op=True`` the returned work is
   wrapped so that the time spent in ``work.wait()`` counts too. Asynchronous calls made by torch
   itself (FSDP) keep their native ``Work`` object: only the launch is timed there.
2. **DDP's gradient all-reduce**: DDP calls no Python collective (its C++ reducer launches one
   all-reduce per bucket). A communication hook is registered on every ``DistributedDataParallel``
   model before its first forward: by default it does exactly what the built-in reduction does (divide
   each bucket by the world size, all-reduce with SUM: ``default_hooks.allreduce_hook``), so results
   are bit-identical; a hook the script registers itself replaces that default and is timed the same
   way (``_register_builtin_comm_hook`` — the C++ fp16 hook — is left untimed, with a warning). Each
   bucket's all-reduce is timed from its launch to its completion (a callback that can change
   neither the result nor an error: see :class:`_HookHolder`). At
   the end of ``backward`` the time after the last bucket was launched (backward's computation is
   over) until the last bucket completed is *exposed*: it moves from ``backward`` to
   ``communication``; the rest of the buckets' time ran under backward's computation and is counted
   in the non-exclusive ``communication_overlap_ns`` column.
3. **CUDA** (NCCL): collectives run on their own stream and the host does not wait, so the host
   phases hold only the launch. Each CUDA bucket / collective records two CUDA events (no
   synchronisation); they are read when they have completed, at a later boundary, and their device
   time is added to ``communication_overlap_ns`` of the step being recorded then (at most a few steps
   late). :class:`DeviceSpans` holds that logic and is tested with fake events.

FSDP2 (``fully_shard``) issues its all-gathers and reduce-scatters through ``dist.all_gather_single``
/ ``dist.reduce_scatter_single`` (torch 2.13) from its hooks: the time in those calls is timed as
communication (inside forward/backward); its asynchronous waits happen inside FSDP (``Work.wait``
of a native work object) and stay in forward/backward.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from stepscope.capture.patching import patch_attribute
from stepscope.capture.recorder import COMMUNICATION, StepRecorder
from stepscope.switches import switch

_now = time.perf_counter_ns

#: ``torch.distributed`` functions wrapped when present.
COLLECTIVES = (
    "all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
    "broadcast", "barrier", "all_to_all", "all_to_all_single", "send", "recv", "isend", "irecv", "reduce",
    "gather", "scatter", "all_gather_object", "broadcast_object_list", "monitored_barrier",
    "all_gather_single", "reduce_scatter_single", "all_gather_coalesced", "all_reduce_coalesced",
    "gather_object", "scatter_object_list", "send_object_list", "recv_object_list", "batch_isend_irecv",
)
#: Functions that always return a work object (no ``async_op`` argument).
ALWAYS_ASYNC = frozenset({"isend", "irecv", "batch_isend_irecv"})


class TimedWork:
    """A collective's ``Work`` whose ``wait()`` counts as communication; everything else delegates."""

    __slots__ = ("_work", "_timer")

    def __init__(self, work: Any, timer: CollectiveTimer):
        self._work = work
        self._timer = timer

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        return self._timer.timed(self._work.wait, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)

    def __repr__(self) -> str:
        return f"TimedWork({self._work!r})"


class DeviceSpans:
    """CUDA event pairs read without synchronising: :meth:`poll` returns the device time of the pairs
    that have completed and keeps the others for later.

    ``event_factory()`` returns an object with ``record()``, ``query()`` and ``elapsed_time(end)``
    (milliseconds), like ``torch.cuda.Event(enable_timing=True)``.
    """

    #: Pairs kept at most while waiting for completion (older ones are dropped and counted).
    MAX_PENDING = 4096

    def __init__(self, event_factory: Callable[[], Any]):
        self.event_factory = event_factory
        self.pending: list[tuple[Any, Any]] = []
        self.dropped = 0

    def begin(self) -> Any:
        event = self.event_factory()
        event.record()
        return event

    def end(self, start: Any) -> None:
        event = self.event_factory()
        event.record()
        if len(self.pending) >= self.MAX_PENDING:
            self.pending.pop(0)
            self.dropped += 1
        self.pending.append((start, event))

    def poll(self) -> int:
        """Nanoseconds of device time of the completed pairs (in order; stops at the first pending one)."""
        total = 0
        done = 0
        for start, end in self.pending:
            if not end.query():
                break
            total += int(max(0.0, float(start.elapsed_time(end))) * 1e6)
            done += 1
        if done:
            del self.pending[:done]
        return total


class CollectiveTimer:
    """Timing state shared by the Python-collective wrappers and the DDP hook."""

    def __init__(self, recorder: StepRecorder, clock: Callable[[], int] = _now):
        self.rec = recorder
        self.clock = clock
        self.owner_thread = threading.get_ident()
        self.active = True
        self.local = threading.local()
        self.buckets: list[list[int]] = []  # [launch_ns, done_ns (0 = not yet)] of the current backward
        self.bucket_count = 0
        self.collective_calls = 0
        self.device: DeviceSpans | None = None

    # -- Python collectives --------------------------------------------------------------------
    def on_owner_thread(self) -> bool:
        return threading.get_ident() == self.owner_thread and not getattr(self.local, "inside", False)

    def timed(self, call: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        if not self.active or not self.on_owner_thread():
            return call(*args, **kwargs)
        self.collective_calls += 1
        self.rec.enter(COMMUNICATION)
        try:
            return call(*args, **kwargs)
        finally:
            self.rec.leave(COMMUNICATION)

    # -- DDP buckets -----------------------------------------------------------------------------
    def bucket_started(self) -> list[int]:
        if self.active and self.rec.comm is None:
            self.rec.comm = self  # the recorder settles buckets at backward's end from now on
        slot = [self.clock(), 0]
        self.buckets.append(slot)
        self.bucket_count += 1
        return slot

    def bucket_finished(self, slot: list[int]) -> None:
        slot[1] = self.clock()

    def backward_done(self, now: int) -> tuple[int, int]:
        """(exposed, overlapped) nanoseconds of the buckets of the backward that ends at ``now``."""
        device = self.device.poll() if self.device is not None else 0
        buckets, self.buckets = self.buckets, []
        if not buckets:
            return 0, device
        exposed, overlapped = split_buckets([(launch, done or now) for launch, done in buckets], now)
        return exposed, overlapped + device


def split_buckets(spans: list[tuple[int, int]], end: int) -> tuple[int, int]:
    """Split bucket all-reduce spans ``(launch, done)`` into (exposed, overlapped) nanoseconds.

    Backward computes until the last bucket is launched; what runs after that, until the last bucket
    completes (at most ``end``), is exposed. The rest of the union of the spans overlapped compute.
    """
    if not spans:
        return 0, 0
    last_launch = max(launch for launch, _ in spans)
    last_done = min(end, max(done for _, done in spans))
    exposed = max(0, last_done - last_launch)
    union = 0
    cursor = None
    for launch, done in sorted((launch, min(done, end)) for launch, done in spans):
        if cursor is None or launch > cursor:
            union += max(0, done - launch)
            cursor = done
        elif done > cursor:
            union += done - cursor
            cursor = done
    return exposed, max(0, union - exposed)


def _async_position(function: Callable[..., Any]) -> int | None:
    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("async_op") if "async_op" in names else None


def _called_from_torch(depth: int = 2) -> bool:
    try:
        name = sys._getframe(depth).f_globals.get("__name__", "")
    except ValueError:
        return False
    return isinstance(name, str) and name.startswith("torch.")


class CollectiveHooks:
    """Installs the Python-collective wrappers and the DDP communication hook; :meth:`uninstall` undoes."""

    def __init__(self, recorder: StepRecorder, warnings: Any, clock: Callable[[], int] = _now):
        self.timer = CollectiveTimer(recorder, clock)
        self.warn = warnings
        self._undo: list[Callable[[], None]] = []
        self.originals: dict[str, Callable[..., Any]] = {}

    def install(self, torch: Any) -> None:
        dist = torch.distributed
        if not dist.is_available():
            return
        self._install_python(dist)
        if not switch("STEPSCOPE_DDP_HOOK", True):  # opt-out: DDP keeps its C++ reduction
            self.warn.once("ddp-hook-off", "STEPSCOPE_DDP_HOOK is off: DDP's gradient all-reduce is not timed "
                           "(counted as backward)")
        else:
            self._install_ddp_safely(torch)
        # the recorder asks the timer for the buckets at each backward's end once a bucket (or a
        # device span) was seen: a run without DDP pays nothing for it

    def _install_ddp_safely(self, torch: Any) -> None:
        try:
            self._install_ddp(torch)
        except Exception as exc:  # noqa: BLE001 - degrade, never break the run
            self.warn.once("hook:ddp", f"could not hook DDP's gradient all-reduce ({type(exc).__name__}: {exc}); "
                           "its time is counted as backward")

    def uninstall(self) -> None:
        self.timer.active = False
        if self.timer.rec.comm is self.timer:
            self.timer.rec.comm = None
        while self._undo:
            try:
                self._undo.pop()()
            except Exception:  # noqa: BLE001
                pass

    def _set(self, owner: Any, name: str, value: Any) -> None:
        patch_attribute(owner, name, value, self._undo)

    # -- torch.distributed.* ----------------------------------------------------------------------
    def _install_python(self, dist: Any) -> None:
        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is None or getattr(original, "_stepscope_wrapped", False):
                continue
            self.originals[name] = original
            self._set(dist, name, self._wrap(name, original))

    def _wrap(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        timer = self.timer
        position = _async_position(original)
        always_async = name in ALWAYS_ASYNC

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not timer.active or not timer.on_owner_thread():
                return original(*args, **kwargs)
            result = timer.timed(original, args, kwargs)
            if result is None:
                return result
            if always_async or kwargs.get("async_op") or (position is not None and len(args) > position
                                                           and args[position]):
                if not _called_from_torch():
                    if isinstance(result, list):  # batch_isend_irecv
                        return [TimedWork(work, timer) for work in result]
                    return TimedWork(result, timer)
            return result

        wrapper._stepscope_wrapped = True  # type: ignore[attr-defined]
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__name__ = getattr(original, "__name__", name)
        wrapper.__qualname__ = getattr(original, "__qualname__", name)
        wrapper.__doc__ = original.__doc__
        wrapper.__module__ = getattr(original, "__module__", "torch.distributed")
        return wrapper

    # -- DDP -------------------------------------------------------------------------------------
    def _install_ddp(self, torch: Any) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        hooks = self
        original_forward = DDP.forward
        original_register = DDP.register_comm_hook
        original_builtin: Any = getattr(DDP, "_register_builtin_comm_hook", None)

        def forward(module: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(module, "_stepscope_comm", None) and hooks.timer.active:
                hooks._attach(module, original_register)
            return original_forward(module, *args, **kwargs)

        def register_comm_hook(module: Any, state: Any, hook: Callable[..., Any]) -> Any:
            holder = getattr(module, "_stepscope_comm", None)
            if isinstance(holder, _HookHolder) and holder.mutable:
                holder.user = (state, hook)  # our hook is registered: it now runs (and times) the script's
                return None
            if holder is None and hooks.timer.active:
                module._stepscope_comm = _HookHolder(hooks, module, user=(state, hook))
                return original_register(module, None, module._stepscope_comm)
            return original_register(module, state, hook)

        def register_builtin(module: Any, comm_hook_type: Any) -> Any:
            if getattr(module, "_stepscope_comm", None) is None:
                module._stepscope_comm = "builtin"
                hooks.warn.once("ddp-builtin-hook", "a built-in C++ DDP communication hook is registered: "
                                "DDP's gradient all-reduce is not timed (counted as backward)")
            return original_builtin(module, comm_hook_type)

        forward.__wrapped__ = original_forward  # type: ignore[attr-defined]
        self._set(DDP, "forward", forward)
        self._set(DDP, "register_comm_hook", register_comm_hook)
        if original_builtin is not None:
            self._set(DDP, "_register_builtin_comm_hook", register_builtin)

    def _attach(self, module: Any, original_register: Callable[..., Any]) -> None:
        holder = _HookHolder(self, module)
        module._stepscope_comm = holder
        try:
            original_register(module, None, holder)
        except Exception as exc:  # noqa: BLE001 - e.g. a hook registered through another path
            module._stepscope_comm = "failed"
            self.warn.once("ddp-hook", f"DDP's gradient all-reduce not timed ({type(exc).__name__}: {exc})")


def _cuda_spans() -> DeviceSpans:
    import torch

    return DeviceSpans(lambda: torch.cuda.Event(enable_timing=True))


class _HookHolder:
    """The communication hook registered on a DDP model: runs the default reduction or the script's
    own hook, and times each bucket.

    Nothing here may change what DDP sees when a bucket fails (a peer died, the script's future
    failed): a Python ``then`` callback that raises turns the error into "Got the following error
    when running the callback: ..." with an ``At:`` stack of the callback's frames. So the script's
    own hook's future goes back to DDP untouched (completion is stamped by ``add_done_callback``,
    whose return value and errors DDP never sees), and the default reduction's callback never
    raises: a bucket whose all-reduce failed is handed to DDP as it stands, and the very exception
    is raised at the end of that backward, after DDP's own final callback, as DDP's wait raises it
    without a hook (:meth:`_arm`)."""

    def __init__(self, hooks: CollectiveHooks, module: Any, user: tuple[Any, Callable[..., Any]] | None = None):
        self.hooks = hooks
        self.group = getattr(module, "process_group", None)
        self.user = user
        self.mutable = True  # the script may still register its own hook (until the first bucket)
        self.armed = False  # the end-of-backward check is queued for the current backward
        self.failures: list[BaseException] = []  # the failed buckets' errors of the current backward
        self.pending: list[Any] = []  # the current backward's bucket futures (for the fallback wait)
        self.__qualname__ = "stepscope_timed_comm_hook"
        self.__name__ = "stepscope_timed_comm_hook"

    def __call__(self, state, bucket):  # no annotations: DDP checks the hook's signature
        self.mutable = False
        timer = self.hooks.timer
        local = timer.local
        slot = timer.bucket_started()
        tensor = bucket.buffer()
        if timer.device is None and getattr(tensor, "is_cuda", False):
            timer.device = _cuda_spans()
        device = timer.device
        start_event = device.begin() if device is not None and tensor.is_cuda else None

        def stamp(fut: Any) -> None:  # completion; never raises, its result is ignored
            try:
                timer.bucket_finished(slot)
                if start_event is not None:
                    device.end(start_event)
            except Exception:  # noqa: BLE001 - timing never fails a bucket
                pass

        if self.user is None:
            # ``default_hooks.allreduce_hook`` (divide by the world size, all-reduce SUM, hand DDP
            # the first tensor of the result), its callback also stamping the bucket
            deferred = self._arm()
            failures = self.failures

            def reduced(fut: Any) -> Any:
                stamp(fut)
                if not deferred:  # no end-of-backward check could be queued: fail as allreduce_hook does
                    return fut.value()[0]
                try:
                    return fut.value()[0]
                except BaseException as exc:  # noqa: BLE001 - raised at the end of backward (see _arm)
                    failures.append(exc)
                    return tensor

            future = self._all_reduce(tensor).then(reduced)
            if deferred:
                self.pending.append(future)
            return future
        local.inside = True
        try:
            user_state, hook = self.user
            future = hook(user_state, bucket)
        finally:
            local.inside = False
        add_done_callback = getattr(future, "add_done_callback", None)
        if add_done_callback is not None:  # anything else: DDP itself says what is wrong with it
            add_done_callback(stamp)
        return future

    # -- a failed bucket fails backward as DDP's own wait does ---------------------------------
    def _arm(self) -> bool:
        """Queue, once per backward, the check that raises a failed bucket's exception at the end of
        backward; False when it cannot be queued (the bucket's callback then raises as torch's own
        ``allreduce_hook`` does, so that no failure is ever lost)."""
        if self.armed:
            return True
        try:
            from torch.autograd import Variable

            Variable._execution_engine.queue_callback(self._after_buckets)
        except Exception:  # noqa: BLE001
            return False
        self.armed = True
        self.failures.clear()
        self.pending.clear()
        return True

    def _after_buckets(self) -> None:
        """Queued by the first bucket, so it runs before DDP's own final callback (which waits for
        every bucket and unflattens them): queue the check behind it."""
        self.armed = False
        try:
            from torch.autograd import Variable

            Variable._execution_engine.queue_callback(self._raise_failure)
        except Exception:  # noqa: BLE001 - wait for the buckets here instead
            for future in self.pending:
                future.wait()
            self._raise_failure()

    def _raise_failure(self) -> None:
        self.pending.clear()
        if self.failures:
            error = self.failures[0]
            self.failures.clear()
            raise error.with_traceback(None)  # as DDP's wait raises it: this frame is capture's, removed when shown

    def _all_reduce(self, tensor: Any) -> Any:
        import torch.distributed as dist

        group = self.group if self.group is not None else dist.group.WORLD
        all_reduce = self.hooks.originals.get("all_reduce", dist.all_reduce)
        assert group is not None
        tensor.div_(group.size())
        return all_reduce(tensor, group=group, async_op=True).get_future()
