"""Content hashes of the code a run ran: the script and the local modules it imported.

``stepscope diff`` names the files whose content changed between two runs ("source model.py"),
which the git commit alone misses (an edit not committed yet). At the end of capture,
:func:`source_hashes` hashes the script and every imported module whose file lies under the
script's *root* — the git repository that holds it, else the script's own directory — leaving out
installed packages (``site-packages``, ``dist-packages``, the interpreter's prefix: a virtual
environment inside the repository) and stepscope itself. Paths are relative to the root; at most
:data:`MAX_FILES` files of at most :data:`MAX_BYTES` each are read (a larger file is named by its
size and modification time instead).
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

MAX_FILES = 200
MAX_BYTES = 8 * 1024 * 1024
DIGITS = 16
_INSTALLED = ("site-packages", "dist-packages")


def script_path(target: str, mode: str, cwd: str) -> Path | None:
    """The file of what ran: the script, or the module run with ``-m``."""
    if mode == "script" and target:
        return (Path(cwd) / target).resolve()
    main = sys.modules.get("__main__")
    file = getattr(main, "__file__", None)
    if file:
        return Path(file).resolve()
    if mode == "module" and target:
        import importlib.util

        try:
            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            return None
        if spec is not None and spec.origin and spec.origin not in ("built-in", "frozen"):
            return Path(spec.origin).resolve()
    return None


def source_root(script: Path) -> Path:
    """The git repository that holds ``script`` (the folder with ``.git``), else its directory."""
    for folder in script.parents:
        if (folder / ".git").exists():
            return folder
    return script.parent


def _excluded() -> list[Path]:
    """stepscope's package and the interpreter's prefixes, resolved and as written (a module's path
    is matched as written before it is resolved)."""
    out = [Path(__file__).resolve().parents[1]]  # stepscope's own package
    for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
        out += [Path(prefix).resolve(), Path(os.path.abspath(prefix))]
    return out


def _digest(path: Path) -> str:
    info = path.stat()
    if info.st_size > MAX_BYTES:
        return hashlib.sha256(f"size={info.st_size} mtime={info.st_mtime_ns}".encode()).hexdigest()[:DIGITS]
    return hashlib.sha256(path.read_bytes()).hexdigest()[:DIGITS]


def source_hashes(target: str, mode: str, cwd: str) -> dict[str, str]:
    """``relative path -> hash`` of the script and the local modules imported so far."""
    script = script_path(target, mode, cwd)
    if script is None or not script.is_file():
        return {}
    root = source_root(script)
    excluded = [folder for folder in _excluded() if not root.is_relative_to(folder)]
    # a run has imported thousands of modules (torch alone ~1,900): those under an excluded folder or
    # an installed-packages folder, as written, are left out by their path's text before the costly
    # realpath (80 ms a run measured, most of it resolving torch's files one by one)
    skipped = tuple(str(folder) + os.sep for folder in excluded)
    installed = tuple(f"{os.sep}{name}{os.sep}" for name in _INSTALLED)
    files = {script}
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file or not str(file).endswith(".py"):
            continue
        file = str(file)
        if not os.path.isabs(file):
            file = os.path.join(cwd, file)
        if file.startswith(skipped) or any(name in file for name in installed):
            continue
        path = Path(os.path.realpath(file))
        if any(part in _INSTALLED for part in path.parts) or not path.is_relative_to(root):
            continue
        if any(path.is_relative_to(folder) for folder in excluded) and path != script:
            continue
        files.add(path)
    out: dict[str, str] = {}
    for path in sorted(files, key=lambda item: (item != script, str(item)))[:MAX_FILES]:
        try:
            out[path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name] = _digest(path)
        except OSError:
            continue
    return out
