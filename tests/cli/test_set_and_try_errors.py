"""`run --set`/`--max-steps` and `try`: a bad input is one line `stepscope: error: …` and exit 2,
before anything runs (the scripts here would print if they ran)."""

from __future__ import annotations

import pytest
from support import run_cli, write_script

from stepscope.cli.main import main

SCRIPT = 'print("the script ran")\n'


@pytest.mark.parametrize(("args", "message"), [
    (["run", "--set", "dataloader.workers=2", "s.py"], "unknown key 'dataloader.workers'; accepted keys: "
                                                       "dataloader.batch_size, dataloader.num_workers, "),
    (["run", "--set", "dataloader.num_workers=many", "s.py"], "dataloader.num_workers: expected an integer"),
    (["run", "--set", "torch.num_threads", "s.py"], "--set expects KEY=VALUE"),
    (["run", "--set", "dataloader.num_workers=0", "--set", "dataloader.prefetch_factor=2", "s.py"],
     "needs DataLoader workers"),
    (["run", "--max-steps", "0", "s.py"], "--max-steps must be at least 1"),
    (["run", "--max-steps", "x", "s.py"], "argument --max-steps: invalid int value"),
    (["demo", "--set", "dataloader.pin_memory=perhaps"], "expected true or false"),
    (["run", "--set", "dataloader.num_workers=1000000000", "s.py"],
     "dataloader.num_workers: 1000000000 is past the bound of "),
    (["run", "--set", "torch.num_threads=99999", "s.py"], "torch.num_threads: 99999 is past the bound of "),
    (["demo", "--set", "dataloader.prefetch_factor=1000"], "prefetch_factor: 1000 is past the bound of 64"),
    (["try", "--steps", "1", "s.py"], "--steps must be at least 2"),
    (["try", "--repeats", "0", "s.py"], "--repeats must be at least 1"),
    (["try", "--only", "num_workers", "s.py"], "--only: unknown key 'num_workers'; accepted keys"),
    (["try", "missing.py"], "missing.py: no such script"),
    (["try", "-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
    (["try"], "nothing to try"),
    (["try", "--from", "nowhere", "s.py"], "nowhere: no report.json here"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, args, message):
    write_script(tmp_path, "s.py", SCRIPT)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) if "invalid int" in message else _nothing():
        code = main(args)
        assert code == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("stepscope: error: ") and message in captured.err, captured.err
    assert captured.err.count("\n") == 1 and "the script ran" not in captured.out


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("command", [["run", "--set", "bogus=1", "s.py"], ["try", "--only", "bogus", "s.py"]])
def test_bad_key_through_both_entry_points(tmp_path, entry, command):
    write_script(tmp_path, "s.py", SCRIPT)
    result = run_cli(command, tmp_path, entry=entry, timeout=120)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("stepscope: error: ") and result.stderr.count("\n") == 1
    assert "accepted keys: dataloader.batch_size" in result.stderr and "torch.num_threads" in result.stderr


def test_try_refuses_a_used_output_directory(tmp_path, entry):
    write_script(tmp_path, "s.py", SCRIPT)
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "file").write_text("x")
    result = run_cli(["try", "-o", "used", "s.py"], tmp_path, entry=entry, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "not an empty directory" in result.stderr
