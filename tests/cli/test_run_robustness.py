"""`stepscope run` never loses the run: whatever the script does, the record is written, the exit
status and output are Python's, and capture's own trouble is one warning at most."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

from support import cli_env, run_cli, run_python, write_script
from stepscope.record.store import load_record

#: Lightning runs in the scripts' processes only: found, not imported (pytest.importorskip would
#: import it into the test process too, ~4 s of CPU).
needs_lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                     reason="lightning is not installed")


def _temp_files(directory) -> list[str]:
    """The temporary files of unfinished writes left in ``directory`` (none is ever expected)."""
    return sorted(str(path.relative_to(directory)) for path in directory.rglob("*") if path.name.endswith(".tmp"))


# -- 1. exactly two optimizer steps --------------------------------------------------------------

@pytest.mark.parametrize("ending", ["two-steps", "crash-in-third"])
def test_two_optimizer_steps_keep_the_record(tmp_path, ending):
    write_script(tmp_path, "two.py", """
        import sys
        import torch

        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3 if sys.argv[1] == "crash-in-third" else 2):
            if step == 2:
                raise RuntimeError("third iteration fails")
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        print("done")
    """)
    bare = run_python(["two.py", ending], tmp_path)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "two.py", ending], tmp_path)
    assert wrapped.returncode == bare.returncode, wrapped.stderr
    assert wrapped.stdout == bare.stdout
    assert wrapped.stderr.startswith(bare.stderr)
    assert "list.remove" not in wrapped.stderr
    record = load_record(tmp_path / "out")
    assert len(record.steps) == 2
    assert (record.steps.forward_ns > 0).all()


@needs_lightning
def test_lightning_max_steps_two_keeps_the_record(tmp_path):
    write_script(tmp_path, "lit2.py", LIGHTNING.replace("MAX_STEPS", "2").replace("SIGTERM_AT", "-1"))
    result = run_cli(["run", "--no-monitor", "-o", "out", "lit2.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "global_step 2" in result.stdout
    assert len(load_record(tmp_path / "out").steps) == 2


# -- 2. non-UTF-8 bytes in argv, the script path and the cwd -------------------------------------

def test_non_utf8_argv_script_path_and_cwd(tmp_path):
    odd = os.fsdecode(b"caf\xe9")
    work = tmp_path / os.fsdecode(b"w\xe9rk")
    write_script(work / os.fsdecode(b"scr\xefpts"), "s.py", """
        import sys
        print(ascii(sys.argv[1:]))
    """)
    script = os.path.join(os.fsdecode(b"scr\xefpts"), "s.py")
    bare = run_python([script, odd], work)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", script, odd], work)
    assert bare.returncode == wrapped.returncode == 0, wrapped.stderr
    assert wrapped.stdout == bare.stdout == "['caf\\udce9']\n"
    record = load_record(work / "out")
    assert record.meta.argv[1] == "caf\\xe9"
    assert "\\xe9" in record.meta.cwd and "\\xef" in record.meta.target
    assert (work / "out" / "report.json").is_file()


# -- 3. the script changes directory -------------------------------------------------------------

@pytest.mark.parametrize("out", [["-o", "out"], []])
def test_script_that_chdirs_keeps_its_run_directory(tmp_path, out):
    (tmp_path / "elsewhere").mkdir()
    write_script(tmp_path, "wander.py", "import os\nos.chdir('elsewhere')\n" + TRAIN_FLAT)
    result = run_cli(["run", "--no-monitor", *out, "wander.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "out" if out else next((tmp_path / "stepscope-runs").iterdir())
    assert len(load_record(run_dir).steps) == 3
    assert not (tmp_path / "elsewhere" / "out").exists()
    assert not (tmp_path / "elsewhere" / "stepscope-runs").exists()
    assert not list(run_dir.glob("rank*.lock"))  # a finished run leaves no lock behind


#: The scripts of the tests below update their weights by hand: what they test is the process (its
#: streams, signals, files), and torch.optim's first use imports the compiler (~2.5 s of CPU per
#: process, half of such a script's run). Steps are counted per backward then (a loop shape with
#: tests of its own); the optimizer path has the tests above.
TRAIN_FLAT = """import torch
model = torch.nn.Linear(4, 1)
for step in range(3):  # not 2: that count has a regression test of its own
    model.zero_grad()
    model(torch.randn(2, 4)).sum().backward()
    with torch.no_grad():
        for weight in model.parameters():
            weight -= 0.1 * weight.grad
