"""`stepscope run` passes the script's argv, output and exit status through unchanged."""

from __future__ import annotations

import signal

import pytest

from support import run_cli, run_python, write_script
from stepscope.record.store import load_record

PASSTHROUGH = """
    import sys

    print("argv:", sys.argv)
    print("path0-ends-with-script-dir:", sys.path[0].endswith("scripts"))
    print("file:", __file__.endswith("probe.py"), "name:", __name__)
    print("to-stderr", file=sys.stderr)
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"


    def fail():
        raise ValueError("boom")


    if mode == "code":
        sys.exit(7)
    if mode == "msg":
        sys.exit("fatal: bad thing")
    if mode == "raise":
        fail()
    if mode == "interrupt":
        import os, signal
        os.kill(os.getpid(), signal.SIGINT)
    if __name__ == "__main__":
        print("main-guard ran")
"""


@pytest.fixture
def probe(tmp_path):
    return write_script(tmp_path / "scripts", "probe.py", PASSTHROUGH)


@pytest.mark.parametrize("mode, code", [("ok", 0), ("code", 7), ("msg", 1), ("raise", 1),
                                        ("interrupt", -signal.SIGINT)])
def test_output_argv_and_exit_code_pass_through(tmp_path, probe, mode, code, entry):
    args = ["scripts/probe.py", mode, "--lr", "3e-4"]
    bare = run_python(args, tmp_path)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", *args], tmp_path, entry=entry)
    assert bare.returncode == code
    assert wrapped.returncode == bare.returncode, wrapped.stderr
    assert wrapped.stdout == bare.stdout
    assert wrapped.stderr.startswith(bare.stderr), (bare.stderr, wrapped.stderr)
    record = load_record(tmp_path / "out")
    assert record.meta.exit_code == (code if code >= 0 else 128 + signal.SIGINT)
    assert record.meta.argv == ("scripts/probe.py", mode, "--lr", "3e-4")


def test_exception_traceback_is_pythons(tmp_path, probe):
    bare = run_python(["scripts/probe.py", "raise"], tmp_path)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "scripts/probe.py", "raise"], tmp_path)
    assert "Traceback (most recent call last)" in bare.stderr
    assert "stepscope" not in bare.stderr
    assert wrapped.stderr.startswith(bare.stderr)
    traceback_part = wrapped.stderr[: len(bare.stderr)]
    assert "capture" not in traceback_part and "launcher" not in traceback_part
    assert load_record(tmp_path / "out").meta.exception == "ValueError"


FAILS_INSIDE_TORCH = """
    import sys
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Samples(Dataset):
        def __len__(self):
            return 9
        def __getitem__(self, index):
            if sys.argv[1] == "getitem" and index == 5:
                raise ValueError("bad sample 5")
            return torch.zeros(2)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)
        def forward(self, x):
            if x.shape[0] == 1:
                raise RuntimeError("bad batch")
            return self.layer(x)

    model = Net()
    # updated by hand: the wrapped calls under test are the loader's and the model's (the model's class
    # is wrapped by the time batch 5 fails), and torch.optim's first step imports the compiler (~1 s)
    for x in DataLoader(Samples(), batch_size=2):
        model(x).sum().backward()
        with torch.no_grad():
            for weight in model.parameters():
                weight -= 0.1 * weight.grad
"""


@pytest.mark.parametrize("where", ["getitem", "forward"])
def test_a_traceback_through_wrapped_torch_calls_is_pythons(tmp_path, where):
    # capture wraps DataLoader.__next__ and Module.__call__: their frames must not show
    write_script(tmp_path, "fails.py", FAILS_INSIDE_TORCH)
    bare = run_python(["fails.py", where], tmp_path)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "fails.py", where], tmp_path)
    assert bare.returncode == wrapped.returncode == 1
    assert ("bad sample 5" if where == "getitem" else "bad batch") in bare.stderr
    assert wrapped.stderr.startswith(bare.stderr), wrapped.stderr
    assert "stepscope" not in wrapped.stderr[: len(bare.stderr)]


