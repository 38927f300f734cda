"""A clock that moves only when told to (nanosecond ints or float seconds, as the caller starts it)."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 0):
        self.now = start

    def __call__(self):
        return self.now

    def advance(self, amount: float) -> None:
        self.now += amount
