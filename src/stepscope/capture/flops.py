"""FLOPs, operators and compute dtypes of one training step (a dispatch mode counting with
``torch.utils.flop_counter``'s registry).

``FlopCounterMode`` itself is not used: it registers global module hooks (its module tracker), and
``torch.compile(module)`` warns on the script's stderr when global hooks exist; a torch *function*
mode (the autocast probe) is left out once torch.compile has compiled something, because dynamo
guards on the function-mode stack (the step would recompile). The dispatch mode declares
``ignore_compile_internals``: otherwise dynamo runs a compiled frame eagerly under it and stops
compiling that frame for the rest of the run (4 graphs compiled instead of 8, measured). The
compiled graph's operators still reach the mode (inductor's fused kernels do not: their FLOPs
are missed, matmuls through extern kernels are counted).

Counting slows the step it covers, so it covers exactly one step, after warm-up, and the record
names that step (``record.facts.compute.step_index``) so statistics can leave it out.
The mode is entered when step :data:`FLOP_STEP` - 1 is committed and left at the next commit, so it
sees that step's forward, backward and optimizer. Failures become one warning.

Besides the FLOP total, the step yields :class:`~stepscope.record.run.ComputeFacts`:

- ``ops``: aten operators dispatched for the model's own work; operators run while the training
  thread is inside ``next(loader)`` (``num_workers=0`` transforms) are counted apart as
  ``data_ops``, so data loading is never mistaken for launch overhead;
- ``matmul_flops_by_dtype``: the step's FLOPs split by the dtype of the matmul/convolution inputs
  as they reached the kernels (after autocast), so MFU uses the peak of the dtype that ran;
- ``autocast``: the autocast state seen during the step (``"cpu:bf16"``, ``"cuda:fp16"``);
- ``param_dtypes``: dtypes of the parameters handed to the optimizers (when known);
- ``copies``: the copies between devices (``.to(device)``, ``.cuda()``, ``dst.copy_(src)``), per line
  of the user's code: bytes, count, the time the calls took (a blocking copy returns when it is
  done, after the device's queue ahead of it), whether the host memory was pinned and the copy
  asked to be non-blocking — what tells an input copy that costs the step apart from other work
  on its line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from stepscope.capture.recorder import NEVER
from stepscope.capture.warn import WarningSink
from stepscope.record.run import ComputeFacts, DeviceCopy, is_library_path

#: Index of the step whose FLOPs are counted (0-based; the first steps are warm-up).
FLOP_STEP = 4

#: Recurrent layers run as one fused operator per layer (mkldnn on a CPU) or per module (cuDNN,
#: MIOpen): ``torch.utils.flop_counter`` has no formula for them, and an LSTM's matmuls would be
#: missing from the step's FLOPs and its MFU (pytorch/examples word_language_model: 8.3 of its 11.0
#: GFLOP a step counted). ``name -> (index of the input, index of the weights (a tensor or a list),
#: how many weight-sized passes the call makes)``: forward one; a backward two — the gradient of
#: the inputs and hidden states, and of the weights (cuDNN's only where its ``output_mask`` asks).
_RNN_OPS: dict[str, tuple[int, tuple[int, ...], int]] = {
    "mkldnn_rnn_layer": (0, (1, 2), 1),
    "mkldnn_rnn_layer_backward": (0, (1, 2), 2),
    "_cudnn_rnn": (0, (1,), 1),
    "_cudnn_rnn_backward": (0, (1,), 2),
    "miopen_rnn": (0, (1,), 1),
    "miopen_rnn_backward": (0, (1,), 2),
}

#: Aten operators whose inputs' dtype decides which peak the FLOPs are measured against.
_MATMUL_OPS = frozenset({
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
    "_flash_attention_forward", "_efficient_attention_forward", "addbmm", "_scaled_mm", *_RNN_OPS,
})

#: Aten operators that copy between devices (``tensor.to(device)``/``.cuda()`` and ``dst.copy_(src)``).
_COPY_OPS = frozenset({"_to_copy", "copy_"})

_DTYPE_NAMES = {
    "torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16",
    "torch.float64": "fp64", "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8",
}


def dtype_key(dtype: Any) -> str:
    """Canonical short name of a torch dtype (``torch.bfloat16`` -> ``"bf16"``)."""
    text = str(dtype)
    return _DTYPE_NAMES.get(text, text.removeprefix("torch."))


class FlopProbe:
    """Counts one step; ``result`` becomes :class:`ComputeFacts` (or ``None`` when it failed).

    Args:
        warnings: where failures go.
        in_data_wait: tells whether the training thread is inside ``next(loader)`` right now.
        param_dtypes: returns the dtypes of the optimizers' parameters (best effort).
        step: index of the step to count.
    """

    def __init__(self, warnings: WarningSink, in_data_wait: Callable[[], bool] = lambda: False,
                 param_dtypes: Callable[[], tuple[str, ...]] = tuple, step: int = FLOP_STEP,
                 compiled: Callable[[], bool] = lambda: False):
        self.warn = warnings
        self.in_data_wait = in_data_wait
        self.param_dtypes = param_dtypes
        self.step = step
        self.compiled = compiled  # torch.compile has compiled something: no torch function mode then
        self.result: ComputeFacts | None = None
        self.done = False
        self._mode: Any = None
        self._ops: OpCounter | None = None

    def on_commit(self, index: int) -> int:
        """After committed step ``index``; returns the next index it must be called at."""
        if self.done:
            return NEVER
        if self._mode is None and index == self.step - 1:
            self._enter()
        elif self._mode is not None and index >= self.step:
            self._exit(index)
        if self.done:
            return NEVER
        return self.step - 1 if self._mode is None and index < self.step - 1 else index + 1

    def _enter(self) -> None:
        try:
            self._ops = OpCounter(self.in_data_wait, function_mode=not _safe_flag(self.compiled)).__enter__()
            self._mode = self._ops
        except Exception as exc:  # noqa: BLE001
            self.done = True
            self.warn.once("flops", f"FLOP counting unavailable ({type(exc).__name__}: {exc}); no MFU")

    def _exit(self, index: int) -> None:
        self._mode = None
        ops, self._ops = self._ops, None
        self.done = True
        try:
            assert ops is not None
            ops.__exit__(None, None, None)
            self.result = ComputeFacts(
                step_index=index, flops=int(ops.flops), ops=ops.count, data_ops=ops.data_count,
                matmul_flops_by_dtype=_split_by_dtype(ops.flops_by_op, ops.matmul_dtypes, int(ops.flops)),
                autocast=ops.autocast, param_dtypes=_safe(self.param_dtypes), copies=ops.device_copies(),
            )
        except Exception as exc:  # noqa: BLE001
            self.warn.once("flops", f"FLOP counting failed ({type(exc).__name__}: {exc}); no MFU")

    def close(self) -> None:
        """Leave the mode if the run ended inside the counted step (the count is discarded)."""
        if self._ops is not None:
            ops, self._ops = self._ops, None
            self._mode = None
            self.done = True
            try:
                ops.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                pass


def _safe_flag(getter: Callable[[], bool]) -> bool:
    try:
        return bool(getter())
    except Exception:  # noqa: BLE001
        return False


def _safe(getter: Callable[[], tuple[str, ...]]) -> tuple[str, ...]:
    try:
        return tuple(getter())
    except Exception:  # noqa: BLE001
        return ()


def _split_by_dtype(per_op: dict[str, int], matmul_dtypes: dict[str, str], total: int) -> dict[str, int]:
    """FLOPs per input dtype: each counted operator's FLOPs go to the dtype its inputs had."""
    if total <= 0:
        return {}
    split: dict[str, int] = {}
    for name, flops in per_op.items():
        dtype = matmul_dtypes.get(name)
        if dtype is not None and flops:
            split[dtype] = split.get(dtype, 0) + int(flops)
    if not split and matmul_dtypes:
        only = set(matmul_dtypes.values())
        if len(only) == 1:
            split[only.pop()] = total
    return split


