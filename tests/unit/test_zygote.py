"""The warm interpreter the end-to-end tests fork their processes from (``tests/zygote.py``) must
stand for a cold start: the same argv, path, ``__main__``, streams, exit status, traceback and
death by signal as ``subprocess.run`` of the same command, and a cold start wherever it could not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import zygote
from support import cli_env, run_command, write_script

pytestmark = pytest.mark.slow

#: A torch script (so it is served warm) that prints what a program sees of its own start.
PROBE = """
    import os, sys
    warm = "torch" in sys.modules
    import torch
    print(sys.argv, sys.path[0], __name__, __file__, __spec__, type(__loader__).__name__, os.getcwd())
    print(os.environ.get("PROBE_VALUE"), sys.stdin.fileno(), flush=True)
    print("to stderr", file=sys.stderr)
    print("WARM" if warm else "COLD", file=sys.stderr)
    if len(sys.argv) > 1 and sys.argv[1] == "exit":
        sys.exit(7)
    if len(sys.argv) > 1 and sys.argv[1] == "raise":
        def inner():
            raise ValueError("planted")
        inner()
    if len(sys.argv) > 1 and sys.argv[1] == "interrupt":
        import atexit
        atexit.register(print, "atexit ran", flush=True)
        raise KeyboardInterrupt
"""


def both(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    """The same command run cold and forked warm (served warm from the second request on)."""
    command = [sys.executable, "probe.py", *args]
    env = cli_env({"PROBE_VALUE": "42"})
    cold = run_command(command, tmp_path, env, timeout=120, cold=True)
    warm = None
    for _ in range(2):
        warm = zygote.run(command, tmp_path, env, timeout=120)
        if warm is not None:
            break
    assert warm is not None, ("a torch script in the tests' environment is served warm from its second request; "
                              f"servers given up: {zygote.GIVEN_UP}")
    return cold, warm


def strip_marker(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if line not in ("WARM", "COLD"))


@pytest.mark.parametrize("args, code", [((), 0), (("exit",), 7), (("raise",), 1), (("interrupt",), -2)])
def test_a_warm_fork_looks_to_the_program_as_a_cold_start(tmp_path, args, code):
    write_script(tmp_path, "probe.py", PROBE)
    cold, warm = both(tmp_path, *args)
    assert cold.stderr.splitlines()[1] == "COLD" and warm.stderr.splitlines()[1] == "WARM"
    assert (cold.returncode, warm.returncode) == (code, code)
    assert warm.stdout == cold.stdout
    assert strip_marker(warm.stderr) == strip_marker(cold.stderr)
    if args == ("raise",):
        assert 'probe.py", line' in warm.stderr and "zygote" not in warm.stderr and "runpy" not in warm.stderr
    if args == ("interrupt",):
        assert warm.stdout.splitlines()[-1] == "atexit ran"


def test_a_module_run_with_m_sees_what_python_m_sets(tmp_path):
    package = tmp_path / "pkg"
    write_script(package, "__init__.py", "")
    write_script(package, "__main__.py", "import sys, torch\nprint(sys.argv[1:], sys.path[0], __name__)\n")
    command = [sys.executable, "-m", "pkg", "a", "b"]
    cold = run_command(command, tmp_path, cli_env(), timeout=120, cold=True)
    assert zygote._warm_enough(command[1:], tmp_path) is False  # not a torch module by name: cold
    assert cold.stdout == f"['a', 'b'] {tmp_path} __main__\n"


def test_a_timeout_kills_the_fork_and_raises_as_subprocess_does(tmp_path):
    write_script(tmp_path, "slow.py", "import sys, time, torch\ntime.sleep(60 if sys.argv[1:] else 0)\n")
    command = [sys.executable, "slow.py"]
    env = cli_env()
    # a server of this environment, warm (one still starting is given up after the request's timeout)
    assert any(zygote.run(command, tmp_path, env, timeout=120) is not None for _ in range(2))
    with pytest.raises(subprocess.TimeoutExpired) as expired:
        zygote.run([*command, "sleep"], tmp_path, env, timeout=3)
    assert expired.value.timeout == 3


@pytest.mark.parametrize("argv, text, warm", [
    (["train.py"], "import torch\n", True),
    (["train.py"], "print('no framework')\n", False),  # cold starts faster without torch
    (["train.py"], "import torch\nmodel = torch.compile(model)\n", False),  # the compiler's import is timed
    (["train.py"], "import gc, torch\ngc.collect()\n", False),  # the collector walks torch's objects
    (["-m", "stepscope", "run", "--no-monitor", "train.py"], "import lightning\n", True),
    (["-m", "stepscope", "report", "run"], "", False),
    (["-m", "stepscope", "demo", "input-cpu"], "", True),
    (["-m", "stepscope", "demo", "compile-short"], "", False),
    (["-m", "stepscope", "demo", "gc-cycles"], "", False),
    (["-m", "torch.distributed.run", "--nproc-per-node", "2", "train.py"], "", True),
    (["-m", "stepscope", "run", "-o", "x", "-m", "stepscope.zoo.input_cpu", "--steps", "9"], "", True),
    (["-m", "stepscope", "run", "-m", "stepscope.zoo.gc_cycles"], "", False),  # its source uses gc
    (["-m", "stepscope", "run", "-m", "json.tool"], "", False),  # not stepscope's: not read
    (["-c", "import torch"], "", False),
    (["-X", "dev", "train.py"], "import torch\n", False),
])
def test_what_is_served_warm(tmp_path, argv, text, warm):
    write_script(tmp_path, "train.py", text)
    assert zygote._warm_enough(argv, tmp_path) is warm


def _servers_of_this_test(monkeypatch, inherit: bool):
    """The servers' table for one test: the worker's servers (``inherit``) or none; the servers the
    test starts are closed after it, the worker's left as they were."""
    before = dict(zygote._SERVERS) if inherit else {}
    monkeypatch.setattr(zygote, "_SERVERS", dict(before))
    monkeypatch.setattr(zygote, "_SEEN", set(zygote._SEEN) if inherit else set())
    monkeypatch.setattr(zygote, "GIVEN_UP", dict(zygote.GIVEN_UP) if inherit else {})
    yield
    for key, server in zygote._SERVERS.items():
        if server is not None and before.get(key) is not server:
            server.close()


