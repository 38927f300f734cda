"""Warm interpreters the tests fork their ``python -m stepscope …`` and ``python script.py``
processes from, instead of starting each cold.

Why: the end-to-end tests start a few hundred Python processes, and most of their CPU is each one
importing torch (~1.5 s on a 2-core machine), for any optimizer step, DDP or Lightning
``torch._dynamo`` too (~2 s more), and at exit the interpreter's last collections walking every
object those imports made (~0.5 s): BENCHMARKS.md, "Test suite". A server imports both once (and
the modules of stepscope's own that ``stepscope run`` imports, ~0.17 s more a run), freezes what it
imported out of the collector, then forks one child per request. The child is a
real process running real torch: it takes the request's working directory, environment, arguments
and standard streams, sets up ``__main__``, ``sys.argv`` and ``sys.path[0]`` as ``python -m MOD`` /
``python SCRIPT`` do, and exits through the interpreter's normal shutdown (atexit, finalizers,
death by SIGINT after an uncaught Ctrl-C).

A request runs cold where a warm fork would not stand for a cold start (``run`` returns None):
- a process that would not import torch (a script that names neither torch nor a library built on
  it, stepscope's commands other than ``run``/``demo``/``tune-loader``): cold it starts faster;
- what the start leaves behind is what the test measures: ``torch.compile``'s first call imports the
  compiler and stepscope times it, and the collector's pauses walk torch's objects in a cold process
  (a script or zoo scenario that compiles or uses ``gc``), unless the test says its checks do not
  rest on it (``warm=True``: dynamo's own reports of what it compiled, a loss, a named line);
- options of the interpreter, or arguments other than a script or ``-m MODULE``;
- the first request of each environment that differs in what the interpreter or torch read when
  they start (``PYTHON*``, ``OMP_*``, ``TORCH*``…): the second starts a server with it.
``cold=True`` asks for a cold start (``tests/unit/test_zygote.py`` compares the two); the tests that
check the start itself (the compiler not imported by a counted step, the operator-cost probe's
imports) start their processes with ``subprocess`` directly. ``STEPSCOPE_TESTS_COLD=1`` runs
everything cold, ``STEPSCOPE_TESTS_COLD_CHILDREN=1`` the processes a served process starts (below).

Protocol (a Unix socket pair per server): the client sends one JSON line with the three standard
streams' descriptors attached; the server answers ``{"pid": …}`` once forked and ``{"status": …}``
(the ``returncode`` convention: negative for a signal) once the child is reaped.
"""

from __future__ import annotations

import array
import json
import locale
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

#: Read by the interpreter or by torch when they start: requests whose environments differ in any of
#: these are served by different servers.
START_UP_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "TORCH", "PYTORCH", "CUDA",
                     "NVIDIA_", "LD_", "MALLOC", "GLIBC", "DNNL_", "ONEDNN_", "LC_", "LANG", "TMPDIR")
#: What a script that imports torch names.
TORCH_WORDS = ("torch", "lightning", "transformers", "accelerate")
#: stepscope's commands that run PyTorch in their own process or in the processes they start.
TORCH_COMMANDS = ("run", "demo", "tune-loader", "try")
#: What a process measures that a warm fork would change (see the module's docstring).
_COLD_TEXT = re.compile(r"\bcompile\b|\bgc\b")
_NOTHING = re.compile(r"(?!)")
_MAX_SERVERS = 3
#: How long a server may take to warm up (torch, dynamo, stepscope's run modules) before it is given up:
#: far longer than it takes, as three test workers warming theirs up at once beside their tests may.
WARM_UP_TIMEOUT_S = 120


def start_up_env(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((key, value) for key, value in env.items() if key.startswith(START_UP_PREFIXES)))


def send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = (json.dumps(message) + "\n").encode()
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(data)


def receive(sock: socket.socket) -> tuple[dict | None, list[int]]:
    """One JSON line and the descriptors sent with it; (None, []) at end of stream."""
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        chunk, ancillary, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(16 * fds.itemsize))
        if not chunk:
            return None, []
        data += chunk
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


# --- the client (in the test process) ----------------------------------------------------------


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: float,
        *, start_measured: bool = True) -> subprocess.CompletedProcess | None:
    """``command`` (``python …``) forked from a warm interpreter, as ``subprocess.run(command,
    capture_output=True, text=True)`` would return it; None where it must run cold.
    ``start_measured=False``: the test checks nothing that the compiler's first import or the
    collector's walk of a cold start's objects changes, so a script that compiles or uses ``gc`` forks
    too."""
    return _served(command, cwd, env, lambda server: server.run(command, cwd, env, timeout), start_measured)


