"""A capture session: hooks + recorder + sidecar + record writing, for `stepscope run` and the API.

:class:`CaptureSession` is used by the launcher around an unmodified script, and by
:func:`profile`, the library API::

    import stepscope

    with stepscope.profile(out="runs/exp1") as session:      # stepscope.api.profile
        for batch in session.wrap(my_generator()):   # DataLoaders are captured without wrap()
            ...
            session.step()                           # optional: explicit step boundaries

Both produce the same record. :meth:`CaptureSession.stop` is idempotent and never raises: it is
called on normal exit, on exceptions, and from signal handlers.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from stepscope.capture import environment
from stepscope.capture.account import ThreadAccountProbe, thread_table
from stepscope.capture.flops import FlopProbe
from stepscope.capture.compile_watch import compile_facts
from stepscope.capture.gc_pauses import GcPauseRecorder
from stepscope.capture.hooks import ChildProcesses, TorchHooks
from stepscope.capture.overrides import MaxStepsReached, OverrideApplier
from stepscope.capture.recorder import CORE, DATA_WAIT, PHASE_NAMES, PYTHON_CORE_REASON, StepRecorder
from stepscope.capture.stacks import DEFAULT_RATE_HZ as DEFAULT_STACKS_HZ
from stepscope.capture.stacks import StackSampler
from stepscope.capture.torch_windows import TraceWindow
from stepscope.capture.warn import WarningSink
from stepscope.errors import UsageError
from stepscope.redact import redact_argv
from stepscope.record import layout
from stepscope.record.store import save_record
from stepscope.record.run import (CaptureFacts, CpuPeak, LoaderInfo, OpCost, RunMeta, RunRecord, SkippedSamples,
                                  ThreadAccount, WorkerBatches)
from stepscope.switches import switch


#: Steps between checks whether the script has started using CUDA (then device timing begins).
DEVICE_CHECK_EVERY = 8


def prepare_run_dir(run_dir: str | Path, rank: int = 0, *, force: bool = False, derived: bool = False) -> Path:
    """Claim the run directory for ``rank`` (see :func:`stepscope.capture.rundir.claim_run_dir`).

    Returns the absolute path (the script may ``os.chdir``); the lock is held until the process
    ends. Raises :class:`CaptureError` (one line, exit 2) when the directory cannot be used.
    """
    from stepscope.capture.rundir import claim_run_dir

    path, lock = claim_run_dir(run_dir, rank, force=force, derived=derived)
    _HELD_LOCKS.append(lock)
    return path


#: Run-directory locks held by this process (released when it exits).
_HELD_LOCKS: list[Any] = []


#: The session capturing this process (None when none is): integrations use it instead of starting
#: a second one under ``stepscope run``.
ACTIVE: CaptureSession | None = None


#: The record is checkpointed this long after capture starts, then at doubling intervals up to
#: CHECKPOINT_MAX_S (``STEPSCOPE_CHECKPOINT_S`` sets the first; 0 turns checkpoints off).
CHECKPOINT_FIRST_S = 2.0
CHECKPOINT_MAX_S = 60.0


def _cuda_initialized_probe() -> Callable[[], bool]:
    """Whether the script has initialised CUDA: ``torch.cuda.is_initialized`` (a flag test), found
    once torch is imported (capture asks every few steps; the device-timing set-up runs once it
    says yes)."""
    found: list[Callable[[], bool]] = []

    def probe() -> bool:
        if not found:
            cuda = getattr(sys.modules.get("torch"), "cuda", None)
            is_initialized = getattr(cuda, "is_initialized", None)
            if not callable(is_initialized):
                return "torch" in sys.modules  # an odd torch: the full check decides
            found.append(is_initialized)
        return found[0]()

    return probe


class CaptureSession:
    """Everything captured in one process (one rank).

    Args:
        run_dir: where the record goes (created if needed).
        target: what runs (script path or module name), for the record.
        mode: ``"script"``, ``"module"`` or ``"api"``.
        argv: the argv the script sees.
        sample_interval_s: sidecar sampling period; ``None`` disables the sidecar.
        profiler: optional stepscope profiler driven with the captured phases.
        count_flops: count one step's FLOPs (for MFU).
        force: replace another run's files in ``run_dir`` instead of refusing the directory.
        derived: ``run_dir`` is a default name (not chosen by the user): refuse a symlink there.
    """

    def __init__(self, run_dir: str | Path, *, target: str = "", mode: str = "api",
                 argv: tuple[str, ...] = (), sample_interval_s: float | None = 0.1,
                 profiler: Any = None, count_flops: bool = True, emit_warnings: bool = True,
                 trace: bool = False, force: bool = False, derived: bool = False,
                 stacks_hz: float = DEFAULT_STACKS_HZ, overrides: dict[str, Any] | None = None,
                 max_steps: int | None = None):
        if sample_interval_s is not None and not (math.isfinite(sample_interval_s) and sample_interval_s > 0):
            raise UsageError(f"sampling interval must be a positive number of seconds, got {sample_interval_s}")
        self.meta = environment.static_meta()
        self.run_dir = prepare_run_dir(run_dir, self.meta["rank"], force=force, derived=derived)
        self.meta.update(target=target, mode=mode, argv=redact_argv(argv) if argv else self.meta["argv"])
        self.meta["git_commit"] = environment.git_commit(target if mode == "script" and target else os.getcwd())
        self.rank = self.meta["rank"]
        self.warnings = WarningSink(emit=emit_warnings)
        self.profiler = profiler
        self.recorder = StepRecorder(phase_listener=_SafeListener(profiler, self.warnings) if profiler else None)
        self.overrides = OverrideApplier(overrides) if overrides else None  # `run --set`
        self.max_steps = max_steps  # `run --max-steps`
        self.stopped_at_max_steps = False
        self.hooks = TorchHooks(self.recorder, self.warnings, roles_file=layout.roles_path(self.run_dir, self.rank),
                                overrides=self.overrides,
                                batches_file=None if not switch("STEPSCOPE_WORKER_BATCHES", True)
                                else layout.worker_batches_path(self.run_dir, self.rank))
        if max_steps is not None:
            self._bound_steps(max_steps)
        self.flops = (FlopProbe(self.warnings, self.recorder.in_data_wait, self.hooks.param_dtypes,
                                compiled=lambda: self.hooks.compile_requested or (
                                    self.compile_watch is not None and bool(self.compile_watch.spans)))
                      if count_flops else None)
        self.trace = TraceWindow(self.run_dir / layout.TRACES_DIR, self.rank, self.warnings) if trace else None
        # code attribution: stack samples and GC pauses (stacks_hz=0 disables both)
        self.stacks = (StackSampler(self.recorder, stacks_hz, warnings=self.warnings,
                                    worker_dir=self.run_dir / f".stacks.rank{self.rank}") if stacks_hz else None)
        self.gc_pauses = GcPauseRecorder(self.recorder) if stacks_hz else None
        # the training thread's on-CPU / waiting / blocked time per phase, on sampled steps
        self.account: ThreadAccountProbe | None = None
        if switch("STEPSCOPE_THREAD_ACCOUNT", True):
            self.account = ThreadAccountProbe(self.recorder, self.warnings)
            if not self.account.enabled:
                self.account = None
        self.sample_interval_s = sample_interval_s
        self.sidecar: Any = None
        self.record: RunRecord | None = None
        self._lock = threading.Lock()
        self._started = False
        self._checkpoints: threading.Event | None = None
        self._checkpoint_thread: threading.Thread | None = None
        self._torch_watcher: Any = None
        self._dynamo_watcher: Any = None
        self.compile_watch: Any = None  # stepscope.capture.compile_watch.CompileWatcher, once dynamo is imported
        # the first check comes at the first commit: a script that moved its model to the GPU before
        # its loop is timed on the device from its second step (found on an H200: 8 steps untimed)
        self._device_checked_at = -DEVICE_CHECK_EVERY
        self.cpu_peaks: dict[str, CpuPeak | None] = {}  # matmul dtype -> this machine's peak
        self.op_cost: OpCost | None = None  # one tiny operator's host cost on this machine
        #: Polled between the steps of finalisation: True when the process should end now
        #: (a second signal arrived); the optional steps after the record's save are then skipped.
        self.should_hurry: Any = lambda: False
        #: what to run when the script ends the process with ``os._exit`` (``stepscope run`` sets its
        #: finalisation: record, report, summary); default: save the record
        self.on_os_exit: Any = None
        self._sigint: Any = None
        self._original_os_exit: Any = None
        self.children: ChildProcesses | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> CaptureSession:
        self.meta["start_wall_ns"] = time.time_ns()
        self.meta["start_ns"] = time.perf_counter_ns()
        self._start_sidecar()
        if self.gc_pauses is not None:  # a Ctrl-C landing in the GC callback must still reach the script:
            from stepscope.capture.gc_pauses import callback_codes  # guarded before the callback is in
            from stepscope.capture.interrupts import SigintGuard, defer_in

            defer_in(*callback_codes())
            self._sigint = SigintGuard()
            _quietly(self.warnings, "sigint", self._sigint.install)
        for part in (self.gc_pauses, self.stacks):  # code attribution
            if part is not None:
                _quietly(self.warnings, "stacks", part.start)
        if self.profiler is not None:
            self._start_profiler()
        from stepscope.capture.torch_import import when_torch_imported

        self._torch_watcher = when_torch_imported(self._install_hooks)
        self._dynamo_watcher = when_torch_imported(self._watch_compile, "torch._dynamo")
        self.children = ChildProcesses(self.recorder.in_data_wait)
        _quietly(self.warnings, "child-processes", self.children.install)
        _quietly(self.warnings, "os-exit", self._watch_os_exit)
        self._started = True
        self._start_checkpoints()
        global ACTIVE
        ACTIVE = self
        return self

    def _start_checkpoints(self) -> None:
        """A thread that saves the record as it stands, at growing intervals, while steps accrue, so
        a process killed outright (SIGKILL, the OOM killer) still leaves a record to report."""
        try:
            first_s = float(os.environ.get("STEPSCOPE_CHECKPOINT_S", CHECKPOINT_FIRST_S))
        except ValueError:
            first_s = CHECKPOINT_FIRST_S
        if first_s <= 0:
            return
        self._checkpoints = threading.Event()
        self._checkpoint_thread = threading.Thread(target=self._checkpoint_loop, args=(first_s,),
                                                   name="stepscope-checkpoint", daemon=True)
        self._checkpoint_thread.start()

    def _checkpoint_loop(self, interval_s: float) -> None:
        assert self._checkpoints is not None
        written = 0
        while not self._checkpoints.wait(interval_s):
            if self.recorder.count > written and self.record is None:
                try:
                    written = self._save_checkpoint()
                except Exception as exc:  # noqa: BLE001 - a checkpoint is a safety net, never a failure
                    self.warnings.once("checkpoint", f"could not save a checkpoint of the record "
                                                     f"({type(exc).__name__}: {exc}); a killed run would lose it")
                    return
                interval_s = min(interval_s * 2, CHECKPOINT_MAX_S)  # the intervals between saves double

    def _save_checkpoint(self) -> int:
        """The record as it stands (committed steps, DataLoaders, notes so far), to the partial
        record file; returns the steps it holds."""
        steps = self.recorder.steps(device=False)  # host times: the device columns are still draining
        now = time.perf_counter_ns()
        meta = self._run_meta(environment.torch_meta(), now, len(steps), "cpu")
        loaders = self._loaders()
        end = int(steps.end_ns[-1]) if len(steps) else now
        note = (f"this is the last checkpoint of the record ({len(steps)} steps, saved "
                f"{(now - self.meta['start_ns']) / 1e9:.1f} s into the run): the process ended without finishing "
                "capture (killed by SIGKILL or the OOM killer, or the machine stopped); what came after is unknown")
        record = RunRecord(meta=meta, steps=steps, loaders=loaders, warnings=(*self.warnings.messages, note),
                           facts=CaptureFacts(trailing_ns=max(0, now - end), inference=self.recorder.inference,
                                              model_forwards=self.recorder.model_forwards,
                                              model_forwards_no_grad=self.recorder.model_forwards_no_grad))
        if self.record is None:  # the final record was not written meanwhile
            save_record(record, layout.partial_record_path(self.run_dir, self.rank))
        return len(steps)

    def _run_meta(self, torch_meta: dict[str, Any], end_ns: int, steps: int, timing: str, **outcome: Any) -> RunMeta:
        """The run's metadata as of ``end_ns`` (the final record's, or a checkpoint's)."""
        return RunMeta(**{**self.meta, **torch_meta, "end_wall_ns": time.time_ns(), "end_ns": end_ns, **outcome,
                          "step_source": self.recorder.mode if steps else "none", "timing": timing})

    def _loaders(self) -> tuple[LoaderInfo, ...]:
        return tuple(LoaderInfo(**{**item, "worker_pids": tuple(item["worker_pids"])})
                     for item in self.hooks.registry.snapshot())

    def _stop_checkpoints(self) -> None:
        if self._checkpoints is not None and self._checkpoint_thread is not None:
            self._checkpoints.set()
            if self._checkpoint_thread is not threading.current_thread():
                self._checkpoint_thread.join(timeout=1.0)

    def _watch_os_exit(self) -> None:
        """``os._exit`` skips atexit and every ``finally``: wrap it so that the training process
        saves what it captured first (forked children — DataLoader workers, multiprocessing — pass
        straight through)."""
        original = os._exit
        session = self

        def _exit(status: int) -> None:
            if os.getpid() == session.meta["pid"] and session.record is None:
                try:
                    code = status if isinstance(status, int) else 1
                    session.warnings.note(f"the script ended the process with os._exit({code}): what it had "
                                          "captured was saved before the process ended")
                    if session.on_os_exit is not None:
                        session.on_os_exit(code)
                    else:
                        session.stop(exit_code=code)
                except BaseException:  # noqa: BLE001 - the process must still end as the script asked
                    pass
            original(status)

        self._original_os_exit = original
        os._exit = _exit  # type: ignore[assignment]  # it does not return either: it ends in original()

    def _restore_os_exit(self) -> None:
        if self._original_os_exit is not None and os.getpid() == self.meta["pid"]:
            os._exit = self._original_os_exit
            self._original_os_exit = None

    def _watch_compile(self) -> None:
        """torch.compile's compilations, graph breaks and recompile limit (once dynamo is imported)."""
        from stepscope.capture.compile_watch import CompileWatcher
        from stepscope.capture.recorder import COMPILE

        watcher = CompileWatcher(self.recorder, self.warnings, COMPILE, skip=self.hooks.wrapper_codes)
        _quietly(self.warnings, "compile", watcher.install)
        self.compile_watch = watcher

    def _install_hooks(self) -> None:
        measure = self.flops is not None and self.meta["local_rank"] == 0  # other local ranks read rank 0's caches
        if measure:  # the price of an operator: cached, else measured now, before the hooks see its steps
            from stepscope.capture.op_cost import op_cost_at_torch_import

            self.op_cost = _quietly(self.warnings, "op-cost", lambda: op_cost_at_torch_import(self.warnings.once))
        self.hooks.install()
        self._chain_commit_callbacks()
        if measure:  # CPU MFU needs this machine's matmul peak: cached, else measured now
            from stepscope.capture.cpu_peak import PEAK_DTYPES, peak_at_torch_import

            self.cpu_peaks = {dtype: peak_at_torch_import(self.warnings.once, dtype) for dtype in PEAK_DTYPES}

    def stop(self, *, exit_code: int | None = None, exception: str | None = None,
             interrupted_by: str | None = None) -> RunRecord | None:
        """Finish capture and write the record. Safe to call twice and from a signal handler.

        Ordered so that an interruption loses nothing: the record is built from what is in memory
        and saved first; only then is the sidecar stopped (its warnings saved with a second write),
        and that is skipped when :attr:`should_hurry` says the process must end now.
        """
        if os.getpid() != self.meta["pid"] or not self._lock.acquire(blocking=False):
            return self.record
        global ACTIVE
        if ACTIVE is self:
            ACTIVE = None
        try:
            if self.record is not None:
                return self.record
            self._restore_os_exit()
            if self._sigint is not None:  # the GC callback leaves first: a Ctrl-C never lands in it unguarded
                if self.gc_pauses is not None:
                    _quietly(self.warnings, "stacks", self.gc_pauses.stop)
                _quietly(self.warnings, "sigint", self._sigint.uninstall)
            self._stop_checkpoints()
            self.record = self._finish(exit_code, exception, interrupted_by)
            if self._save():  # the record is written: its checkpoint is obsolete (else the best left)
                with contextlib.suppress(OSError):
                    layout.partial_record_path(self.run_dir, self.rank).unlink(missing_ok=True)
            if self.sidecar is not None and not self.should_hurry():
                _quietly(self.warnings, "sidecar", self.sidecar.stop)
                notes = [str(note) for note in getattr(self.sidecar, "warnings", ()) or ()]
                if notes:
                    self.record = replace(self.record, warnings=(*self.record.warnings, *notes))
                    if self._save():
                        with contextlib.suppress(OSError):
                            layout.partial_record_path(self.run_dir, self.rank).unlink(missing_ok=True)
            return self.record
        finally:
            self._lock.release()

    def _thread_account(self) -> ThreadAccount | None:
        """The account's accounted steps and the process's threads (stepscope's own left out)."""
        account = self.account
        if account is None:
            return None
        account.close()
        return _quietly(self.warnings, "thread-account", lambda: account.result(thread_table(account.tid)))

    def _worker_batches(self) -> WorkerBatches | None:
        """The DataLoader workers' batches (their file is left in the run directory)."""
        from stepscope.capture.worker_batches import read_rows

        pids = {pid for info in self.hooks.registry.loaders.values() for pid in info["worker_pids"]}
        rows = read_rows(layout.worker_batches_path(self.run_dir, self.rank), pids) if pids else None
        if rows is None:
            return None
        return WorkerBatches(*zip(*rows))

    def _save(self) -> bool:
        """Write the record; False (one warning) when it could not be written."""
        assert self.record is not None
        try:
            save_record(self.record, layout.record_path(self.run_dir, self.rank))
        except OSError as exc:
            self.warnings.once("save", f"could not write the run record "
                                       f"{layout.record_path(self.run_dir, self.rank)} ({exc.strerror or exc})")
            return False
        return True

    def _finish(self, exit_code, exception, interrupted_by) -> RunRecord:
        end_ns = time.perf_counter_ns()
        recorder = self.recorder
        for watcher in (self._torch_watcher, self._dynamo_watcher):
            if watcher is not None:
                watcher.remove()
        recorder.finish()  # the last commit still reaches the FLOP probe and the trace window
        self.hooks.uninstall()
        if self.flops is not None:
            self.flops.close()
        for part in (self.stacks, self.gc_pauses):  # code attribution
            if part is not None:
                _quietly(self.warnings, "stacks", part.stop)
        thread_account = self._thread_account()
        worker_batches = _quietly(self.warnings, "worker-batches", self._worker_batches)
        window = self.trace.close() if self.trace is not None else None
        if recorder.device is not None:
            _quietly(self.warnings, "cuda-drain", recorder.device.drain)
        if self.profiler is not None:
            _quietly(self.warnings, "profiler", self._stop_profiler)
        torch_meta = environment.torch_meta()
        cpu_peak = cpu_peak_bf16 = None
        if torch_meta and recorder.device is None and recorder.count:
            cpu_peak = self._final_cpu_peak(torch_meta.get("intra_op_threads"), "fp32")
            cpu_peak_bf16 = self._final_cpu_peak(torch_meta.get("intra_op_threads"), "bf16")
        op_cost = self.op_cost
        if op_cost is None and self.flops is not None and self.flops.result is not None:
            from stepscope.capture.op_cost import cached_op_cost

            op_cost = _quietly(self.warnings, "op-cost", cached_op_cost)  # another local rank measured it
        overrides = None
        if self.overrides is not None or self.max_steps is not None:
            overrides = (self.overrides or OverrideApplier({})).frozen(self.max_steps, self.stopped_at_max_steps)
        children = self.children.uninstall() if self.children is not None else {}
        in_children = _training_in_children(recorder, children)
        compiled = None
        if self.compile_watch is not None:
            self.compile_watch.remove()
            compiled = _quietly(self.warnings, "compile", lambda: compile_facts(self.compile_watch.facts()))
        facts = CaptureFacts(compute=self.flops.result if self.flops is not None else None, compile=compiled,
                             cpu_peak=cpu_peak, cpu_peak_bf16=cpu_peak_bf16, op_cost=op_cost, trailing_ns=recorder.trailing_ns,
                             inference=recorder.inference, model_forwards=recorder.model_forwards,
                             model_forwards_no_grad=recorder.model_forwards_no_grad,
                             training_in_children=in_children, overrides=overrides,
                             skipped_samples=_skipped_samples(self.warnings), thread_account=thread_account,
                             worker_batches=worker_batches,
                             **children)
        if in_children:
            self.warnings.note(
                f"the training ran in {len(children['child_pids'])} child process(es) the script started "
                f"({children.get('children_cpu_s', 0):.1f} s of CPU against this process's "
                f"{children.get('main_cpu_s', 0):.1f} s); only this process was captured, so its "
                f"{recorder.count} step(s) are not the training and are not diagnosed. Capture a child "
                "with `with stepscope.profile(out=...):` around its training function, or launch the "
                "processes with torchrun -m stepscope run")
        if recorder.foreign_thread_calls:
            self.warnings.note(f"{recorder.foreign_thread_calls} loader/phase calls from other threads were ignored "
                               "(only the thread that started capture is timed)")
        if CORE != "c" and recorder.count:
            self.warnings.note(f"capture ran on its Python core ({PYTHON_CORE_REASON}): its hooks cost about 3x "
                               "the C core's per step")
        from stepscope.capture.sources import source_hashes

        sources = _quietly(self.warnings, "source hashes",
                           lambda: source_hashes(self.meta["target"], self.meta["mode"], self.meta["cwd"]))
        meta = self._run_meta(torch_meta, end_ns, recorder.count, "cuda" if recorder.device is not None else "cpu",
                              exit_code=exit_code, exception=exception, interrupted_by=interrupted_by,
                              source_hashes=sources or {})
        loaders = self._loaders()
        if not loaders and recorder.count:
            self.warnings.note("no torch DataLoader was used: data loading by other means "
                               "(generators, DALI, FFCV) is invisible and counted as 'other'")
        steps = recorder.steps()
        code = _code_attribution(self.stacks, self.gc_pauses, steps, self.warnings)
        return RunRecord(meta=meta, steps=steps, loaders=loaders,
                         warnings=tuple(self.warnings.messages), facts=facts,
                         profiler_windows=(window,) if window is not None else (), **code)

    def _final_cpu_peak(self, threads: int | None, dtype: str) -> CpuPeak | None:
        """The peak measured (or cached) at torch import; the cache's entry for the thread count
        the script ended with when it changed them (no measurement here: the run is over)."""
        peak = self.cpu_peaks.get(dtype)
        if threads is not None and (peak is None or peak.threads != threads):
            try:
                from stepscope.capture.cpu_peak import cached_peak

                peak = cached_peak(threads, dtype=dtype) or peak
            except Exception:  # noqa: BLE001
                pass
        if peak is not None and threads and peak.threads and peak.threads != threads:
            # GEMM scales about linearly with threads; say so rather than compare unlike machines
            self.warnings.note(f"CPU {dtype} peak measured with {peak.threads} threads, scaled to the {threads} "
                               "the script ran with")
            cores = self.meta["cpu_count_logical"] or max(threads, peak.threads)
            scale = min(threads, cores) / min(peak.threads, cores)
            peak = replace(peak, flops_best=peak.flops_best * scale, flops_median=peak.flops_median * scale,
                           threads=threads)
        return peak

    def _bound_steps(self, max_steps: int) -> None:
        """`--max-steps`: end the script (:class:`MaxStepsReached`, exit 0) as soon as ``max_steps``
        steps are committed: when the next batch is requested (before it is fetched) or the next
        optimizer step begins (before it updates anything). Raised between phases, from the hooks'
        own calls, so the record stays consistent and holds exactly ``max_steps`` steps."""
        recorder, owner = self.recorder, self.meta["pid"]

        def stop() -> None:
            if recorder.count >= max_steps and os.getpid() == owner and not self.stopped_at_max_steps:
                self.stopped_at_max_steps = True
                raise MaxStepsReached(recorder.count)

        recorder.at_boundary = stop  # after the commits of a batch request or an optimizer step

    # -- parts ---------------------------------------------------------------------------------
    def _start_sidecar(self) -> None:
        if self.sample_interval_s is None:
            return
        from stepscope.capture.sampler import start_sidecar

        try:
            self.sidecar = start_sidecar(self.run_dir, os.getpid(), self.rank, self.sample_interval_s)
        except Exception as exc:  # noqa: BLE001
            self.warnings.once("sidecar", f"system sampler not started ({exc}); no CPU/memory/disk/GPU samples")

    def _start_profiler(self) -> None:
        profiler = self.profiler
        _quietly(self.warnings, "profiler", lambda: profiler.setup(stage="run", local_rank=self.meta["local_rank"],
                                                                   log_dir=str(self.run_dir)))

    def _stop_profiler(self) -> None:
        self.profiler.describe()
        self.profiler.teardown("run")

    def _chain_commit_callbacks(self) -> None:
        """One callback after committed steps: the hooks' root-module discovery, the FLOP probe, the
        profiler window and the check for CUDA. Each part returns the next step it needs, and the
        recorder calls back only then: a steady step makes no Python call here."""
        hooks, flops, trace, recorder, account = self.hooks, self.flops, self.trace, self.recorder, self.account
        cuda_initialized = _cuda_initialized_probe()

        def on_commit(index: int) -> None:
            wanted = hooks.after_commit(index)
            if flops is not None:
                wanted = min(wanted, flops.on_commit(index))
            if trace is not None:
                wanted = min(wanted, trace.on_commit(index))
            if account is not None:
                wanted = min(wanted, account.on_commit(index))
            if recorder.device is None:
                if index - self._device_checked_at >= DEVICE_CHECK_EVERY:
                    self._device_checked_at = index
                    if cuda_initialized():  # a flag test: the full check only once the script uses CUDA
                        self._maybe_enable_device_timing()
                if recorder.device is None:
                    wanted = min(wanted, self._device_checked_at + DEVICE_CHECK_EVERY)
            recorder.next_commit_call = max(wanted, index + 1)

        recorder.on_commit = on_commit
        recorder.next_commit_call = 0

    def _maybe_enable_device_timing(self) -> None:
        try:
            from stepscope.capture.cuda_timing import DeviceTimer, torch_cuda_backend

            backend = torch_cuda_backend()
            if backend is not None:
                self.recorder.use_device(DeviceTimer(self.recorder.columns, *backend))
        except Exception as exc:  # noqa: BLE001
            self.warnings.once("cuda-timing", f"CUDA event timing unavailable ({exc}); host times only")

    # -- library API helpers -----------------------------------------------------------------
    def wrap(self, iterable: Iterable[Any]) -> Iterable[Any]:
        """Time ``next()`` on any iterable as data wait (DataLoaders are captured without this)."""
        try:
            from torch.utils.data import DataLoader

            if isinstance(iterable, DataLoader):
                return iterable
        except ImportError:
            pass
        return self._timed_iter(iter(iterable))

    def _timed_iter(self, iterator: Iterator[Any]) -> Iterator[Any]:
        from stepscope.capture.hooks import batch_length

        recorder = self.recorder
        while True:
            recorder.batch_requested()
            recorder.enter(DATA_WAIT)
            try:
                item = next(iterator)
            except StopIteration:
                recorder.leave(DATA_WAIT)
                return
            recorder.leave(DATA_WAIT)
            recorder.batch_received(batch_length(item))
            yield item

    def step(self) -> None:
        """Mark the end of a step explicitly (then optimizer steps no longer delimit steps)."""
        self.recorder.mark_step()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Attribute a block to a phase: ``data_wait``, ``forward``, ``backward``, ``optimizer`` or
        ``communication``."""
        if name not in PHASE_NAMES[1:]:
            raise UsageError(f"unknown phase {name!r}; choose one of: {', '.join(PHASE_NAMES[1:])}")
        index = PHASE_NAMES.index(name)
        self.recorder.enter(index)
        try:
            yield
        finally:
            self.recorder.leave(index)


class _SafeListener:
    """Forwards phase boundaries to a profiler; a failing profiler warns once and is dropped."""

    def __init__(self, profiler: Any, warnings: WarningSink):
        self.profiler = profiler
        self.warnings = warnings

    def start(self, action: str) -> None:
        self._call("start", action)

    def stop(self, action: str) -> None:
        self._call("stop", action)

    def _call(self, method: str, action: str) -> None:
        if self.profiler is None:
            return
        try:
            getattr(self.profiler, method)(action)
        except Exception as exc:  # noqa: BLE001
            self.warnings.once("profiler", f"profiler failed on {method}({action!r}): {exc}; profiling stopped")
            self.profiler = None


def _training_in_children(recorder: StepRecorder, children: dict[str, Any]) -> bool:
    """Processes the script started did the training: this process never trained (no backward,
    no optimizer step) and its children used more CPU than it did."""
    if not children.get("child_pids") or recorder.backwards or recorder.optimizer_steps:
        return False
    child_cpu, own_cpu = children.get("children_cpu_s"), children.get("main_cpu_s")
    return child_cpu is not None and own_cpu is not None and child_cpu > own_cpu


def _skipped_samples(warnings: WarningSink) -> tuple[SkippedSamples, ...]:
    """What the script's ``stepscope.data.SkipBadSamples`` datasets skipped (read, never imported:
    a script that made none has not loaded the module)."""
    module = sys.modules.get("stepscope.data.skip")
    if module is None:
        return ()
    try:
        return tuple(SkippedSamples(item.dataset, item.total, item.by_process) for item in module.skip_counts())
    except Exception as exc:  # noqa: BLE001 - instrumentation degrades to a warning
        warnings.once("skipped-samples", f"could not read the skipped-sample counts ({exc!r})")
        return ()


def _quietly(warnings: WarningSink, cause: str, action) -> Any:
    """``action()``, or None with a warning when it fails."""
    try:
        return action()
    except Exception as exc:  # noqa: BLE001
        warnings.once(cause, f"{cause} failed ({type(exc).__name__}: {exc})")
        return None


def _code_attribution(stacks: Any, gc_pauses: Any, steps: Any, warnings: WarningSink) -> dict[str, Any]:
    """The record fields of code attribution (stack samples, GC pauses) that were captured."""
    fields: dict[str, Any] = {}
    for name, part in (("stack_samples", stacks), ("gc_pauses", gc_pauses)):
        if part is not None:
            try:
                fields[name] = part.freeze(steps)
            except Exception as exc:  # noqa: BLE001
                warnings.once(name, f"{name} not recorded ({type(exc).__name__}: {exc})")
    return fields


__all__ = ["CaptureSession", "prepare_run_dir"]