class OpCounter:
    """Counts aten operators dispatched while active (a ``TorchDispatchMode``).

    Operators dispatched while ``in_data_wait()`` is true count in ``data_count``; the rest in
    ``count``. It also notes the input dtype of matmul-like operators (``matmul_dtypes``: the last
    dtype seen per operator name; mixed use within one name is rare) and the autocast state.
    """

    def __init__(self, in_data_wait: Callable[[], bool] = lambda: False, function_mode: bool = True) -> None:
        self.count = 0
        self.data_count = 0
        self.flops = 0
        self.flops_by_op: dict[str, int] = {}
        self.matmul_dtypes: dict[str, str] = {}
        self.autocast: str | None = None
        self.in_data_wait = in_data_wait
        self.function_mode = function_mode
        #: (file, line, function, source, target, pinned, non_blocking, in data wait) -> (count, bytes, ns)
        self.copies: dict[tuple[str, int, str, str, str, bool, bool, bool], tuple[int, int, int]] = {}
        self._library: tuple[str, ...] = ()
        self._user: tuple[str, ...] = ()
        self._mode: Any = None
        self._function_mode: Any = None

    def __enter__(self) -> OpCounter:
        import torch
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _AutocastProbe(TorchFunctionMode):
            """Reads the autocast state above the dispatcher (autocast hides it from kernels)."""

            def __torch_function__(self, func, types, args=(), kwargs=None):
                if counter.autocast is None:
                    counter.autocast = _autocast_state(torch)
                return func(*args, **(kwargs or {}))

        from torch.utils.flop_counter import flop_registry

        def count(mode: Any, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            name = func.__name__.split(".")[0]
            if name in _COPY_OPS:  # timed: a blocking copy returns when it is done
                started = time.perf_counter_ns()
                out = func(*args, **kwargs)
                try:
                    counter._note_copy(name, args, kwargs, time.perf_counter_ns() - started)
                except Exception:  # noqa: BLE001 - the script's copy happened; only its note is lost
                    pass
            else:
                out = func(*args, **kwargs)
            if counter.in_data_wait():
                counter.data_count += 1
                return out
            counter.count += 1
            if name in _MATMUL_OPS:
                counter._note_matmul(name, args)
            flop_count = flop_registry.get(func._overloadpacket)
            flops = (int(flop_count(*args, **kwargs, out_val=out)) if flop_count is not None
                     else rnn_flops(name, args) if name in _RNN_OPS else 0)
            if flops:
                counter.flops += flops
                counter.flops_by_op[name] = counter.flops_by_op.get(name, 0) + flops
            return out

        class _Mode(TorchDispatchMode):
            @classmethod
            def ignore_compile_internals(cls) -> bool:
                # without this, dynamo stops compiling a frame once it ran under a dispatch mode
                # (measured: 4 graphs compiled instead of 8 for the rest of a run)
                return True

            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                # torch keeps dynamo out of a mode's __torch_dispatch__ with torch._disable_dynamo,
                # whose first call imports torch._dynamo: 1.8 s inside the counted step of every
                # run of a script that never compiles (measured on a 2-core box). Until the script
                # imports dynamo no frame can be compiled; the first operator after it does puts
                # the wrapped counter in place (below)
                return "torch._dynamo" in sys.modules

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if "torch._dynamo" in sys.modules:
                    type(self).__torch_dispatch__ = torch._disable_dynamo(count, recursive=True)
                return count(self, func, types, args, kwargs)

        self._torch = torch
        from stepscope.capture.stacks import library_paths, user_paths

        self._library, self._user = library_paths(), user_paths()
        if self.function_mode:  # a torch function mode changes what dynamo guards on: not beside torch.compile
            self._function_mode = _AutocastProbe()
            self._function_mode.__enter__()
        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def _note_copy(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], wall_ns: int) -> None:
        """A copy between devices: its bytes, the time the call took, whether the host side was
        pinned, and the user's line."""
        torch = self._torch
        if name == "_to_copy":
            source, target = args[0] if args else None, kwargs.get("device")
            non_blocking = bool(kwargs.get("non_blocking", False))
        else:  # copy_(dst, src, non_blocking=False)
            if len(args) < 2 or not isinstance(args[0], torch.Tensor):
                return
            source, target = args[1], args[0].device
            non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        if not isinstance(source, torch.Tensor) or target is None:
            return
        target = torch.device(target)
        if target.type == source.device.type:
            return
        host = source if source.device.type == "cpu" else None
        pinned = bool(host.is_pinned()) if host is not None else False
        where = _user_frame(self._library, self._user)
        key = (*where, source.device.type, target.type, pinned, non_blocking, bool(self.in_data_wait()))
        count, size, spent = self.copies.get(key, (0, 0, 0))
        self.copies[key] = (count + 1, size + source.numel() * source.element_size(), spent + wall_ns)

    def device_copies(self) -> tuple[DeviceCopy, ...]:
        """The copies seen, one per line and kind, most bytes first."""
        rows = [DeviceCopy(file, line, function, source, target, count, size, pinned, non_blocking, in_data, spent)
                for (file, line, function, source, target, pinned, non_blocking, in_data), (count, size, spent)
                in self.copies.items()]
        return tuple(sorted(rows, key=lambda item: (-item.bytes, item.file, item.line)))

    def _note_matmul(self, name: str, args: tuple[Any, ...]) -> None:
        torch = self._torch
        for arg in args:
            if isinstance(arg, torch.Tensor) and arg.is_floating_point():
                self.matmul_dtypes[name] = dtype_key(arg.dtype)
                break

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)
        if self._function_mode is not None:
            self._function_mode.__exit__(*exc)
        self._mode = None
        self._function_mode = None


