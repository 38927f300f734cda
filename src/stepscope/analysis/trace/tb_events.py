"""Event roles as the PyTorch Profiler TensorBoard plugin classifies them (its final source).

Contract: :func:`tb_roles` maps every row of an :class:`~stepscope.traces.events.EventTable` to
one plugin event type (``cat`` matched case-insensitively, as the plugin's ``EventTypeMap``):
operator (``cpu_op``/``Operator``), runtime (``Runtime``/``cuda_runtime``/``mtia_runtime``/
``glow_runtime``/``xpu_runtime``/``privateuse1_runtime``), kernel, memcpy, memset, python,
user annotation (``user_annotation``/``gpu_user_annotation``), profiler step (an operator or user
annotation named ``ProfilerStep#N``), python_function, trace, or none. Times stay unrounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from stepscope.traces.events import EventTable

NONE, OPERATOR, RUNTIME, KERNEL, MEMCPY, MEMSET, PYTHON, ANNOTATION, STEP, PYFUNC, TRACE = range(11)
_CAT_TYPES = {
    "trace": TRACE,
    "cpu_op": OPERATOR,
    "operator": OPERATOR,
    "runtime": RUNTIME,
    "cuda_runtime": RUNTIME,
    "mtia_runtime": RUNTIME,
    "glow_runtime": RUNTIME,
    "xpu_runtime": RUNTIME,
    "privateuse1_runtime": RUNTIME,
    "kernel": KERNEL,
    "memcpy": MEMCPY,
    "gpu_memcpy": MEMCPY,
    "memset": MEMSET,
    "gpu_memset": MEMSET,
    "python": PYTHON,
    "python_function": PYFUNC,
    "user_annotation": ANNOTATION,
    "gpu_user_annotation": ANNOTATION,
}
NCCL_OPS = frozenset(f"nccl:{op}" for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter"))
GLOO_OPS = frozenset(f"gloo:{op}" for op in ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter"))


@dataclass(frozen=True)
class TbRoles:
    kind: np.ndarray  # int8 per row, one of the constants above
    step_number: np.ndarray  # int64 per row: N of ProfilerStep#N, -1 otherwise

    def rows(self, *kinds: int) -> np.ndarray:
        return np.flatnonzero(np.isin(self.kind, kinds))


def _step_number(name: str) -> int:
    try:
        return int(name.split("#", 1)[1])
    except (IndexError, ValueError):
        return -1


def tb_roles(events: EventTable) -> TbRoles:
    symbols = events.symbols
    cat_kind = np.zeros(len(symbols.strings) + 1, dtype=np.int8)
    for ident, text in enumerate(symbols.strings):
        cat_kind[ident] = _CAT_TYPES.get(text.lower(), NONE)
    cat_kind[-1] = NONE  # cat == -1 indexes the last slot
    kind = cat_kind[events.cat]
    is_step_name = np.zeros(len(symbols.strings), dtype=bool)
    numbers = np.full(len(symbols.strings), -1, dtype=np.int64)
    for ident in symbols.ids_where(lambda s: s.startswith("ProfilerStep#")):
        number = _step_number(symbols.strings[ident])
        if number >= 0:
            is_step_name[ident] = True
            numbers[ident] = number
    step = np.isin(kind, (OPERATOR, ANNOTATION)) & is_step_name[events.name] if len(kind) else np.zeros(0, bool)
    kind = kind.copy()
    kind[step] = STEP
    step_number = np.where(step, numbers[events.name] if len(kind) else 0, -1)
    return TbRoles(kind=kind, step_number=step_number)