print("trained")
"""


# -- 4. a second signal during finalisation ------------------------------------------------------

WAITER = """
    import sys, time
    import torch

    model = torch.nn.Linear(4, 1)
    for step in range(5):
        model.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        with torch.no_grad():
            for weight in model.parameters():
                weight -= 0.1 * weight.grad
    print("ready", flush=True)
    time.sleep(60)
"""


def _start_in_group(args, cwd, env=None):
    return subprocess.Popen([sys.executable, "-m", "stepscope", *args], cwd=cwd, env=cli_env(env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_second_signal_during_finalisation_keeps_the_record(tmp_path, signum):
    write_script(tmp_path, "wait.py", WAITER)
    process = _start_in_group(["run", "-o", "out", "wait.py"], tmp_path,
                              env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert process.stdout.readline() == "ready\n"
    os.killpg(process.pid, signum)
    time.sleep(0.1)
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        pass
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == -signum, stderr
    assert "stepscope/" not in stderr and "mfu.py" not in stderr
    assert stderr.count("Traceback") == (1 if signum == signal.SIGINT else 0), stderr
    record = load_record(tmp_path / "out")
    assert record.meta.interrupted_by == signal.Signals(signum).name
    assert len(record.steps) >= 4
    assert not _temp_files(tmp_path / "out")


# -- 5. the script's own SIGTERM handlers run --------------------------------------------------

LIGHTNING = """
    import os, signal
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(8, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == SIGTERM_AT:
                os.kill(os.getpid(), signal.SIGTERM)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)


    if __name__ == "__main__":
        data = TensorDataset(torch.randn(96, 8), torch.randn(96, 1))
        trainer = L.Trainer(max_epochs=1, max_steps=MAX_STEPS, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
        trainer.fit(Tiny(), DataLoader(data, batch_size=8))
        print("global_step", trainer.global_step)
"""


@needs_lightning
def test_lightning_sigterm_stops_gracefully_as_under_python(tmp_path):
    write_script(tmp_path, "litterm.py", LIGHTNING.replace("MAX_STEPS", "-1").replace("SIGTERM_AT", "5"))
    bare = run_python(["litterm.py"], tmp_path)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "litterm.py"], tmp_path)
    assert wrapped.returncode == bare.returncode, (bare.stderr[-2000:], wrapped.stderr[-2000:])
    assert wrapped.stdout == bare.stdout
    record = load_record(tmp_path / "out")
    assert record.meta.exit_code == bare.returncode
    assert len(record.steps) >= 4


@pytest.mark.parametrize("chain", [False, True])
def test_scripts_own_sigterm_handler_runs(tmp_path, chain):
    write_script(tmp_path, "graceful.py", f"""
        import os, signal
        import torch

        stop = []
        previous = None


        def on_term(signum, frame):
            stop.append(signum)
            if {chain} and callable(previous):
                previous(signum, frame)


        previous = signal.signal(signal.SIGTERM, on_term)
        model = torch.nn.Linear(4, 1)
        for step in range(50):
            model.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            with torch.no_grad():
                for weight in model.parameters():
                    weight -= 0.1 * weight.grad
            if step == 5:
                os.kill(os.getpid(), signal.SIGTERM)
            if stop:
                break
        print("stopped gracefully after", step)
    """)
    bare = run_python(["graceful.py"], tmp_path)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "graceful.py"], tmp_path)
    assert bare.returncode == wrapped.returncode == 0, wrapped.stderr
    assert wrapped.stdout == bare.stdout == "stopped gracefully after 5\n"
    assert load_record(tmp_path / "out").meta.exit_code == 0


# -- 6. write errors -----------------------------------------------------------------------------

@pytest.mark.parametrize("limit", [4000, 200])
def test_write_errors_are_one_warning_and_keep_the_exit_status(tmp_path, limit):
    # RLIMIT_FSIZE makes every larger write fail with EFBIG, like a full disk (root ignores chmod).
    # 4000 bytes: the record (~1.6 kB compressed, 2026-12) fits with room, report.json (~9 kB) does not
    write_script(tmp_path, "full.py", TRAIN_FLAT + f"""
import resource
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, resource.RLIM_INFINITY))
""")
    bare = run_python(["full.py"], tmp_path)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "full.py"], tmp_path)
    assert bare.returncode == wrapped.returncode == 0, wrapped.stderr
    assert wrapped.stdout == bare.stdout
    assert "Traceback" not in wrapped.stderr
    assert not _temp_files(tmp_path / "out")
    assert not (tmp_path / "out" / "report.json").exists()
    if limit > 1000:  # the record fits, the report does not
        assert len(load_record(tmp_path / "out").steps) == 3
        assert wrapped.stderr.count("could not write") == 1, wrapped.stderr
    else:
        assert not (tmp_path / "out" / "record.rank0.json.gz").exists()
        assert "could not write the run record" in wrapped.stderr


# -- 7. the script closes its standard streams ---------------------------------------------------

@pytest.mark.parametrize("closing", ["sys.stdout.close()", "sys.stderr.close()", "os.close(2)",
                                     "sys.stderr.close(); os.close(2); sys.stdout.close(); os.close(1)"])
def test_script_closing_stdout_or_stderr_keeps_the_record(tmp_path, closing):
    write_script(tmp_path, "closer.py", "import os, sys\n" + TRAIN_FLAT + closing + "\n")
    bare = run_python(["closer.py"], tmp_path)
    wrapped = run_cli(["run", "-o", "out", "closer.py"], tmp_path)
    assert wrapped.returncode == bare.returncode, wrapped.stderr
    assert wrapped.stdout == bare.stdout
    assert "Traceback" not in wrapped.stderr
    assert len(load_record(tmp_path / "out").steps) == 3


# -- 8. writes never follow symlinks -------------------------------------------------------------

def test_symlinks_at_predictable_temp_names_are_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    write_script(tmp_path, "plant.py", TRAIN_FLAT + f"""
import os
for name in ("record.rank0.json.gz", "report.json"):
    os.symlink({str(victim)!r}, os.path.join("out", f".{{name}}.{{os.getpid()}}.tmp"))
