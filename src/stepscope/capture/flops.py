"""FLOPs and aten operators of one training step (``FlopCounterMode`` and a dispatch-mode counter).

Counting slows the step it covers, so it covers exactly one step, after warm-up, and the record
names that step (``record.extra["flops"]["step_index"]``) so statistics can leave it out.
The mode is entered when step :data:`FLOP_STEP` - 1 is committed and left at the next commit, so it
sees that step's forward, backward and optimizer. Failures become one warning.
"""

from __future__ import annotations

from typing import Any

from stepscope.capture.warn import WarningSink

#: Index of the step whose FLOPs are counted (0-based; the first steps are warm-up).
FLOP_STEP = 4


class FlopProbe:
    def __init__(self, warnings: WarningSink, step: int = FLOP_STEP):
        self.warn = warnings
        self.step = step
        self.result: dict[str, Any] | None = None
        self._mode: Any = None
        self._ops: Any = None

    def on_commit(self, index: int) -> None:
        if self.result is not None:
            return
        if self._mode is None and index == self.step - 1:
            self._enter()
        elif self._mode is not None and index >= self.step:
            self._exit(index)

    def _enter(self) -> None:
        try:
            from torch.utils.flop_counter import FlopCounterMode

            mode = FlopCounterMode(display=False)
            mode.__enter__()
            self._mode = mode
            self._ops = OpCounter().__enter__()
        except Exception as exc:  # noqa: BLE001
            self.result = {}
            self.warn.once("flops", f"FLOP counting unavailable ({type(exc).__name__}: {exc}); no MFU")

    def _exit(self, index: int) -> None:
        mode, self._mode = self._mode, None
        try:
            self._ops.__exit__(None, None, None)
            mode.__exit__(None, None, None)
            self.result = {"step_index": index, "flops": int(mode.get_total_flops()), "ops": self._ops.count}
        except Exception as exc:  # noqa: BLE001
            self.result = {}
            self.warn.once("flops", f"FLOP counting failed ({type(exc).__name__}: {exc}); no MFU")

    def close(self) -> None:
        """Leave the mode if the run ended inside the counted step (the count is discarded)."""
        if self._mode is not None:
            mode, self._mode = self._mode, None
            try:
                self._ops.__exit__(None, None, None)
                mode.__exit__(None, None, None)
            except Exception:  # noqa: BLE001
                pass


class OpCounter:
    """Counts aten operators dispatched while active (a ``TorchDispatchMode``).

    Entered with ``FlopCounterMode`` around the same step; ``count`` becomes
    ``record.extra["flops"]["ops"]`` (the launch-overhead rule's operator count).
    """

    def __init__(self) -> None:
        self.count = 0
        self._mode: Any = None

    def __enter__(self) -> OpCounter:
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                counter.count += 1
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)
        self._mode = None