def popen(command: list[str], cwd: Path, env: dict[str, str], **kwargs) -> subprocess.Popen | None:
    """``subprocess.Popen(command, cwd=cwd, env=env, **kwargs)`` for a ``python …`` command, forked
    from a warm interpreter: the child is re-parented to this process (a child subreaper
    meanwhile), so the ``Popen`` waits on it, signals it and reads its exit status as for a child it
    started itself. None where it must start cold."""
    if set(kwargs) - _POPEN_KWARGS:
        return None
    return _served(command, cwd, env, lambda server: _AdoptedPopen(server, command, cwd=cwd, env=env, **kwargs))


#: What a served ``Popen`` takes besides the command, its directory and environment.
_POPEN_KWARGS = {"stdin", "stdout", "stderr", "start_new_session", "process_group", "text", "universal_newlines",
                 "encoding", "errors", "bufsize", "close_fds"}


def prestart(*envs: dict[str, str], wait: bool = False) -> None:
    """Start the servers of these start-up environments now, where a test session is known to
    need them: their first requests are then forked too (rather than run cold, as the first request
    of an environment otherwise is), and they warm up together, beside what the session does
    meanwhile. ``wait``: return once they have warmed up (the serial tests measure with nothing
    else running)."""
    if os.environ.get("STEPSCOPE_TESTS_COLD") == "1":
        return
    with _LOCK:
        started = []
        for env in envs:
            key = start_up_env(env)
            _SEEN.add(key)
            if key not in _SERVERS and len(_SERVERS) < _MAX_SERVERS:
                server = _SERVERS[key] = _Server(env)
                started.append((key, server))
        for key, server in started if wait else ():
            try:
                server.ping(timeout=WARM_UP_TIMEOUT_S)
            except OSError as error:
                _give_up(key, server, error, "warming up")


def _served(command: list[str], cwd: Path, env: dict[str, str], serve, start_measured: bool = True):
    if os.environ.get("STEPSCOPE_TESTS_COLD") == "1" or not _warm_enough(command[1:], cwd, start_measured):
        return None
    with _LOCK:
        key = start_up_env(env)
        if key not in _SERVERS:
            if key not in _SEEN or len(_SERVERS) >= _MAX_SERVERS:
                _SEEN.add(key)
                return None
            _SERVERS[key] = _Server(env)
        server = _SERVERS[key]
        if server is None:  # its server died: this environment runs cold
            return None
        try:
            if not server.ready:  # its warm-up, under load, may take longer than a request's own timeout
                server.ping(timeout=WARM_UP_TIMEOUT_S)
            return serve(server)
        except (OSError, ValueError, KeyError) as error:
            _give_up(key, server, error, f"serving {' '.join(command[1:])[:200]}")
            return None


def _give_up(key: tuple, server: _Server, error: Exception, doing: str) -> None:
    """Close ``key``'s server: its environment's requests run cold from now on (why: ``GIVEN_UP``)."""
    server.close()
    _SERVERS[key] = None
    GIVEN_UP[key] = f"{type(error).__name__}: {error} ({doing})"


def _warm_enough(argv: list[str], cwd: Path, start_measured: bool = True) -> bool:
    """Whether the process is to import torch and measures nothing a warm start changes."""
    cold_text = _COLD_TEXT if start_measured else _NOTHING
    if not argv:
        return False
    if argv[0] == "-m":
        if len(argv) < 2:
            return False
        if argv[1] != "stepscope":
            return argv[1].split(".")[0] in TORCH_WORDS
        rest = argv[2:]
        if not rest or rest[0] not in TORCH_COMMANDS:
            return False
        if rest[0] == "demo":
            return not any(cold_text.search(name.replace("-", " ")) for name in rest[1:2])
    elif argv[0].startswith("-"):
        return False
    else:
        rest = argv
    script = next((arg for arg in rest if arg.endswith(".py")), None)
    if script is None:
        if argv[0] == "-m" and rest[0] == "tune-loader":
            return True
        module = rest[rest.index("-m") + 1] if argv[0] == "-m" and "-m" in rest[:-1] else None
        if not module or cold_text.search(module.replace("_", " ")):  # the scenario's name, as for a demo
            return False
        script = _module_source(module)  # `stepscope run … -m MODULE`
        if script is None:
            return False
    try:
        text = (cwd / script).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return any(word in text for word in TORCH_WORDS) and not cold_text.search(text)


