"""Atomic writes that never follow a planted symlink and leave no temporary file behind."""

from __future__ import annotations

import os

import orjson
import pytest

from stepscope.safe_write import atomic_write, create_exclusive, escape_text, json_bytes


def test_atomic_write_replaces_a_symlink_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    target = tmp_path / "report.json"
    os.symlink(victim, target)
    atomic_write(target, b"{}")
    assert victim.read_text() == "precious"
    assert not target.is_symlink() and target.read_bytes() == b"{}"


def test_atomic_write_failure_leaves_no_temporary_file(tmp_path, monkeypatch):
    def broken_replace(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError):
        atomic_write(tmp_path / "record.json.gz", b"x" * 100)
    assert list(tmp_path.iterdir()) == []


def test_create_exclusive_refuses_an_existing_name_or_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "samples")
    with pytest.raises(OSError):
        create_exclusive(tmp_path / "samples")
    with create_exclusive(tmp_path / "new", append=True) as handle:
        handle.write(b"line\n")
    assert victim.read_text() == "precious"


def test_non_utf8_strings_are_escaped_not_fatal():
    odd = os.fsdecode(b"caf\xe9")
    assert escape_text(odd) == "caf\\xe9"
    assert escape_text("\ud800x") == "\\ud800x"
    assert escape_text("plain é") == "plain é"
    assert orjson.loads(json_bytes({"argv": [odd], odd: 1})) == {"argv": ["caf\\xe9"], "caf\\xe9": 1}
