"""Helpers for tests that run stepscope and scripts in subprocesses.

A plain module (``tests`` is on ``pythonpath``), not a conftest: several conftest files share the
module name ``conftest``, so importing helpers from one depends on collection order.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import zygote

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = REPO_ROOT.parent / "shared"
CONSOLE_SCRIPT = Path(sys.executable).with_name("stepscope")


def _checkout_first() -> dict[str, str]:
    """This process's environment with the checkout's modules first on ``PYTHONPATH``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = _checkout_first()
    env.setdefault("OMP_NUM_THREADS", "1")
    env["COLUMNS"] = "100"
    env.update(extra or {})
    return env


def scenario_env() -> dict[str, str]:
    """The environment the zoo's scenarios run in (``test_zoo.run_demo``): this checkout's modules
    first, and the machine's default threads (no ``OMP_NUM_THREADS``)."""
    env = _checkout_first()
    env.pop("OMP_NUM_THREADS", None)
    return env


def run_cli(args: list[str], cwd: Path, *, entry: str = "module", timeout: float = 240,
            env: dict[str, str] | None = None, cold: bool = False, warm: bool = False,
            **kwargs) -> subprocess.CompletedProcess:
    """Run ``stepscope ARGS`` (``python -m stepscope`` or the console script) in a subprocess: forked
    from the warm interpreter (``zygote.py``) where it can stand for a cold start, else cold.
    ``warm=True``: forked even where the script compiles or uses ``gc``, for a test whose checks do
    not rest on what a cold start leaves behind (``zygote.run``'s ``start_measured``)."""
    if entry == "module":
        return _run([sys.executable, "-m", "stepscope", *args], cwd, timeout, env, cold, kwargs, warm)
    return subprocess.run([str(CONSOLE_SCRIPT), *args], cwd=cwd, env=cli_env(env), capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def run_python(args: list[str], cwd: Path, *, timeout: float = 240, env: dict[str, str] | None = None,
               cold: bool = False, warm: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in a subprocess, forked from the warm interpreter where it can be
    (``warm``: as for :func:`run_cli`)."""
    return _run([sys.executable, *args], cwd, timeout, env, cold, kwargs, warm)


def _run(command: list[str], cwd: Path, timeout: float, env: dict[str, str] | None, cold: bool,
         kwargs: dict, warm: bool = False) -> subprocess.CompletedProcess:
    return run_command(command, cwd, cli_env(env), timeout=timeout, cold=cold or bool(kwargs), warm=warm, **kwargs)


def run_command(command: list[str], cwd: Path | None, env: dict[str, str], *, timeout: float, cold: bool = False,
                warm: bool = False, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(command, capture_output=True, text=True)`` for a ``python`` command: forked
    from a warm interpreter where one can stand for the cold start (``zygote.py``), else cold."""
    if not cold and not kwargs:
        forked = zygote.run(command, Path(cwd or os.getcwd()), env, timeout, start_measured=not warm)
        if forked is not None:
            return forked
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **kwargs)


def popen(command: list[str], cwd: Path, env: dict[str, str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(command, cwd=cwd, env=env, **kwargs)`` for a ``python`` command: forked
    from a warm interpreter where one can stand for the cold start (``zygote.popen``: the child is
    still this process's), else started cold."""
    return zygote.popen(command, Path(cwd), env, **kwargs) or subprocess.Popen(command, cwd=cwd, env=env, **kwargs)


def write_script(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body).lstrip(), encoding="utf-8")
    return path