def _module_source(module: str) -> str | None:
    """The source file of one of stepscope's own modules (the zoo's scenarios), else None."""
    if not module.startswith("stepscope."):
        return None
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec is not None and spec.origin and spec.origin.endswith(".py") else None


class _Server:
    """One warm interpreter, started with ``env``'s start-up variables and otherwise this process's
    environment: none of the first request's own variables (a run's token, say) shows in the
    server's ``/proc/PID/environ``, which its forks show too."""

    def __init__(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair()
        started = {key: value for key, value in os.environ.items() if not key.startswith(START_UP_PREFIXES)}
        started.update(start_up_env(env))
        self.process = subprocess.Popen([sys.executable, __file__, str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                        env=started, stdin=subprocess.DEVNULL, cwd=Path(__file__).parent)
        theirs.close()
        self.sock: socket.socket | None = ours
        self.ready = False  # answered a ping: warmed up

    def ping(self, timeout: float) -> None:
        """Return once the server answers (it reads requests once it has warmed up)."""
        sock = self.sock
        assert sock is not None, "a closed server serves nothing"
        sock.settimeout(timeout)
        try:
            send(sock, {"ping": True})
            if _reply(sock).get("pong") is not True:
                raise OSError("the warm interpreter answered a ping with something else")
            self.ready = True
        except TimeoutError:
            self.process.kill()
            raise OSError("the warm interpreter did not answer") from None
        finally:
            sock.settimeout(None)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            self.process.wait()

    def run(self, command: list[str], cwd: Path, env: dict[str, str],
            timeout: float) -> subprocess.CompletedProcess:
        sock = self.sock
        assert sock is not None, "a closed server serves nothing"
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            deadline = time.monotonic() + timeout
            sock.settimeout(timeout)
            try:
                send(sock, {"argv": command[1:], "cwd": str(cwd), "env": env,
                            "cold_children": _cold_children()},
                     [0, out.fileno(), err.fileno()])
                pid = _reply(sock)["pid"]
            except TimeoutError:
                self.process.kill()
                raise OSError("the warm interpreter did not answer") from None
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                status = _reply(sock)["status"]
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                sock.settimeout(None)
                _reply(sock)
                raise subprocess.TimeoutExpired(command, timeout, _text(out), _text(err)) from None
            finally:
                sock.settimeout(None)
            return subprocess.CompletedProcess(command, status, _text(out), _text(err))


class _AdoptedPopen(subprocess.Popen):
    """A ``Popen`` whose child a server forks (see :func:`popen`)."""

    def __init__(self, server: _Server, *args, **kwargs) -> None:
        self.server = server
        super().__init__(*args, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,  # type: ignore[override]
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *params):
        if executable is not None or preexec_fn is not None or pass_fds or shell:
            raise ValueError("a served Popen takes no executable, preexec_fn, pass_fds or shell")
        request = _popen_request(list(args), cwd, env, params)
        if request is None:
            raise ValueError("this Popen cannot be served")
        sock = self.server.sock
        assert sock is not None, "a closed server serves nothing"
        sock.settimeout(120)
        try:
            _adopt(self, sock, {**request, "cold_children": _cold_children()},
                   (p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite))
        except TimeoutError:
            self.server.process.kill()
            raise OSError("the warm interpreter did not answer") from None
        finally:
            sock.settimeout(None)


def _cold_children() -> bool:
    """``STEPSCOPE_TESTS_COLD_CHILDREN=1``: a served process starts its own children cold."""
    return os.environ.get("STEPSCOPE_TESTS_COLD_CHILDREN") == "1"


def _adopt(popen: subprocess.Popen, sock: socket.socket, request: dict, pipes: tuple[int, ...]) -> None:
    """Ask a server or template for the request's child and make it ``popen``'s own, as
    ``_execute_child`` would have started it: this process is a child subreaper until the child's
    middle process has exited (:func:`_fork_adopted`). ``pipes``: ``_execute_child``'s six
    descriptors (p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite; -1: this process's own)."""
    p2cread, _, _, c2pwrite, _, errwrite = pipes
    fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1, errwrite if errwrite != -1 else 2]
    try:
        _subreaper(True)
        send(sock, {**request, "adopt": True}, fds)
        popen.pid = _reply(sock)["pid"]
    finally:
        _subreaper(False)
    popen._child_created = True  # type: ignore[attr-defined]
    popen._close_pipe_fds(*pipes)  # type: ignore[attr-defined]


def _popen_request(args: list, cwd, env: dict[str, str] | None, params: tuple) -> dict | None:
    """The request for ``Popen(args, …)`` of the interpreter, or None where a fork could not stand
    for it. ``params``: ``_execute_child``'s after the six descriptors (restore_signals, gid, gids,
    uid, umask, start_new_session[, process_group])."""
    argv = [os.fsdecode(arg) for arg in args]
    _restore, gid, gids, uid, umask, session, *group = params
    if not argv or argv[0] != sys.executable or (gid, gids, uid, umask) != (None, None, None, -1):
        return None
    unbuffered = argv[1:2] == ["-u"]
    rest = argv[1 + unbuffered:]
    directory = os.fsdecode(cwd) if cwd is not None else os.getcwd()
    if not rest or not _warm_enough(rest, Path(directory)):
        return None
    return {"argv": rest, "cwd": directory, "env": dict(os.environ if env is None else env), "session": bool(session),
            "group": bool(group) and group[0] == 0, "unbuffered": unbuffered}


def _reply(sock: socket.socket) -> dict:
    message, _ = receive(sock)
    if message is None:
        raise OSError("the warm interpreter exited")
    return message


def _text(handle) -> str:
    """A captured stream as ``subprocess.run(text=True)`` decodes it."""
    handle.seek(0)
    data = handle.read().decode(locale.getpreferredencoding(False))
    return data.replace("\r\n", "\n").replace("\r", "\n")


def _close_all() -> None:
    for server in _SERVERS.values():
        if server is not None:
            server.close()


_LOCK = threading.Lock()
_SERVERS: dict[tuple, _Server | None] = {}  # None: its server died
_SEEN: set[tuple] = set()
#: Why each environment's server was given up (its requests then run cold), for failure messages.
GIVEN_UP: dict[tuple, str] = {}
if __name__ != "__main__":
    import atexit

    atexit.register(_close_all)


# --- the server ---------------------------------------------------------------------------------


def _serve(sock: socket.socket) -> tuple[dict, list[int]]:
    """Fork a child per request; return (in the child only) the request it is to run."""
    client = os.getppid()
    while True:
        request, fds = receive(sock)
        if request is None:
            os._exit(0)
        if request.get("ping"):
            send(sock, {"pong": True})
            continue
        if request.get("adopt"):  # a Popen: the client adopts the child and waits on it itself
            if _answer_adopted(sock, client, request, fds):
                return request, fds
            continue
        pid = os.fork()
        if pid == 0:
            sock.close()
            return request, fds
        for fd in fds:
            os.close(fd)
        try:
            send(sock, {"pid": pid})
            _, status = os.waitpid(pid, 0)
            send(sock, {"status": os.waitstatus_to_exitcode(status)})
        except OSError:  # the client went away: nothing left to serve
            os._exit(0)


def _become(request: dict, fds: list[int]) -> None:
    """Turn this forked child into the process the request describes, then run it."""
    import atexit
    import importlib.machinery
    import runpy
    import types

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv: list[str] = request["argv"]
    if not request.get("cold_children") and _starts_children(argv):
        _fork_template()  # while this process is still one thread and has run nothing of its program
    _as_at_start(request)
    sys.orig_argv = [sys.executable, *argv]
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    interrupted: list[bool] = []

    def _die_by_sigint() -> None:  # what the interpreter does after an uncaught KeyboardInterrupt
        if interrupted:
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)

    atexit.register(_die_by_sigint)  # registered first, so it runs after the program's own handlers
    try:
        if argv[0] == "-m":
            sys.argv = ["-m", *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(argv[1])  # type: ignore[attr-defined]  # what `python -m` calls
        else:
            path = os.path.abspath(argv[0])
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(path)
            with open(path, "rb") as handle:
                code = compile(handle.read(), path, "exec", dont_inherit=True)
            main.__dict__.update(__file__=path, __cached__=None, __builtins__=__builtins__,
                                 __loader__=importlib.machinery.SourceFileLoader("__main__", path))
            exec(code, main.__dict__)  # noqa: S102
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - printed as the interpreter prints it, less our frames
        traceback = error.__traceback__
        while traceback is not None and traceback.tb_frame.f_code.co_filename in (__file__, runpy.__file__):
            traceback = traceback.tb_next
        sys.excepthook(type(error), error.with_traceback(traceback), traceback)
        if isinstance(error, KeyboardInterrupt):
            interrupted.append(True)
        sys.exit(1)


def _as_at_start(request: dict) -> None:
    """What a child's own start would have set that its template's did not: ``OMP_NUM_THREADS``
    (torch reads it when it first runs an operator, which no template did) and ``python -u``'s
    unbuffered streams."""
    threads = request["env"].get("OMP_NUM_THREADS", "")
    if request.get("threads_from_env") and threads.isdigit():
        import torch

        torch.set_num_threads(int(threads))
    if request.get("unbuffered"):
        import io

        for name, fd in (("stdout", 1), ("stderr", 2)):
            old = getattr(sys, name)
            stream = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=old.encoding, errors=old.errors,
                                      write_through=True)
            setattr(sys, name, stream)
            setattr(sys, f"__{name}__", stream)


