"""Rows kept as columns until something reads them.

A long step's critical path has ~95,000 edges and ~80,000 timeline stretches. Making a Python row
for each costs ~50 ms and ~150 ms on MTIA's step, and the summary, the text output and the JSON
output never read those rows. A :class:`LazyRows` holds the columns. It makes its rows on the
first read (iteration, an index, a comparison) and keeps them; its length needs no rows. It
pickles as its columns.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar, overload

R = TypeVar("R")


class LazyRows(Sequence[R]):
    """A sequence of rows made from ``columns`` by :meth:`make` on first read (subclasses define
    it); ``count`` is the number of rows."""

    __slots__ = ("_columns", "_count", "_rows")

    def __init__(self, count: int, *columns: Any) -> None:
        self._columns = columns
        self._count = count
        self._rows: tuple[R, ...] | None = None

    def make(self, *columns: Any) -> tuple[R, ...]:
        raise NotImplementedError

    def rows(self) -> tuple[R, ...]:
        if self._rows is None:
            self._rows = self.make(*self._columns)
        return self._rows

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> R: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[R, ...]: ...

    def __getitem__(self, index: int | slice) -> R | tuple[R, ...]:
        return self.rows()[index]

    def __iter__(self) -> Iterator[R]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyRows):
            return self.rows() == other.rows()
        return isinstance(other, tuple) and self.rows() == other

    def __hash__(self) -> int:
        return hash(self.rows())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._count} rows)"

    def __getstate__(self) -> tuple[Any, ...]:
        return (self._count, *self._columns)

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self._count, *columns = state
        self._columns, self._rows = tuple(columns), None
