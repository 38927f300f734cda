"""The package's layers, enforced: imports point downstream, renderers see only the view-model, the
pipeline alone calls the engine, no rule imports another, no module circles.

The layers, in the order data flows (``shared/ARCHITECTURE.md``): ``record`` ← ``traces`` ←
``analysis`` ← ``diagnosis`` ← ``report`` (the view-model) ← ``pipeline`` ← ``cli``; ``capture``
(the code that runs inside the user's process) imports only ``record``. Every import is checked,
including those inside functions (a lazy import is still a dependency). Each rule is a function of
a package directory, so the tests below also run it on a copy with one import planted to show it
fails.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "stepscope"

#: Always allowed: the leaves every layer may use.
COMMON = {"errors", "units", "_version", "text", "limits", "redact", "safe_write", "heap"}
#: layer -> the stepscope layers it may import.
ALLOWED: dict[str, set[str]] = {
    "record": set(),
    "traces": {"record"},
    "analysis": {"record", "traces"},
    "diagnosis": {"analysis", "record", "traces"},
    "report": {"diagnosis", "analysis", "record", "traces"},
    "pipeline": {"report", "diagnosis", "analysis", "record", "traces", "verify"},
    "capture": {"record"},
}
#: What a renderer (``report/render/``) may import of stepscope: the view-model, its fellow
#: renderers, and the leaves that format and write.
RENDERER_MAY = ("stepscope.report.model", "stepscope.report.render", "stepscope.units", "stepscope.text",
                "stepscope._version", "stepscope.errors", "stepscope.safe_write")
#: The engine's entry points: only the pipeline calls them.
ENGINE_CALLS = {"diagnose_job", "run_rules", "diagnose", "merge_findings"}
ENGINE_CALLER = "pipeline/diagnose.py"
#: Third-party packages the analysis core must not import (it runs without them).
CORE = ("record", "traces", "analysis", "diagnosis")
FORBIDDEN_IN_CORE = ("torch", "rich", "pandas")


def imports(path: Path) -> list[tuple[str, tuple[str, ...]]]:
    """Every absolute import of ``path`` (module level or not): (module, names imported from it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, tuple(alias.name for alias in node.names)))
    return found


def _modules(package: Path, layer: str) -> list[Path]:
    return sorted((package / layer).rglob("*.py"))


def _is_module(package: Path, dotted: str) -> bool:
    path = package.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def downstream_violations(package: Path, layer: str) -> list[str]:
    allowed = ALLOWED[layer] | COMMON | {layer}
    wrong = []
    for path in _modules(package, layer):
        for module, names in imports(path):
            targets = [f"{module}.{name}" for name in names] or [module]
            for name in targets:
                parts = name.split(".")
                if parts[0] == "stepscope" and len(parts) > 1 and parts[1] not in allowed \
                        and ((package / parts[1]).exists() or (package / f"{parts[1]}.py").exists()):
                    wrong.append(f"{path.relative_to(package)} imports {name}")
    return wrong


def renderer_violations(package: Path) -> list[str]:
    wrong = []
    for path in _modules(package, "report/render"):
        for module, names in imports(path):
            if module.split(".")[0] != "stepscope":
                continue
            targets = [f"{module}.{name}" if _is_module(package, f"{module}.{name}") else module for name in names] \
                or [module]
            for target in targets:
                if not any(target == allowed or target.startswith(allowed + ".") for allowed in RENDERER_MAY):
                    wrong.append(f"{path.relative_to(package)} imports {target}")
    return wrong


def engine_callers(package: Path) -> list[str]:
    wrong = []
    for path in sorted(package.rglob("*.py")):
        relative = str(path.relative_to(package))
        if relative in (ENGINE_CALLER, "diagnosis/engine.py"):
            continue
        for module, names in imports(path):
            called = ENGINE_CALLS & set(names)
            if module == "stepscope.diagnosis.engine" and called:
                wrong.append(f"{relative} imports {', '.join(sorted(called))} from the engine")
    return wrong