@pytest.fixture
def own_servers(monkeypatch):
    """Servers of this test only (a worker serves at most three environments), closed after it."""
    yield from _servers_of_this_test(monkeypatch, inherit=False)


@pytest.fixture
def worker_servers(monkeypatch):
    """This worker's servers (its default environment's is warm), and servers of this test only for
    the other environments it asks for, closed after it: a test that does not check an environment's
    first request does not pay a server's start (~4 s of CPU)."""
    yield from _servers_of_this_test(monkeypatch, inherit=True)


def test_an_environment_torch_reads_at_start_gets_its_own_server(tmp_path, worker_servers):
    write_script(tmp_path, "probe.py", "import os, torch\nprint(torch.get_num_threads())\n")
    command = [sys.executable, "probe.py"]
    seen = []
    for threads in ("1", "1", "2", "2"):
        env = cli_env({"OMP_NUM_THREADS": threads})
        result = zygote.run(command, tmp_path, env, timeout=120)
        seen.append(None if result is None else result.stdout.strip())
    # the first request of an environment no server has yet runs cold; then each is served by a
    # server started with it (this worker may have one of either already: its default is OMP_NUM_THREADS=1)
    assert seen[1] == "1" and seen[3] == "2", seen
    assert zygote.start_up_env({"OMP_NUM_THREADS": "1", "HOME": "/x"}) == (("OMP_NUM_THREADS", "1"),)


def test_everything_runs_cold_when_asked(tmp_path, monkeypatch):
    write_script(tmp_path, "probe.py", "import torch\n")
    monkeypatch.setenv("STEPSCOPE_TESTS_COLD", "1")
    assert all(zygote.run([sys.executable, "probe.py"], tmp_path, cli_env(), timeout=60) is None for _ in range(2))


#: A rank that prints what it sees of its own start and of its launcher.
RANK_PROBE = """
    import os, sys, time
    warm = "torch" in sys.modules
    import psutil, torch
    me = psutil.Process()
    launcher = me.parent()
    rank = int(os.environ["RANK"])
    print(rank, sys.argv, __name__, sys.path[0] == os.getcwd(), torch.get_num_threads(), os.environ["OMP_NUM_THREADS"],
          os.getsid(0) == os.getpid(), type(sys.stdout.buffer).__name__, sys.stdout.write_through,
          me in launcher.children(), "torch.distributed.run" in " ".join(launcher.cmdline()) or "WARM LAUNCHER",
          flush=True)
    print("WARM" if warm else "COLD", rank, file=sys.stderr, flush=True)
    open(f"printed.{rank}", "w").close()
    if rank == 1 and sys.argv[1:] == ["die"]:
        while not os.path.exists("printed.0"):  # the launcher stops rank 0 once rank 1 is gone
            time.sleep(0.01)
        os.kill(os.getpid(), 9)
"""