def test_module_mode(tmp_path):
    write_script(tmp_path / "pkg", "__init__.py", "")
    write_script(tmp_path / "pkg", "job.py", """
        import sys
        print("argv0-is-file:", sys.argv[0].endswith("job.py"), sys.argv[1:], __name__, __package__)
        raise SystemExit(3)
    """)
    bare = run_python(["-m", "pkg.job", "a", "--b"], tmp_path)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "-m", "pkg.job", "a", "--b"], tmp_path)
    assert bare.returncode == wrapped.returncode == 3
    assert wrapped.stdout == bare.stdout
    assert load_record(tmp_path / "out").meta.mode == "module"


def test_module_traceback_matches_python(tmp_path):
    write_script(tmp_path / "pkg", "__init__.py", "")
    write_script(tmp_path / "pkg", "crash.py", "def f():\n    return 1 / 0\n\nf()\n")
    bare = run_python(["-m", "pkg.crash"], tmp_path)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "-m", "pkg.crash"], tmp_path)
    assert bare.returncode == wrapped.returncode == 1
    assert wrapped.stderr.startswith(bare.stderr)


def test_spawn_multiprocessing_in_the_script_works(tmp_path):
    write_script(tmp_path, "spawner.py", """
        import multiprocessing as mp


        def square(value):
            return value * value


        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                print(pool.map(square, [1, 2, 3]))
    """)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "spawner.py"], tmp_path)
    assert wrapped.returncode == 0, wrapped.stderr
    assert wrapped.stdout == "[1, 4, 9]\n"


