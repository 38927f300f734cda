"""Imports point only downstream, and the analysis core needs neither torch nor rich.

The layers, in the order data flows (``shared/STYLE.md``): ``record`` ← ``traces`` ← ``analysis`` ←
``diagnosis`` ← ``report`` ← ``cli``; ``capture`` (the code that runs inside the user's process)
imports only ``record``. Every import is checked, including those inside functions.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "stepscope"

#: Always allowed: the leaves every layer may use.
COMMON = {"errors", "units", "_version", "text", "limits", "redact"}
#: layer -> the stepscope layers it may import.
ALLOWED: dict[str, set[str]] = {
    "record": set(),
    "traces": {"record"},
    "analysis": {"record", "traces"},
    "diagnosis": {"analysis", "record", "traces"},
    "report": {"diagnosis", "analysis", "record", "traces"},
    "capture": {"record"},
}
#: Third-party packages the analysis core must not import (it runs without them).
CORE = ("record", "traces", "analysis", "diagnosis")
FORBIDDEN_IN_CORE = ("torch", "rich", "pandas")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _modules(layer: str) -> list[Path]:
    return sorted((PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_point_downstream(layer):
    allowed = ALLOWED[layer] | COMMON | {layer}
    wrong = []
    for path in _modules(layer):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "stepscope" and len(parts) > 1 and parts[1] not in allowed \
                    and (PACKAGE / parts[1]).exists() | (PACKAGE / f"{parts[1]}.py").exists():
                wrong.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("layer", CORE)
def test_core_names_neither_torch_nor_rich(layer):
    wrong = [f"{path.relative_to(PACKAGE)} imports {name}" for path in _modules(layer)
             for name in _imports(path) if name.split(".")[0] in FORBIDDEN_IN_CORE]
    assert not wrong, "\n".join(wrong)


def test_report_model_loads_with_torch_and_rich_blocked():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'rich', 'pandas'):\n"
        "            raise ImportError(f'blocked: {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import stepscope.report.model, stepscope.diagnosis.rules, stepscope.analysis.bundle\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(PACKAGE.parent)}, check=False)
    assert out.stdout.strip() == "ok", out.stderr
