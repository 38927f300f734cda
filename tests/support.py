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

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = REPO_ROOT.parent / "shared"
CONSOLE_SCRIPT = Path(sys.executable).with_name("stepscope")


def cli_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["COLUMNS"] = "100"
    env.update(extra or {})
    return env


def run_cli(args: list[str], cwd: Path, *, entry: str = "module", timeout: float = 240,
            env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    """Run ``stepscope ARGS`` (``python -m stepscope`` or the console script) in a subprocess."""
    prefix = [sys.executable, "-m", "stepscope"] if entry == "module" else [str(CONSOLE_SCRIPT)]
    return subprocess.run(prefix + list(args), cwd=cwd, env=cli_env(env), capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def run_python(args: list[str], cwd: Path, *, timeout: float = 240, env: dict[str, str] | None = None,
               **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=cli_env(env), capture_output=True,
                          text=True, timeout=timeout, **kwargs)


def write_script(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body).lstrip(), encoding="utf-8")
    return path
