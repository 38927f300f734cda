"""Hugging Face glue: a ``TrainerCallback`` and an Accelerate-friendly profile, for code that prefers
to be explicit.

Neither is needed under ``stepscope run``: ``Trainer`` and ``accelerate`` call the hooked torch
entry points (``DataLoader`` iteration — Accelerate's ``DataLoaderShard`` iterates a plain
``DataLoader`` inside —, ``Module.__call__``, ``Tensor.backward``, ``Optimizer.step``), so steps,
phases, DataLoaders and DDP's gradient all-reduce are captured on the unmodified script. Under
``stepscope run`` both helpers see the running capture and start no second one.

- :class:`StepscopeCallback`: ``Trainer(callbacks=[StepscopeCallback()])`` captures from
  ``on_train_begin`` to ``on_train_end`` (one run directory per job; every process writes its rank),
  marks a step at each ``on_step_end`` (one optimizer step, gradient accumulation included), and
  writes the report at the end (rank 0 merges the ranks).
- :func:`profile_accelerate`: ``with profile_accelerate(accelerator) as session:`` around an
  Accelerate loop; every process agrees on one run directory.

Importing this module imports ``transformers`` only for the callback (lazily).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["StepscopeCallback", "profile_accelerate"]


def _active() -> Any:
    from stepscope.capture import session

    return session.ACTIVE


def _shared_run_dir(out: str | Path | None, broadcast: Any = None) -> Path:
    """One run directory for every process: ``out``, torchrun's run id, or rank 0's choice."""
    if out is not None:
        return Path(out)
    from stepscope.capture.rundir import default_run_dir

    path = default_run_dir("hf")
    if broadcast is not None:
        path = Path(broadcast(str(path)))
    return path


def _broadcast_object(accelerator: Any) -> Any:
    if accelerator is None or getattr(accelerator, "num_processes", 1) <= 1:
        return None

    def send(value: str) -> str:
        from accelerate.utils import broadcast_object_list

        box = [value]
        broadcast_object_list(box, from_process=0)
        return box[0]

    return send


@contextlib.contextmanager
def profile_accelerate(accelerator: Any = None, out: str | Path | None = None, **options: Any) -> Iterator[Any]:
    """``stepscope.profile`` for an Accelerate loop (every process, one run directory).

    Yields the capture session (``session.step()`` marks a step explicitly; optional). Under
    ``stepscope run`` the running session is yielded and nothing else starts.
    """
    running = _active()
    if running is not None:
        yield running
        return
    from stepscope.api import profile

    with profile(_shared_run_dir(out, _broadcast_object(accelerator)), **options) as session:
        yield session


def _callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class _Callback:
    """Body of :class:`StepscopeCallback` (the base class is transformers' ``TrainerCallback``)."""

    def __init__(self, out: str | Path | None = None, *, summary: bool = True, mark_steps: bool = True,
                 sample_interval_s: float | None = 0.1):
        self.out = out
        self.summary = summary
        self.mark_steps = mark_steps
        self.sample_interval_s = sample_interval_s
        self.session: Any = None
        self.owned = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        running = _active()
        if running is not None:
            self.session, self.owned = running, False
            return
        from stepscope.capture.rundir import default_run_dir
        from stepscope.capture.session import CaptureSession

        out = self.out or (Path(args.output_dir) / "stepscope" if getattr(args, "output_dir", None)
                           else default_run_dir("hf-trainer"))
        self.session = CaptureSession(out, target="transformers.Trainer", mode="api",
                                      sample_interval_s=self.sample_interval_s, force=True)
        self.session.start()
        self.owned = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.owned and self.mark_steps and self.session is not None:
            self.session.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.owned or self.session is None:
            return
        session, self.session, self.owned = self.session, None, False
        record = session.stop()
        if record is not None:
            from stepscope.pipeline.publish import publish_run

            publish_run(record, session.run_dir, print_summary=self.summary)

    @property
    def run_dir(self) -> Path | None:
        return self.session.run_dir if self.session is not None else None


def __getattr__(name: str) -> Any:
    if name == "StepscopeCallback":
        cls = type("StepscopeCallback", (_Callback, _callback_base()), {
            "__doc__": "A transformers ``TrainerCallback`` that captures training with stepscope "
                       "(see the module docstring).",
            "__module__": __name__})
        globals()["StepscopeCallback"] = cls
        return cls
    raise AttributeError(name)
