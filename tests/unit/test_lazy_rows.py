"""Rows kept as columns until read (``stepscope.lazy_rows``): the length needs no rows, the rows
are made once, on the first read of any kind, and a pickled copy carries the columns only."""

from __future__ import annotations

import pickle
from typing import NamedTuple

import numpy as np

from stepscope.lazy_rows import LazyRows


class Pair(NamedTuple):
    name: str
    value: float


class Pairs(LazyRows[Pair]):
    __slots__ = ()
    made = 0

    def __init__(self, names: tuple[str, ...], values: np.ndarray) -> None:
        super().__init__(len(values), names, values)

    def make(self, names: tuple[str, ...], values: np.ndarray) -> tuple[Pair, ...]:
        Pairs.made += 1
        return tuple(map(Pair, names, values.tolist()))


def test_rows_are_made_once_on_the_first_read_and_not_for_the_length():
    Pairs.made = 0
    pairs = Pairs(("a", "b", "c"), np.array([1.0, 2.0, 3.0]))
    assert len(pairs) == 3 and bool(pairs) and Pairs.made == 0 and repr(pairs) == "Pairs(3 rows)"
    assert pairs[1] == Pair("b", 2.0) and pairs[-1].name == "c" and pairs[:2] == (Pair("a", 1.0), Pair("b", 2.0))
    assert list(pairs) == [Pair("a", 1.0), Pair("b", 2.0), Pair("c", 3.0)] and Pair("c", 3.0) in pairs
    assert Pairs.made == 1


def test_equal_to_the_same_rows_as_columns_or_as_a_tuple_and_hashed_as_them():
    first = Pairs(("a", "b"), np.array([1.0, 2.0]))
    second = Pairs(("a", "b"), np.array([1.0, 2.0]))
    assert first == second and first == (Pair("a", 1.0), Pair("b", 2.0)) and hash(first) == hash(tuple(second))
    assert first != Pairs(("a", "b"), np.array([1.0, 2.5])) and first != [Pair("a", 1.0), Pair("b", 2.0)]
    assert not Pairs((), np.zeros(0)) and Pairs((), np.zeros(0)) == ()


def test_a_pickled_copy_carries_the_columns_and_makes_its_own_rows():
    pairs = Pairs(("a", "b"), np.array([1.0, 2.0]))
    tuple(pairs)  # made here: the copy still carries only the columns
    copy = pickle.loads(pickle.dumps(pairs))
    assert copy._rows is None and len(copy) == 2 and copy == pairs