@pytest.mark.parametrize("args", [(), ("die",)])
def test_a_launcher_s_ranks_forked_from_its_template_look_as_started_cold(tmp_path, args, worker_servers, monkeypatch):
    """torchrun's ranks in a launcher served warm are forked too: the same argv, threads, session,
    unbuffered streams and exit as the ranks a cold launcher starts, and the launcher is their parent."""
    monkeypatch.delenv("STEPSCOPE_TESTS_COLD_CHILDREN", raising=False)
    write_script(tmp_path, "rank.py", RANK_PROBE)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "rank.py", *args]
    env = cli_env()
    cold = run_command(command, tmp_path, env, timeout=120, cold=True)
    warm = None
    for _ in range(2):
        for name in ("printed.0", "printed.1"):
            (tmp_path / name).unlink(missing_ok=True)
        warm = zygote.run(command, tmp_path, env, timeout=120)
    assert warm is not None
    assert sorted(line.split()[1] for line in warm.stderr.splitlines() if line.startswith("WARM")) == ["0", "1"]
    assert not any(line.startswith("COLD") for line in warm.stderr.splitlines()), warm.stderr
    # the launcher's process is the server's fork (its command line is the server's)
    rows = sorted(line.replace("WARM LAUNCHER", "True") for line in warm.stdout.splitlines())
    assert rows == sorted(cold.stdout.splitlines()), (warm.stdout, cold.stdout)
    assert rows[0].endswith("FileIO True True True") and " 1 1 True " in rows[0], rows
    assert (warm.returncode == 0) == (cold.returncode == 0) == (not args)
    if args:
        assert "exitcode  : -9" in warm.stderr and "exitcode  : -9" in cold.stderr


def test_a_rank_that_cannot_stand_for_a_cold_start_is_started_by_the_launcher(tmp_path, worker_servers):
    # a rank that does not name torch (the rules above) starts cold
    write_script(tmp_path, "rank.py", "import sys\nprint(any(name.startswith('tor' + 'ch') for name in sys.modules))\n")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "rank.py"]
    warm = None
    for _ in range(2):
        warm = zygote.run(command, tmp_path, cli_env(), timeout=120)
    assert warm is not None and warm.returncode == 0, warm
    assert warm.stdout.split() == ["False", "False"]


def test_what_a_template_starts_and_what_it_leaves_to_popen(tmp_path, monkeypatch):
    write_script(tmp_path, "train.py", "import torch\n")
    monkeypatch.setattr(zygote, "_SERVER_START_UP", (("OMP_NUM_THREADS", "2"), ("PYTHONPATH", "a")))
    monkeypatch.setattr(sys, "path", [*sys.path, "a", str(tmp_path)])
    base = {"OMP_NUM_THREADS": "2", "PYTHONPATH": "a", "HOME": "/h"}
    session, group = (True, None, None, None, -1, True, -1), (True, None, None, None, -1, False, 0)

    def request(argv, env=None, params=session):
        return zygote._template_request([sys.executable, *argv], str(tmp_path), {**base, **(env or {})}, params)

    rank = request(["-u", "train.py"], {"RANK": "1", "TORCHELASTIC_RUN_ID": "x", "OMP_NUM_THREADS": "1"})
    assert rank["argv"] == ["train.py"] and rank["unbuffered"] and rank["session"] and not rank["group"]
    assert rank["threads_from_env"]  # torchrun's OMP_NUM_THREADS=1 is set in the child
    trial = request(["-m", "stepscope", "run", "train.py"], {"PYTHONPATH": os.pathsep.join([str(tmp_path), "a"])}, group)
    assert trial["group"] and not trial["session"] and not trial["threads_from_env"]  # its path entries are known
    assert request(["train.py"], {"PYTHONPATH": "/elsewhere"}) is None  # a path the template lacks
    assert request(["train.py"], {"MKL_NUM_THREADS": "1"}) is None  # read at start: the interpreter starts it
    assert request(["-X", "dev", "train.py"]) is None
    assert zygote._template_request(["/bin/echo", "train.py"], str(tmp_path), base, session) is None
    assert request(["train.py"], params=(True, None, None, 1000, -1, True, -1)) is None  # another user
    # the processes that fork a template: launchers, `try`, the GPU check (a `stepscope run` per check)
    assert zygote._starts_children(["-m", "torch.distributed.run", "train.py"])
    assert zygote._starts_children([str(zygote.GPU_CHECK), "--device", "cpu"])
    assert not zygote._starts_children(["train.py"]) and not zygote._starts_children(["-m", "stepscope", "run", "t.py"])