# --- the Python processes a served process starts ------------------------------------------------
#
# Some served processes start Python processes of their own and run no training themselves:
# torchrun (and ``accelerate launch``, which runs it) starts each rank with ``subprocess.Popen``
# (``python -u SCRIPT`` or ``python -u -m MODULE``, in a session of its own); ``stepscope try``
# runs its trials, a multi-rank ``stepscope demo`` its torchrun launch, ``benchmarks/gpu_check.py``
# one ``stepscope run`` per check. Such a process forks a
# template at its start, while it is one thread and has run nothing of its program (torchrun's
# agent later holds a store's threads, which a fork could not take along), and its ``Popen`` of
# the interpreter forks from the template where the child can stand for a cold start (the rules
# above; an environment that differs from the server's at start in no more than torchrun's own
# variables, ``OMP_NUM_THREADS`` and entries of ``PYTHONPATH`` already on the path). The template
# forks each child through a middle process that exits at once, so the child is re-parented to
# the process that asked (a child subreaper meanwhile): its ``Popen`` waits on it, signals its
# session or group and reads its exit status as for a child it started itself, and stepscope
# finds a job's launcher as its ranks' parent. Anything else is started by ``Popen`` as before.

#: ``-m MODULE`` of the launchers whose ranks are forked from a template.
LAUNCHERS = (["-m", "torch.distributed.run"], ["-m", "accelerate.commands.launch"])
#: The GPU check script (run in CPU mode by the tests): each check is a ``stepscope run`` it starts.
GPU_CHECK = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"
#: What torchrun adds to a rank's environment that the interpreter and torch do not read at start.
_RANK_VARIABLES = ("TORCHELASTIC_", "TORCH_NCCL_")
_PR_SET_CHILD_SUBREAPER = 36
#: The start-up environment of the server this process was forked from (set in the server).
_SERVER_START_UP: tuple[tuple[str, str], ...] = ()