def rnn_flops(name: str, args: tuple[Any, ...]) -> int:
    """FLOPs of one fused recurrent operator (:data:`_RNN_OPS`): each token (time step × sequence,
    packed or padded) goes through every weight matrix of the call once a pass — the input-to-hidden,
    hidden-to-hidden and projection matrices of each layer and direction —, two FLOPs a
    multiply-add; the gates' elementwise work is not counted, as ``torch.utils.flop_counter`` counts
    none. 0 where the arguments are not what the operator takes."""
    source, weights, passes = _RNN_OPS[name]
    if name == "_cudnn_rnn_backward" and args and isinstance(args[-1], (list, tuple)) and len(args[-1]) == 4:
        passes = 1 + bool(args[-1][3])  # output_mask: input, hx, cx, weight
    tokens_of: Any = args[source] if len(args) > source else None
    if getattr(tokens_of, "dim", None) is None or tokens_of.dim() < 2 or not tokens_of.shape[-1]:
        return 0
    tokens = tokens_of.numel() // tokens_of.shape[-1]
    matrices = 0
    for index in weights:
        held = args[index] if len(args) > index else None
        for weight in held if isinstance(held, (list, tuple)) else (held,):
            if getattr(weight, "dim", None) is not None and weight.dim() == 2:
                matrices += weight.numel()
    return 2 * tokens * matrices * passes


def _user_frame(library: tuple[str, ...], user: tuple[str, ...]) -> tuple[str, int, str]:
    """``(file, line, function)`` of the innermost frame of the user's code calling now, as the
    stack samples fold it (:func:`~stepscope.record.run.is_library_path`); ``("", 0, "")`` when
    there is none."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if not is_library_path(code.co_filename, library, user):
            return code.co_filename, frame.f_lineno, code.co_name
        frame = frame.f_back
    return "", 0, ""


def _autocast_state(torch: Any) -> str | None:
    """``"<device>:<dtype>"`` of the first enabled autocast, or None."""
    for device in ("cuda", "cpu", "xpu", "mps"):
        try:
            if torch.is_autocast_enabled(device):
                return f"{device}:{dtype_key(torch.get_autocast_dtype(device))}"
        except (RuntimeError, TypeError, AttributeError):
            continue
    return None