def test_summary_goes_to_stderr_and_run_dir_is_written(tmp_path):
    write_script(tmp_path, "train.py", """
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        torch.manual_seed(0)
        data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
        model = torch.nn.Linear(8, 1)
        for x, y in DataLoader(data, batch_size=8):  # updated by hand (torch.optim: the compiler's import)
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            with torch.no_grad():
                for weight in model.parameters():
                    weight -= 0.1 * weight.grad
        print("done")
    """)
    result = run_cli(["run", "--no-monitor", "train.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "done\n"
    assert result.stderr.startswith("stepscope · train.py") and "steps/s" in result.stderr
    runs = list((tmp_path / "stepscope-runs").iterdir())
    assert len(runs) == 1 and runs[0].name.endswith("-train")
    assert (runs[0] / "report.json").is_file()
    assert len(load_record(runs[0]).steps) == 8
    again = run_cli(["report", str(runs[0])], tmp_path)
    assert again.returncode == 0 and "steps/s" in again.stdout


def test_sigterm_writes_the_record_and_dies_by_sigterm(tmp_path):
    write_script(tmp_path, "term.py", """
        import os, signal
        import torch

        model = torch.nn.Linear(4, 1)
        for step in range(20):  # updated by hand (torch.optim would import the compiler: ~2.5 s)
            model.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            with torch.no_grad():
                for weight in model.parameters():
                    weight -= 0.1 * weight.grad
            if step == 9:
                print("terminating", flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
        print("not reached")
    """)
    result = run_cli(["run", "--no-monitor", "-o", "out", "term.py"], tmp_path)
    assert result.returncode == -signal.SIGTERM
    assert result.stdout == "terminating\n"
    record = load_record(tmp_path / "out")
    assert record.meta.interrupted_by == "SIGTERM"
    assert len(record.steps) >= 9


@pytest.mark.parametrize("args, message", [
    (["run", "missing.py"], "missing.py: no such script"),
    (["run", "-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
    (["run", "--bogus", "x.py"], "unrecognized arguments: --bogus"),
    (["run"], "nothing to run"),
    (["run", "--sample-hz", "0", "x.py"], "--sample-hz must be a finite number > 0"),
    (["run", "--sample-hz", "nan", "x.py"], "--sample-hz must be a finite number > 0, got nan"),
    (["run", "--sample-hz", "inf", "x.py"], "--sample-hz must be a finite number > 0, got inf"),
    (["run", "--sample-hz", "-5", "x.py"], "--sample-hz must be a finite number > 0, got -5"),
    (["run", "--fail-on", "extreme", "ok.py"], "unknown severity 'extreme'"),
    (["run", "-o", "blocker/sub", "ok.py"], "cannot write the run directory"),
    (["report", "nowhere"], "nowhere: no such file or directory"),
    (["demo", "no-such-scenario"], "unknown demo scenario"),
])
def test_bad_input_gives_one_line_and_exit_2(tmp_path, args, message):
    (tmp_path / "blocker").write_text("a file, not a directory")
    write_script(tmp_path, "ok.py", "print('hi')")
    result = run_cli(args, tmp_path)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("stepscope: error:"), result.stderr
    assert message in lines[-1]
    assert "Traceback" not in result.stderr


def test_syntax_error_is_reported_like_python(tmp_path):
    write_script(tmp_path, "broken.py", "x = 1\ndef oops(:\n    pass\n")
    bare = run_python(["broken.py"], tmp_path)
    result = run_cli(["run", "--no-monitor", "broken.py"], tmp_path)
    assert result.returncode == 2
    assert "SyntaxError" in result.stderr and "line 2" in result.stderr
    assert bare.stderr.strip().splitlines()[-1] in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("stepscope: error: broken.py: the script has a SyntaxError")
    assert "Traceback" not in result.stderr


def test_damaged_and_newer_records_are_clear_errors(tmp_path):
    import gzip

    import orjson

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "record.rank0.json.gz").write_bytes(b"\x1f\x8b\x08\x00trash")
    result = run_cli(["report", str(bad)], tmp_path)
    assert result.returncode == 2 and "damaged gzip" in result.stderr
    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "record.rank0.json.gz").write_bytes(gzip.compress(orjson.dumps(
        {"kind": "stepscope.run_record", "schema_version": 999})))
    result = run_cli(["report", str(newer)], tmp_path)
    assert result.returncode == 2 and "upgrade stepscope" in result.stderr


@pytest.mark.parametrize("name", ["simple", "advanced"])
def test_profiler_option_profiles_the_captured_phases(tmp_path, name):
    write_script(tmp_path, "loop.py", """
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        print("trained")
    """)
    result = run_cli(["run", "--no-monitor", "--profiler", name, "-o", "out", "loop.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "trained\n"
    for action in ("data_wait", "forward", "backward", "optimizer"):
        assert action in result.stderr
    if name == "simple":
        assert "Total" in result.stderr


@pytest.mark.parametrize("args, message", [
    (["run", "--profiler", "bogus", "ok.py"], "bogus"),
    (["run", "--profiler", "pytorch", "--trace", "ok.py"], "choose one"),
])
def test_bad_profiler_options(tmp_path, args, message):
    write_script(tmp_path, "ok.py", "print('hi')")
    result = run_cli(args, tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("stepscope: error:")
    assert message in result.stderr


SLOW_LOADER = """
    import time
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Slow(Dataset):  # every sample waits 20 ms: the step waits for data whatever the machine does
        def __len__(self):
            return 64
        def __getitem__(self, index):
            time.sleep(0.02)
            return torch.randn(8)

    model = torch.nn.Linear(8, 1)
    for x in DataLoader(Slow(), batch_size=4):
        model(x).sum().backward()
"""


def test_fail_on_guards_against_findings(tmp_path):
    threshold, code = "high", 3
    write_script(tmp_path, "slow.py", SLOW_LOADER)
    result = run_cli(["run", "--no-monitor", "--no-summary", "-o", "out", "--fail-on", threshold, "slow.py"], tmp_path)
    assert result.returncode == code, result.stderr
    assert f"findings at or above '{threshold}'" in result.stderr
    again = run_cli(["report", "out", "--fail-on", threshold], tmp_path)  # the same gate on the saved run
    assert again.returncode == code and f"findings at or above '{threshold}'" in again.stderr


def test_fail_on_passes_a_run_without_findings(tmp_path):
    write_script(tmp_path, "ok.py", "print('hi')")
    result = run_cli(["run", "--no-monitor", "-o", "out", "--fail-on", "info", "ok.py"], tmp_path)
    assert result.returncode == 0 and result.stdout == "hi\n", result.stderr
    assert run_cli(["report", "out", "--fail-on", "info"], tmp_path).returncode == 0
    bad = run_cli(["report", "out", "--fail-on", "bogus"], tmp_path)
    assert bad.returncode == 2 and "unknown severity 'bogus'" in bad.stderr


def test_fail_on_keeps_the_scripts_own_failure(tmp_path):
    write_script(tmp_path, "fails.py", "import sys\nsys.exit(5)\n")
    result = run_cli(["run", "--no-monitor", "--fail-on", "info", "-o", "out", "fails.py"], tmp_path)
    assert result.returncode == 5
