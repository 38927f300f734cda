"""Atomic writes under faults: the bytes are synced before the name points at them, a failed write
names the file it could not write (not its temporary), and what a killed write leaves behind is
never read as a run's file."""

from __future__ import annotations

import errno
import os

import pytest

from stepscope import safe_write
from stepscope.errors import InputError
from stepscope.record import store


def test_the_file_is_synced_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1])
    safe_write.atomic_write(tmp_path / "report.json", b"{}")
    assert calls[:2] == ["fsync", "replace"]
    assert calls[2:] == ["fsync"]  # the directory, so the new name survives a crash
    assert (tmp_path / "report.json").read_bytes() == b"{}"


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_write_names_the_file_not_written_and_keeps_the_old_one(tmp_path, monkeypatch, code):
    target = tmp_path / "record.rank0.json.gz"
    target.write_bytes(b"the previous record")
    real = safe_write.create_exclusive

    class Failing:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            self.handle.write(data[: len(data) // 2])
            raise OSError(code, os.strerror(code))  # as write(2) fails: no file name

    monkeypatch.setattr(safe_write, "create_exclusive", lambda path, **kw: Failing(real(path, **kw)))
    with pytest.raises(OSError) as failure:
        safe_write.atomic_write(target, b"x" * 1000)
    assert failure.value.errno == code and failure.value.filename == str(target)
    assert target.read_bytes() == b"the previous record"
    assert os.listdir(tmp_path) == [target.name]  # the half-written temporary is gone


def test_a_killed_writes_temporary_is_not_a_record(tmp_path):
    (tmp_path / "rank0.lock").write_text('{"job": "process:h:1:1"}')
    (tmp_path / ".record.rank0.json.gz.0123456789abcdef.tmp").write_bytes(b"\x1f\x8b half")
    with pytest.raises(InputError, match="ended \\(was killed\\) before it saved one"):
        store.load_record(tmp_path)


def test_a_record_that_could_not_be_written_beside_its_report_says_so(tmp_path):
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(InputError, match="could not write it .*report.json holds its summary"):
        store.load_record(tmp_path)