def test_a_served_popen_is_this_process_s_child_as_a_cold_one_is(tmp_path, own_servers):
    """``zygote.popen``: the child is re-parented to the test, which waits on it, signals it and
    reads its status as Popen's own (pipes, a session of its own, death by SIGTERM)."""
    write_script(tmp_path, "probe.py", """
        import os, sys, time
        warm = "torch" in sys.modules
        import torch
        print(os.getppid(), os.getsid(0) == os.getpid(), sys.argv[1:], flush=True)
        print("WARM" if warm else "COLD", file=sys.stderr, flush=True)
        if sys.argv[1:] == ["wait"]:
            time.sleep(60)
        sys.exit(5)
    """)
    command = [sys.executable, "probe.py"]
    popens = []
    for _ in range(2):
        popens.append(zygote.popen(command, tmp_path, cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True))
    assert popens[0] is None and popens[1] is not None  # the environment's first request starts cold
    out, err = popens[1].communicate(timeout=60)
    assert (out, err, popens[1].returncode) == (f"{os.getpid()} True []\n", "WARM\n", 5)
    waiting = zygote.popen([*command, "wait"], tmp_path, cli_env(), stdout=subprocess.PIPE, text=True)
    assert waiting is not None and waiting.stdout.readline().split()[0] == str(os.getpid())
    waiting.terminate()
    assert waiting.wait(timeout=30) == -15
    assert zygote.popen(command, tmp_path, cli_env(), preexec_fn=os.setpgrp) is None  # what a fork cannot take


#: A torch script that names torch.compile (so it runs cold unless its test says the start is not
#: what it measures) and prints what the warm interpreter had imported for it.
COMPILE_PROBE = """
    import sys
    warm = "torch" in sys.modules
    run_modules = all(name in sys.modules for name in sys.argv[1:])
    lightning = any(name.split(".")[0] in ("lightning", "pytorch_lightning", "transformers", "accelerate")
                    for name in sys.modules)
    import torch
    compiled = torch.compile  # not called: what the script's text names decides
    print("WARM" if warm else "COLD", run_modules, lightning)
"""


def test_a_started_server_serves_the_first_request_and_shows_none_of_its_own_variables(tmp_path, own_servers):
    """``prestart``: the first request is forked, even one whose own timeout is shorter than the
    server's warm-up (torch alone takes longer than 2 s to import); the server holds ``stepscope
    run``'s modules and no library stepscope looks for; its environment (which its forks show in
    /proc) has the request's start-up variables, not the request's own; a script that compiles runs
    cold unless the test says its start is not measured."""
    write_script(tmp_path, "probe.py", COMPILE_PROBE)
    env = cli_env({"OMP_NUM_THREADS": "1", "PROBE_TOKEN": "only-this-request"})
    zygote.prestart(env)
    server = zygote._SERVERS[zygote.start_up_env(env)]
    assert server is not None and not server.ready
    command = [sys.executable, "probe.py", *zygote.STEPSCOPE_RUN_MODULES]
    assert zygote.run(command, tmp_path, env, timeout=120) is None  # names compile: cold
    forked = zygote.run(command, tmp_path, env, timeout=2, start_measured=False)
    assert forked is not None and forked.returncode == 0 and server.ready, forked
    # read once the server answered: right after its exec the kernel may not have set it yet
    started = Path(f"/proc/{server.process.pid}/environ").read_bytes().split(b"\0")
    assert b"OMP_NUM_THREADS=1" in started and not any(item.startswith(b"PROBE_TOKEN=") for item in started)
    assert forked.stdout.split() == ["WARM", "True", "False"], forked.stdout + forked.stderr
