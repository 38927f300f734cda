"""One vocabulary for stepscope's on/off environment switches (``stepscope.switches``)."""

from __future__ import annotations

import pytest

from stepscope.capture import recorder
from stepscope.switches import switch


@pytest.mark.parametrize(("value", "default", "expected"), [
    (None, True, True), (None, False, False), ("", True, True), ("  ", False, False),
    ("0", True, False), ("false", True, False), ("No", True, False), (" OFF ", True, False),
    ("1", False, True), ("true", False, True), ("yes", False, True), ("on", False, True),
    ("enabled", False, True), ("2", True, True),
])
def test_unset_keeps_the_default_off_words_turn_off_anything_else_turns_on(monkeypatch, value, default, expected):
    if value is None:
        monkeypatch.delenv("STEPSCOPE_SOME_SWITCH", raising=False)
    else:
        monkeypatch.setenv("STEPSCOPE_SOME_SWITCH", value)
    assert switch("STEPSCOPE_SOME_SWITCH", default) is expected


def test_pure_python_set_to_an_off_word_keeps_the_c_core(monkeypatch):
    """``STEPSCOPE_PURE_PYTHON=0`` once meant "set", hence on: now it is off, as for every switch."""
    monkeypatch.setenv("STEPSCOPE_PURE_PYTHON", "0")
    assert recorder._c_core()[1] != "STEPSCOPE_PURE_PYTHON is set"
    monkeypatch.setenv("STEPSCOPE_PURE_PYTHON", "yes")
    assert recorder._c_core() == (None, "STEPSCOPE_PURE_PYTHON is set")
