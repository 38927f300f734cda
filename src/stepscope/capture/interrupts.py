"""A Ctrl-C reaches the script even when it lands in one of capture's callbacks.

Python turns SIGINT into ``KeyboardInterrupt`` at the next bytecode boundary of the main thread.
When that boundary is inside a ``gc.callbacks`` function — capture's GC pause timer runs at every
collection, and an ``import torch`` collects hundreds of times — the interpreter reports the
exception as "Exception ignored in …" and drops it: the script never sees its Ctrl-C and runs on
(measured: one SIGINT 0.7–1.1 s into ``stepscope run`` of a script importing torch was lost every
time). Under plain Python there is no such callback, so nothing is lost.

:class:`SigintGuard` replaces Python's default SIGINT handler (only that one: a handler the
script installs is left alone) with one that raises ``KeyboardInterrupt`` as the default does,
except when the interrupted frame is inside a registered callback (:func:`defer_in`); then a
short-lived thread asks for the signal again 2 ms later (``_thread.interrupt_main``), which
delivers it at the main thread's next boundary, once the callback has returned (a callback runs
for microseconds; if the main thread is in one again by then, the same happens again). One
redelivery is scheduled at a time.
"""

from __future__ import annotations

import _thread
import signal
import threading
import time
from types import CodeType, FrameType

REDELIVERY_DELAY_S = 0.002

_DEFERRED: set[CodeType] = set()


def defer_in(*codes: CodeType) -> None:
    """A ``KeyboardInterrupt`` must not be raised while one of these code objects runs."""
    _DEFERRED.update(codes)


def in_deferred(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code in _DEFERRED:
            return True
        frame = frame.f_back
    return False


class SigintGuard:
    def __init__(self) -> None:
        self.installed = False
        self._scheduled = threading.Event()

    def install(self) -> None:
        """Take over SIGINT if it still has Python's default handler (main thread only)."""
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._handle)
            self.installed = True

    def uninstall(self) -> None:
        if self.installed and signal.getsignal(signal.SIGINT) == self._handle:
            try:
                signal.signal(signal.SIGINT, signal.default_int_handler)
            except ValueError:  # not the main thread: leave it, it behaves as the default does
                pass
        self.installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if in_deferred(frame):
            if not self._scheduled.is_set():
                self._scheduled.set()
                threading.Thread(target=self._redeliver, args=(signum,), daemon=True,
                                 name="stepscope-sigint").start()
            return
        raise KeyboardInterrupt

    def _redeliver(self, signum: int) -> None:
        time.sleep(REDELIVERY_DELAY_S)  # the main thread leaves the callback meanwhile
        self._scheduled.clear()
        _thread.interrupt_main(signal.Signals(signum))