def _starts_children(argv: list[str]) -> bool:
    """Whether the request's process starts Python processes and trains nothing itself."""
    if argv[:2] in LAUNCHERS or argv[:3] == ["-m", "stepscope", "try"] or argv[:1] == [str(GPU_CHECK)]:
        return True
    if argv[:3] == ["-m", "stepscope", "demo"] and len(argv) > 3:
        from stepscope.zoo import SCENARIOS  # stepscope's own registry; importing it runs no scenario

        scenario = SCENARIOS.get(argv[3])
        return scenario is not None and scenario.nproc > 1
    return False


def _subreaper(on: bool) -> bool:
    import ctypes

    return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0


def _fork_template() -> None:
    if not _subreaper(False):  # no prctl here: the children start cold
        return
    ours, theirs = socket.socketpair()
    if os.fork() == 0:
        ours.close()
        request, fds = _serve(theirs)  # the template: every request is a Popen's; returns in a child only
        _become(request, fds)
        sys.exit(0)  # the child's program ended: leave through the parent's frames as a script's end would
    theirs.close()
    _start_children_from(ours)


def _answer_adopted(sock: socket.socket, parent: int, request: dict, fds: list[int]) -> bool:
    """Fork the request's child for ``parent`` to adopt and answer its pid; True in the child."""
    pid = _fork_adopted(parent, request)
    if pid == 0:
        sock.close()
        return True
    for fd in fds:
        os.close(fd)
    try:
        send(sock, {"pid": pid})
    except OSError:  # the one who asked went away: nothing left to serve
        os._exit(0)
    return False