""")
    result = run_cli(["run", "--no-monitor", "-o", "out", "plant.py"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert victim.read_text() == "precious"
    assert len(load_record(tmp_path / "out").steps) == 3


def test_planted_symlink_in_the_run_directory_is_refused_or_removed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    write_script(tmp_path, "ok.py", TRAIN_FLAT)
    (tmp_path / "out").mkdir()
    os.symlink(victim, tmp_path / "out" / "samples.rank0.jsonl.gz")
    refused = run_cli(["run", "-o", "out", "ok.py"], tmp_path)
    assert refused.returncode == 2
    assert "holds another run" in refused.stderr and "--force" in refused.stderr
    forced = run_cli(["run", "--force", "-o", "out", "ok.py"], tmp_path)
    assert forced.returncode == 0, forced.stderr
    assert victim.read_text() == "precious"
    assert not (tmp_path / "out" / "samples.rank0.jsonl.gz").is_symlink()


def test_predictable_torchrun_directory_planted_as_symlink_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "stepscope-runs").mkdir()
    os.symlink(elsewhere, tmp_path / "stepscope-runs" / "job42-ok")
    write_script(tmp_path, "ok.py", TRAIN_FLAT)
    result = run_cli(["run", "--no-monitor", "ok.py"], tmp_path, env={"TORCHELASTIC_RUN_ID": "job42"})
    assert result.returncode == 2
    assert "symbolic link" in result.stderr.strip().splitlines()[-1]
    assert list(elsewhere.iterdir()) == []


# -- 11. one run per directory -------------------------------------------------------------------

def test_a_directory_in_use_or_holding_another_run_is_refused_unless_forced(tmp_path):
    write_script(tmp_path, "slow.py", """
        import os, time
        print("started", flush=True)
        while not os.path.exists("go"):
            time.sleep(0.05)
    """)
    write_script(tmp_path, "ok.py", TRAIN_FLAT)
    first = _start_in_group(["run", "-o", "out", "slow.py"], tmp_path)
    try:
        assert first.stdout.readline() == "started\n"
        busy = run_cli(["run", "--no-monitor", "-o", "out", "ok.py"], tmp_path)
        assert busy.returncode == 2
        assert busy.stderr.strip().splitlines()[-1].startswith("stepscope: error: run directory")
        assert "in use" in busy.stderr
    finally:  # never leave the slow run behind, whatever failed
        (tmp_path / "go").write_text("")
        try:
            first.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate()
    assert first.returncode == 0
    assert (tmp_path / "out" / "samples.rank0.jsonl.gz").exists()
    again = run_cli(["run", "--no-monitor", "-o", "out", "ok.py"], tmp_path)
    assert again.returncode == 2
    line = again.stderr.strip().splitlines()[-1]
    assert "holds another run" in line and "--force" in line and "out" in line
    forced = run_cli(["run", "--no-monitor", "--force", "-o", "out", "ok.py"], tmp_path)
    assert forced.returncode == 0, forced.stderr
    record = load_record(tmp_path / "out")
    assert record.meta.target == "ok.py" and record.samples is None  # no samples of the old run


# -- 14. other fatal signals, and noise ----------------------------------------------------------

@pytest.mark.parametrize("name", ["SIGHUP", "SIGQUIT", "SIGUSR1"])
def test_other_fatal_signals_save_the_record_and_die_by_them(tmp_path, name):
    write_script(tmp_path, "sig.py", TRAIN_FLAT + f"import os, signal\nos.kill(os.getpid(), signal.{name})\n")
    def no_core_default_action() -> None:  # and the signal's default action, whatever this process inherited (nohup)
        __import__("resource").setrlimit(__import__("resource").RLIMIT_CORE, (0, 0))
        signal.signal(getattr(signal, name), signal.SIG_DFL)

    no_core = {"preexec_fn": no_core_default_action}
    bare = run_python(["sig.py"], tmp_path, **no_core)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "sig.py"], tmp_path, **no_core)
    assert bare.returncode == wrapped.returncode == -getattr(signal, name), wrapped.stderr
    assert wrapped.stdout == bare.stdout
    record = load_record(tmp_path / "out")
    assert record.meta.interrupted_by == name and len(record.steps) == 3


def test_an_ignored_sighup_stays_ignored(tmp_path):
    write_script(tmp_path, "hup.py", TRAIN_FLAT + "import os, signal\nos.kill(os.getpid(), signal.SIGHUP)\n"
                 "print('survived')\n")
    ignore = {"preexec_fn": lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN)}  # what nohup does
    bare = run_python(["hup.py"], tmp_path, **ignore)
    wrapped = run_cli(["run", "--no-monitor", "-o", "out", "hup.py"], tmp_path, **ignore)
    assert bare.returncode == wrapped.returncode == 0
    assert wrapped.stdout == bare.stdout == "trained\nsurvived\n"


def test_short_script_prints_no_capture_noise(tmp_path):
    write_script(tmp_path, "short.py", "print('hi')\n")
    result = run_cli(["run", "--no-summary", "-o", "out", "short.py"], tmp_path)
    assert result.returncode == 0
    assert result.stdout == "hi\n"
    assert result.stderr == "", result.stderr


OS_EXIT = """
    import os
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8, num_workers=1)
    model = torch.nn.Linear(4, 1)
    for step, (x,) in enumerate(loader):  # updated by hand, as TRAIN_FLAT
        model.zero_grad()
        model(x).sum().backward()
        with torch.no_grad():
            for weight in model.parameters():
                weight -= 0.1 * weight.grad
        if step == 4:
            print("leaving", flush=True)
            os._exit(7)