def rule_to_rule_imports(package: Path) -> list[str]:
    rules = package / "diagnosis" / "rules"
    modules = {path.stem for path in rules.glob("*.py") if not path.stem.startswith("_")}
    wrong = []
    for path in sorted(rules.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        for module, names in imports(path):
            targets = {f"{module}.{name}" for name in names} | {module}
            for target in targets:
                parts = target.split(".")
                if parts[:3] == ["stepscope", "diagnosis", "rules"] and len(parts) > 3 and parts[3] in modules:
                    wrong.append(f"rules/{path.name} imports rules/{parts[3]}.py")
    return sorted(set(wrong))


def module_graph(package: Path) -> dict[str, set[str]]:
    """stepscope module -> the stepscope modules it imports (a package's names resolve to its
    submodules when they are modules)."""
    modules = {}
    for path in package.rglob("*.py"):
        parts = path.relative_to(package.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for module, names in imports(path):
            if module.split(".")[0] != "stepscope":
                continue
            subs = [f"{module}.{item}" for item in names if f"{module}.{item}" in modules]
            for target in (subs or [module]) + ([module] if len(subs) < len(names) else []):
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def circles(package: Path) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    graph = module_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# -- the package -----------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_point_downstream(layer):
    wrong = downstream_violations(PACKAGE, layer)
    assert not wrong, "\n".join(wrong)


def test_renderers_import_only_the_view_model_units_and_text():
    wrong = renderer_violations(PACKAGE)
    assert not wrong, "\n".join(wrong)


def test_the_pipeline_is_the_only_caller_of_the_engine():
    wrong = engine_callers(PACKAGE)
    assert not wrong, "\n".join(wrong)


def test_no_rule_imports_another():
    wrong = rule_to_rule_imports(PACKAGE)
    assert not wrong, "\n".join(wrong)


def test_no_module_circles():
    found = circles(PACKAGE)
    assert not found, "\n".join(" ↔ ".join(item) for item in found)


@pytest.mark.parametrize("layer", CORE)
def test_core_names_neither_torch_nor_rich(layer):
    wrong = [f"{path.relative_to(PACKAGE)} imports {module}" for path in _modules(PACKAGE, layer)
             for module, _ in imports(path) if module.split(".")[0] in FORBIDDEN_IN_CORE]
    assert not wrong, "\n".join(wrong)


def test_report_model_loads_with_torch_and_rich_blocked():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'rich', 'pandas'):\n"
        "            raise ImportError(f'blocked: {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import stepscope.report.model, stepscope.diagnosis.rules, stepscope.analysis.bundle, stepscope.pipeline.diagnose\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(PACKAGE.parent)}, check=False)
    assert out.stdout.strip() == "ok", out.stderr


# -- the checks fail on a planted import -----------------------------------------------------------
@pytest.fixture
def copy(tmp_path):
    target = tmp_path / "stepscope"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _plant(path: Path, line: str) -> None:
    path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _planted():\n    {line}\n", encoding="utf-8")


def test_a_renderer_importing_the_analysis_is_caught(copy):
    assert not renderer_violations(copy)
    _plant(copy / "report/render/terminal.py", "from stepscope.analysis.run.signals import SATURATED")
    assert renderer_violations(copy) == ["report/render/terminal.py imports stepscope.analysis.run.signals"]


def test_a_second_engine_caller_is_caught(copy):
    _plant(copy / "cli/report_cmd.py", "from stepscope.diagnosis.engine import run_rules")
    assert engine_callers(copy) == ["cli/report_cmd.py imports run_rules from the engine"]


def test_a_rule_importing_another_is_caught(copy):
    _plant(copy / "diagnosis/rules/healthy.py", "from stepscope.diagnosis.rules.compute import good_mfu")
    assert rule_to_rule_imports(copy) == ["rules/healthy.py imports rules/compute.py"]


def test_a_circle_is_caught(copy):
    _plant(copy / "traces/events.py", "from stepscope.traces.links import link_events")
    assert circles(copy) == [["stepscope.traces.events", "stepscope.traces.links"]]


def test_an_upstream_import_is_caught(copy):
    _plant(copy / "analysis/run/steady.py", "from stepscope.diagnosis.findings import Finding")
    assert downstream_violations(copy, "analysis") == [
        "analysis/run/steady.py imports stepscope.diagnosis.findings.Finding"]