def _fork_adopted(parent: int, request: dict) -> int:
    """Fork the request's child through a middle process that exits at once, so that ``parent`` (a
    child subreaper meanwhile) adopts it. Returns its pid; 0 in the child, once adopted, in its own
    session or group where the request asks."""
    read, write = os.pipe()
    middle = os.fork()
    if middle == 0:
        child = os.fork()
        if child == 0:
            os.close(read)
            os.close(write)
            deadline = time.monotonic() + 10
            while os.getppid() != parent and time.monotonic() < deadline:
                time.sleep(0.0002)  # the middle process exits: the parent adopts the child
            if request.get("session"):
                os.setsid()
            elif request.get("group"):
                os.setpgid(0, 0)
            return 0
        os.write(write, str(child).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        child = int(pipe.read() or b"0")
    os.waitpid(middle, 0)  # once the middle process is reaped, its child is the parent's
    return child


def _template_request(args: list[str], cwd: str | None, env: dict[str, str] | None, params: tuple) -> dict | None:
    """The template's request for ``Popen(args, …)``, or None where it starts as before: a fork that
    could stand for it (:func:`_popen_request`) whose environment differs from the server's at start
    in no more than torchrun's variables, ``OMP_NUM_THREADS`` and ``PYTHONPATH`` entries already on
    the path."""
    request = _popen_request(list(args) if isinstance(args, (list, tuple)) else [], cwd, env, params)
    if request is None:
        return None
    env = request["env"]
    for key in {key for key, _ in set(_SERVER_START_UP) ^ set(start_up_env(env))}:
        if key == "PYTHONPATH":
            if not set(filter(None, env.get(key, "").split(os.pathsep))) <= set(sys.path):
                return None
        elif not key.startswith(_RANK_VARIABLES) and key != "OMP_NUM_THREADS":
            return None
    request["threads_from_env"] = env.get("OMP_NUM_THREADS") != dict(_SERVER_START_UP).get("OMP_NUM_THREADS")
    return request


def _start_children_from(template: socket.socket) -> None:
    """Make this process's ``Popen`` of the interpreter fork from ``template`` where it can."""
    lock = threading.Lock()
    original = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *params):
        request = None
        if executable is None and preexec_fn is None and not pass_fds and not shell:
            request = _template_request(args, cwd, env, params)
        if request is not None:
            with lock:
                try:
                    _adopt(self, template, request, (p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite))
                    return None
                except (OSError, KeyError, ValueError):  # the template is gone: start it as before
                    pass
        return original(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                        creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *params)

    subprocess.Popen._execute_child = _execute_child  # type: ignore[attr-defined]


#: The modules ``stepscope run`` imports on its way to the script and back (``python -X importtime``
#: of a run of a two-line torch script), after torch: imported once by the server, they save each
#: forked run ~0.17 s of CPU (0.24 -> 0.06 s a run of that script). None of them does anything at
#: import but define (no hook, handler or environment read), and none imports a library stepscope
#: looks for in ``sys.modules`` (Lightning, transformers, accelerate).
STEPSCOPE_RUN_MODULES = (
    "stepscope.cli.main", "stepscope.capture.launcher", "stepscope.capture.session", "stepscope.capture.sampler",
    "stepscope.capture.torch_import", "stepscope.capture.rundir", "stepscope.capture.overrides",
    "stepscope.capture.cputimer", "stepscope.pipeline.publish", "stepscope.pipeline.views",
    "stepscope.pipeline.history", "stepscope.analysis.run.compile_summary", "stepscope.diagnosis.findings",
    "stepscope.analysis.run.account", "stepscope.analysis.run.stalls", "stepscope.analysis.run.input_profile",
    "stepscope.analysis.run.signals", "stepscope.analysis.run.timelines", "stepscope.analysis.run.window",
)


def _warm_up() -> None:
    import gc
    import importlib

    import numpy  # noqa: F401
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.utils.data  # noqa: F401

    if os.environ.get("STEPSCOPE_TESTS_BARE_SERVER") != "1":  # the benchmark's baseline: torch alone
        for name in STEPSCOPE_RUN_MODULES:
            importlib.import_module(name)

    # What was imported stays out of the children's collections (each full one, and the one at
    # exit, would walk ~290k more objects and copy every page they live on).
    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    _SERVER_START_UP = start_up_env(dict(os.environ))  # what every template's child was started with
    _channel = socket.socket(fileno=int(sys.argv[1]))
    _warm_up()
    _request, _fds = _serve(_channel)
    del _channel
    _become(_request, _fds)