"""


def _run_to_files(command: list[str], cwd, name: str) -> subprocess.CompletedProcess:
    """``command`` with its stdout and stderr in files: it is over when the process ends, not when
    every child holding a copy of its pipes has closed them."""
    with open(cwd / f"{name}.out", "w+") as out, open(cwd / f"{name}.err", "w+") as err:
        process = subprocess.run(command, cwd=cwd, env=cli_env(), stdout=out, stderr=err, timeout=240)
        out.seek(0), err.seek(0)
        return subprocess.CompletedProcess(command, process.returncode, out.read(), err.read())


def test_os_exit_keeps_the_record_and_the_exit_status(tmp_path):
    # os._exit skips atexit and finally: the record, the report and the summary are written first;
    # the DataLoader worker (a forked child, which also ends through os._exit) passes straight through
    write_script(tmp_path, "leave.py", OS_EXIT)
    # the outputs go to files: the orphaned worker holds inherited pipes open until torch's
    # watchdog sees its parent gone (5 s), under python as under stepscope
    bare = _run_to_files([sys.executable, "leave.py"], tmp_path, "bare")
    result = _run_to_files([sys.executable, "-m", "stepscope", "run", "--no-monitor", "-o", "out", "leave.py"],
                           tmp_path, "run")
    assert bare.returncode == result.returncode == 7, result.stderr[-2000:]
    assert result.stdout == bare.stdout == "leaving\n"
    record = load_record(tmp_path / "out")
    assert len(record.steps) == 5 and record.meta.exit_code == 7
    assert any("os._exit(7)" in warning for warning in record.warnings)
    assert (tmp_path / "out" / "report.json").is_file() and "exit 7" in result.stderr


def _stepscope_frames(stderr: str) -> list[str]:
    """Traceback frames inside stepscope's package, apart from importing the console entry itself
    (a Ctrl-C there lands before any code of ours can catch it, like one during Python's own start)."""
    import re

    import stepscope

    package = os.path.dirname(stepscope.__file__)
    frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', stderr)
    entry_imports = {os.path.join(package, "__init__.py"), os.path.join(package, "_version.py"),
                     os.path.join(package, "__main__.py"),  # `python -m stepscope`: its first line imports the entry
                     os.path.join(package, "cli", "__init__.py"), os.path.join(package, "cli", "entry.py")}
    return [f"{path}:{name}" for path, name in frames
            if path.startswith(package) and not (path in entry_imports and name == "<module>")]


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["console", "module"])
def test_double_ctrl_c_during_start_up_never_shows_stepscope_s_traceback(tmp_path, entry):
    """Two Ctrl-Cs 10 ms apart, from interpreter start to the script's first line: one line and a
    SIGINT death while stepscope starts, the script's own KeyboardInterrupt once it runs."""
    write_script(tmp_path, "slow.py", "import time\ntime.sleep(5)\n")
    from support import CONSOLE_SCRIPT

    prefix = [str(CONSOLE_SCRIPT)] if entry == "console" else [sys.executable, "-m", "stepscope"]
    outcomes = set()
    for delay in (0.0, 0.02, 0.04, 0.06, 0.08, 0.1, 0.13, 0.16, 0.2, 0.25, 0.3, 0.4, 0.6):
        process = subprocess.Popen([*prefix, "run", "--no-monitor", "-o", "out", "--force", "slow.py"], cwd=tmp_path,
                                   env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        time.sleep(0.01)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
        assert not _stepscope_frames(stderr), (delay, stderr)
        assert process.returncode in (-signal.SIGINT, 1), (delay, process.returncode, stderr)
        if stderr == "stepscope: interrupted (Ctrl-C)\n":
            outcomes.add("one line")
        elif 'slow.py", line 2' in stderr:
            outcomes.add("the script's traceback")
    assert "one line" in outcomes, outcomes  # the sweep did cross stepscope's start


# `stepscope run` whose start-up meets a Ctrl-C in a module that does not let it through as itself:
# a C extension's initialisation replaced it with another exception (numpy's `_distributor_init`:
# "TypeError: expected a message argument"), or a library's import caught it
CTRL_C_IN_START_UP = """
import os, signal, sys, time
sys.argv = ["stepscope", "run", "--no-monitor", "-o", "out", "started.py"]
from stepscope.capture import launcher
real = launcher.resolve_script
def resolve(*args):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
    except KeyboardInterrupt:
        {handling}
    return real(*args)
launcher.resolve_script = resolve
from stepscope.cli.entry import console_main
console_main()
"""


@pytest.mark.parametrize("handling", ["raise TypeError('expected a message argument') from None", "pass"],
                         ids=["replaced", "swallowed"])
def test_a_ctrl_c_that_start_up_does_not_let_through_still_ends_stepscope(tmp_path, handling):
    """The Ctrl-C is noted when it arrives: the exception that replaced it ends stepscope with the
    one line and a SIGINT death, not a traceback; one a library swallowed keeps the script from
    starting."""
    write_script(tmp_path, "started.py", "open('started', 'w').close()\n")
    process = subprocess.run([sys.executable, "-c", CTRL_C_IN_START_UP.format(handling=handling)], cwd=tmp_path,
                             env=cli_env(), capture_output=True, text=True, timeout=60)
    assert process.returncode == -signal.SIGINT and process.stderr == "stepscope: interrupted (Ctrl-C)\n", \
        (process.returncode, process.stderr[-2000:])
    assert not (tmp_path / "started").exists()


def test_a_ctrl_c_during_orjson_s_import_waits_for_its_end(tmp_path):
    """orjson's initialisation dereferences the modules it imports unchecked: a Ctrl-C during it
    crashed the interpreter (SIGSEGV, ~1 in 100 double Ctrl-Cs at start-up). The console entry
    imports it with SIGINT blocked. A stand-in orjson sends the Ctrl-C from inside its own import:
    the import finishes, then the Ctrl-C ends stepscope with its one line."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "orjson.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(0.05)  # a blocked SIGINT stays pending here\n"
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    env = cli_env()
    env["PYTHONPATH"] = str(fake) + os.pathsep + env["PYTHONPATH"]
    process = subprocess.run([sys.executable, "-m", "stepscope", "--version"], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=60)
    assert (tmp_path / "imported").exists(), process.stderr  # the module's body ran to its end
    assert process.returncode == -signal.SIGINT and process.stderr == "stepscope: interrupted (Ctrl-C)\n"


def test_a_killed_run_leaves_its_last_checkpoint_to_report(tmp_path):
    """SIGKILL skips every handler: the record's checkpoint, saved while the steps accrued, is what
    `stepscope report` reads, with a note saying the run did not finish capture."""
    # killed once a checkpoint taken after its 30th step is on disk, however long its imports took
    # (a fixed time of steps could end before the next checkpoint on a slow machine: the steps start
    # after torch's import). With a first interval of 0.1 s, capture looks every 0.1 s until there
    # are steps, then saves 0.2, 0.4, 0.8 s ... apart: the 30th step comes ~0.2 s into the steps and
    # a save after it ~0.3-0.7 s in (a first interval of 0.5 s: ~1-1.5 s in)
    write_script(tmp_path, "killed.py", """
        import os, signal, time
        import torch
        model = torch.nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        partial = os.path.join("out", "record.rank0.partial.json.gz")
        steps, enough_at, deadline = 0, None, time.monotonic() + 60
        while time.monotonic() < deadline:
            opt.zero_grad()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            time.sleep(0.005)
            steps += 1
            if steps == 30:
                enough_at = time.time()
            if enough_at is not None and os.path.exists(partial) and os.path.getmtime(partial) > enough_at:
                break
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    result = run_cli(["run", "--no-summary", "-o", "out", "killed.py"], tmp_path, env={"STEPSCOPE_CHECKPOINT_S": "0.1"})
    assert result.returncode == -signal.SIGKILL
    out = tmp_path / "out"
    assert not (out / "record.rank0.json.gz").exists() and (out / "record.rank0.partial.json.gz").is_file()
    record = load_record(out)
    assert len(record.steps) >= 20 and record.meta.step_source == "optimizer"
    assert any("last checkpoint of the record" in note for note in record.warnings)
    report = run_cli(["report", "out"], tmp_path)
    assert report.returncode == 0, report.stderr
    assert "last checkpoint" in report.stdout + report.stderr


def test_a_finished_run_leaves_no_checkpoint(tmp_path):
    # 60 steps at least, and on until a checkpoint is on disk (however long torch's import took):
    # the finished run always has one to remove (60 steps of 20 ms, before, most likely held one)
    write_script(tmp_path, "short.py", """
        import os, time
        import torch
        model = torch.nn.Linear(8, 1)
        partial = os.path.join("out", "record.rank0.partial.json.gz")
        steps, checkpointed, deadline = 0, False, time.monotonic() + 60
        while (steps < 60 or not checkpointed) and time.monotonic() < deadline:
            model.zero_grad()  # updated by hand, as TRAIN_FLAT (the killed run above keeps torch.optim)
            model(torch.randn(4, 8)).sum().backward()
            with torch.no_grad():
                for weight in model.parameters():
                    weight -= 0.1 * weight.grad
            time.sleep(0.005)
            steps += 1
            checkpointed = checkpointed or os.path.exists(partial)
        print("checkpointed" if checkpointed else "no checkpoint in 60 s")
    """)
    result = run_cli(["run", "--no-summary", "--no-monitor", "-o", "out", "short.py"], tmp_path,
                     env={"STEPSCOPE_CHECKPOINT_S": "0.2"})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "checkpointed\n"  # the run had a checkpoint to remove
    assert sorted(p.name for p in (tmp_path / "out").glob("record.*")) == ["record.rank0.json.gz"]
    assert len(load_record(tmp_path / "out").steps) >= 59
