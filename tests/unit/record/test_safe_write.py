"""Atomic writes that never follow a planted symlink and leave no temporary file behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import orjson
import pytest

from stepscope import safe_write
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


#: A process whose signal handler ends it (as capture's does) while it writes report.json: the
#: signal arrives between the write and the sync, so the handler runs mid-write.
DIES_MID_WRITE = """
    import os, signal, sys
    from stepscope import safe_write
    from stepscope.capture.launcher import die_by

    signal.signal(signal.SIGTERM, lambda signum, frame: die_by(signum))
    real = os.fsync
    def fsync(descriptor):
        os.kill(os.getpid(), signal.SIGTERM)
        real(descriptor)
    os.fsync = fsync
    safe_write.atomic_write(os.path.join(sys.argv[1], "report.json"), b"{}")
    print("not reached")
"""


def test_a_process_that_dies_by_a_signal_mid_write_leaves_no_temporary(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(DIES_MID_WRITE), str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM, proc.stderr
    assert "not reached" not in proc.stdout
    assert list(out.iterdir()) == []


def test_only_the_writing_process_removes_its_temporaries(tmp_path, monkeypatch):
    """A forked child (a DataLoader worker) inherits the list of writes under way, not the writes:
    dying by a signal it leaves the parent's temporary alone."""
    parent_s, own = tmp_path / ".a.0.tmp", tmp_path / ".b.0.tmp"
    parent_s.write_bytes(b"x")
    own.write_bytes(b"x")
    monkeypatch.setattr(safe_write, "_UNFINISHED", {str(parent_s): os.getpid() + 1})
    with safe_write.unfinished(own):
        safe_write.remove_unfinished()
    assert parent_s.exists() and not own.exists()
    assert safe_write._UNFINISHED == {str(parent_s): os.getpid() + 1}


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
