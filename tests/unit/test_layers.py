"""The package's layers, enforced: every package and top-level module has a layer, imports point
downstream, renderers see only the views (whose fields hold their own types), the pipeline alone
calls the engine and runs the rules, no rule imports another, no module circles.

The layers, in the order data flows (``shared/ARCHITECTURE.md``, the table in
``docs/development.md``): ``record`` ← ``traces`` ← ``analysis`` ← ``diagnosis`` ← ``report`` (the
views) ← ``pipeline`` ← ``cli``, with the tools beside them (``data``, ``zoo``, ``whatif``,
``verify``, ``capture``, ``profilers``, ``api``, ``integrations``). Every import is checked, in
every form: module level or inside a function (a lazy import is still a dependency), absolute or
relative (``from ..analysis import x``), ``import a.b.c`` or ``from a.b import c``, and
``importlib.import_module`` / ``__import__`` of a name the code spells out. Each rule is a function
of a package directory, so the tests below also run it on a copy with one violation planted — each
of the forms a check could miss — to show that it fails.
"""

from __future__ import annotations

import ast
import functools
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# What the view-model may hold besides its own types (shared with test_view_purity.py): the view
# modules (VIEWS), the outside types passed on as they are (PASSED_THROUGH, each with why; of
# those, the PLAIN_RECORDS) and the fields kept for library users (LIBRARY_ONLY).
from view_rules import LIBRARY_ONLY, PASSED_THROUGH, PLAIN_RECORDS, VIEWS

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "stepscope"

#: The leaves every layer may use (each imports only other leaves).
COMMON = {"errors", "units", "_version", "text", "limits", "redact", "safe_write", "heap", "children", "executors",
          "lazy_rows", "switches"}
#: Every other package and top-level module of stepscope -> the layers it may import (besides
#: itself and the leaves). ``report.render`` (the renderers) is a layer of its own, checked more
#: narrowly by :func:`renderer_violations`; ``__init__`` is the package's own ``stepscope/__init__.py``.
_CORE = {"record", "traces", "analysis", "diagnosis"}
ALLOWED: dict[str, set[str]] = {
    "record": set(),
    "traces": {"record"},
    "capture": {"record"},  # runs inside the user's process (and the sampler beside it): light
    "profilers": {"record"},  # the profiler family users time their own regions with
    "analysis": {"record", "traces"},
    "diagnosis": {"analysis", "record", "traces"},
    "data": {"analysis", "record", "traces"},  # the DataLoader toolkit and tuner
    "zoo": {"data", "record"},  # the workloads with planted bottlenecks
    "whatif": {"analysis", "record", "traces"},  # trials of a setting and their comparison
    "verify": {"whatif", "capture", "diagnosis", "analysis", "record", "traces"},  # prescriptions to trials
    "report": {"diagnosis", "analysis", "record", "traces"},  # the views
    "report.render": {"report"},  # the renderers (see RENDERER_MAY)
    "pipeline": {"report", "report.render", "verify", "whatif", "data", "zoo", "capture", *_CORE},
    "api": {"pipeline", "capture", "profilers", "report", "report.render", *_CORE},
    "integrations": {"api", "pipeline", "capture", "profilers", "report", "report.render", *_CORE},
    "__init__": {"api", "record"},
    "cli": {"pipeline", "api", "verify", "whatif", "data", "zoo", "capture", "profilers", "report",
            "report.render", *_CORE},
    "__main__": {"cli"},
}
#: Modules of an allowed layer that a layer still may not import: only the pipeline calls the
#: engine and runs the rules (``pipeline/diagnose.py``); the diagnosis package uses its own.
ENGINE = ("stepscope.diagnosis.engine", "stepscope.diagnosis.rules")
ENGINE_CALLER = "pipeline/diagnose.py"
#: What a renderer (``report/render/``) may import of stepscope: the views, its fellow renderers,
#: and the leaves that format and write.
RENDERER_MAY = ("stepscope.report.model", "stepscope.report.run_view", "stepscope.report.command_views",
                "stepscope.report.diff_view", "stepscope.report.render", "stepscope.units", "stepscope.text",
                "stepscope._version", "stepscope.errors", "stepscope.safe_write")
#: Third-party packages the analysis core must not import (it runs without them).
CORE = ("record", "traces", "analysis", "diagnosis")
FORBIDDEN_IN_CORE = ("torch", "rich", "pandas")
_DYNAMIC = {"import_module", "__import__"}


def module_name(package: Path, path: Path) -> str:
    """``stepscope.a.b`` for ``<package>/a/b.py`` (``stepscope.a`` for ``a/__init__.py``)."""
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(package: Path, path: Path, node: ast.ImportFrom) -> str:
    """The module a ``from … import`` names, relative ones resolved against ``path``'s package."""
    if not node.level:
        return node.module or ""
    here = module_name(package, path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
    return ".".join([*base, node.module] if node.module else base)


def _dynamic_target(call: ast.Call) -> str | None:
    """The module ``importlib.import_module(...)`` / ``__import__(...)`` names: the string, or the
    constant start of an f-string up to its last dot (``f"stepscope.report.render.{x}"`` ->
    ``stepscope.report.render``); ``"?"`` when the code does not spell it out."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in _DYNAMIC or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)
        return prefix.rpartition(".")[0] if "." in prefix else "?"
    return "?"


@functools.lru_cache(maxsize=None)
def _parsed_text(text: str) -> ast.Module:
    return ast.parse(text)


def _parsed(path: Path) -> ast.Module:
    """``path``'s syntax tree, parsed once per distinct text: the checks below run on the package and
    on copies of it that differ in one planted file, twice each (read only: no check changes a tree)."""
    return _parsed_text(path.read_text(encoding="utf-8"))


def imports(path: Path, package: Path = PACKAGE) -> list[tuple[str, tuple[str, ...]]]:
    """Every import of ``path`` (module level or not, absolute, relative or dynamic): (module,
    names imported from it). A dynamic import the code does not spell out is ``("?", ())``."""
    tree = _parsed(path)
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(package, path, node)
            if module:
                found.append((module, tuple(alias.name for alias in node.names)))
        elif isinstance(node, ast.Call) and (target := _dynamic_target(node)) is not None:
            found.append((target, ()))
    return found


def _targets(package: Path, module: str, names: tuple[str, ...]) -> list[str]:
    """The stepscope modules an import reaches: ``from a import b`` reaches ``a.b`` when that is a
    module, else ``a``."""
    if not names:
        return [module]
    return [f"{module}.{name}" if _is_module(package, f"{module}.{name}") else module for name in names]


def _is_module(package: Path, dotted: str) -> bool:
    path = package.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def unit_of(dotted: str) -> str | None:
    """The layer a stepscope module belongs to (``report.render`` for the renderers), None outside."""
    parts = dotted.split(".")
    if parts[0] != "stepscope":
        return None
    if len(parts) == 1:
        return "__init__"
    if parts[1] == "report" and len(parts) > 2 and parts[2] == "render":
        return "report.render"
    return parts[1]


def units(package: Path) -> list[str]:
    """Every package and top-level module of stepscope."""
    found = ["__init__"]
    for entry in sorted(package.iterdir()):
        if entry.is_dir() and (entry / "__init__.py").exists():
            found.append(entry.name)
        elif entry.suffix == ".py" and entry.name != "__init__.py":
            found.append(entry.stem)
    if (package / "report" / "render" / "__init__.py").exists():
        found.append("report.render")
    return found


def unassigned(package: Path) -> list[str]:
    return [name for name in units(package) if name not in ALLOWED and name not in COMMON]


def _files(package: Path, unit: str) -> list[Path]:
    if unit == "__init__":
        return [package / "__init__.py"]
    if (package / f"{unit}.py").exists():
        return [package / f"{unit}.py"]
    folder = package.joinpath(*unit.split("."))
    files = sorted(folder.rglob("*.py"))
    if unit == "report":  # the renderers are a layer of their own
        files = [path for path in files if "render" not in path.relative_to(folder).parts[:1]]
    return files


#: Layers whose every import must be named in the code (no ``import_module(variable)``): the core,
#: the views and renderers, the pipeline. Tools that load a user's module by name are exempt.
NAMED_IMPORTS_ONLY = {*CORE, "report", "report.render", "pipeline"}
#: The engine's entry points: importing one (or the engine module itself, to call through it) is
#: running the engine.
ENGINE_CALLS = {"diagnose_job", "run_rules", "diagnose", "merge_findings"}


def _runs_engine(package: Path, module: str, names: tuple[str, ...]) -> str | None:
    """What an import reaches of the engine's entry points or the rules, if anything."""
    engine, rules = ENGINE
    if module == rules or module.startswith(rules + "."):
        return module  # the registry (RULES) or a rule module: running rules
    if module == engine:
        called = ENGINE_CALLS & set(names)
        if not names:
            return engine
        return f"{engine} ({', '.join(sorted(called))})" if called else None
    if module == "stepscope.diagnosis" and ({"engine", "rules"} & set(names)):
        return ", ".join(f"stepscope.diagnosis.{name}" for name in sorted({"engine", "rules"} & set(names)))
    return None


def downstream_violations(package: Path, layer: str) -> list[str]:
    """Imports of ``layer`` that reach a layer it may not import, a dynamic import that does not
    say what (in :data:`NAMED_IMPORTS_ONLY`), or the engine's entry points and the rules from outside
    the diagnosis and ``pipeline/diagnose.py``."""
    allowed = ALLOWED.get(layer, set()) | COMMON | {layer}
    wrong = []
    for path in _files(package, layer):
        relative = str(path.relative_to(package))
        for module, names in imports(path, package):
            if module == "?":
                if layer in NAMED_IMPORTS_ONLY:
                    wrong.append(f"{relative} imports a module it does not name")
                continue
            if layer != "diagnosis" and relative != ENGINE_CALLER \
                    and (reached := _runs_engine(package, module, names)) is not None:
                wrong.append(f"{relative} imports {reached}: only {ENGINE_CALLER} runs the engine and the rules")
            for target in _targets(package, module, names):
                unit = unit_of(target)
                if unit is None or unit not in units(package):
                    continue
                if unit not in allowed:
                    wrong.append(f"{relative} imports {target}")
    return sorted(set(wrong))


def _defined(path: Path) -> set[str]:
    """The names a module defines itself (classes, functions, assignments), not those it imports."""
    tree = _parsed(path)
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def renderer_violations(package: Path) -> list[str]:
    """A renderer imports only :data:`RENDERER_MAY`, names no module it does not spell out, and
    takes from the view modules only what they define (an analysis type passed on through
    ``report.model`` is still the analysis)."""
    wrong = []
    defined = {view: _defined(package.parent.joinpath(*view.split(".")).with_suffix(".py"))
               for view in VIEWS if package.parent.joinpath(*view.split(".")).with_suffix(".py").exists()}
    for path in _files(package, "report.render"):
        relative = str(path.relative_to(package))
        for module, names in imports(path, package):
            if module == "?":
                wrong.append(f"{relative} imports a module it does not name")
                continue
            if module.split(".")[0] != "stepscope":
                continue
            for target in _targets(package, module, names):
                if not any(target == allowed or target.startswith(allowed + ".") for allowed in RENDERER_MAY):
                    wrong.append(f"{relative} imports {target}")
            if module in defined:
                wrong += [f"{relative} imports {name} through {module} (defined elsewhere)"
                          for name in names if name not in defined[module] and name not in PASSED_THROUGH]
    return sorted(set(wrong))


def _view_path(package: Path, view: str) -> Path:
    return package.parent.joinpath(*view.split(".")).with_suffix(".py")


def _outside_names(package: Path, path: Path) -> dict[str, str]:
    """The names a view module imports from stepscope modules other than the views (under
    ``TYPE_CHECKING`` too) -> the module each comes from."""
    found = {}
    for module, names in imports(path, package):
        if module.split(".")[0] == "stepscope" and module not in VIEWS:
            found.update({name: module for name in names})
    return found


def _dataclasses(path: Path) -> list[ast.ClassDef]:
    tree = _parsed(path)
    return [node for node in tree.body if isinstance(node, ast.ClassDef) and any(
        "dataclass" in ast.unparse(decorator) for decorator in node.decorator_list)]


def foreign_view_fields(package: Path) -> list[str]:
    """Fields of the views' dataclasses whose type names an analysis, diagnosis or record type:
    each would hand a renderer an object whose methods and properties compute. Allowed: the types
    passed on as they are (``PASSED_THROUGH``) and the fields kept for library users
    (``LIBRARY_ONLY``, which no renderer reads: ``tests/unit/report/test_view_purity.py``)."""
    wrong = []
    for view in VIEWS:
        path = _view_path(package, view)
        outside = _outside_names(package, path)
        for node in _dataclasses(path):
            for item in node.body:
                if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                    continue
                named = {name.id for name in ast.walk(item.annotation) if isinstance(name, ast.Name)}
                held = sorted(name for name in named & set(outside) if name not in PASSED_THROUGH)
                if held and f"{node.name}.{item.target.id}" not in LIBRARY_ONLY:
                    wrong.append(f"{path.relative_to(package)}: {node.name}.{item.target.id} holds {', '.join(held)}")
    return wrong


#: What a passed-through plain record may define besides its fields (and dunder methods).
PLAIN_RECORD_METHODS = {"to_dict"}


def computing_records(package: Path) -> list[str]:
    """The passed-through plain records (``PLAIN_RECORDS``) that define a method or a property
    besides ``to_dict``, or derive from a class: a renderer reading one could compute. Each is found
    in the module a view imports it from."""
    wrong = []
    origins = {name: module for view in VIEWS
               for name, module in _outside_names(package, _view_path(package, view)).items()}
    for name in sorted(PLAIN_RECORDS):
        if name not in origins:
            continue  # not held by the views (any more)
        path = _view_path(package, origins[name])
        if not path.exists():
            path = path.with_suffix("") / "__init__.py"
        tree = _parsed(path)
        node = next((item for item in tree.body if isinstance(item, ast.ClassDef) and item.name == name), None)
        if node is None:
            wrong.append(f"{name}: not defined in {origins[name]} (import it from its own module)")
            continue
        if node.bases:
            wrong.append(f"{name} derives from {', '.join(ast.unparse(base) for base in node.bases)}")
        wrong += [f"{name}.{item.name} computes" for item in node.body
                  if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name not in PLAIN_RECORD_METHODS
                  and not (item.name.startswith("__") and item.name.endswith("__"))]
    return wrong


def rule_to_rule_imports(package: Path) -> list[str]:
    rules = package / "diagnosis" / "rules"
    modules = {path.stem for path in rules.glob("*.py") if not path.stem.startswith("_")}
    wrong = []
    for path in sorted(rules.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        for module, names in imports(path, package):
            for target in {f"{module}.{name}" for name in names} | {module}:
                parts = target.split(".")
                if parts[:3] == ["stepscope", "diagnosis", "rules"] and len(parts) > 3 and parts[3] in modules \
                        and parts[3] != path.stem:
                    wrong.append(f"rules/{path.name} imports rules/{parts[3]}.py")
    return sorted(set(wrong))


def module_graph(package: Path) -> dict[str, set[str]]:
    """stepscope module -> the stepscope modules it imports (a package's names resolve to its
    submodules when they are modules)."""
    modules = {module_name(package, path): path for path in package.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for module, names in imports(path, package):
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
def test_every_package_and_module_has_a_layer():
    assert not unassigned(PACKAGE), f"no layer in ALLOWED or COMMON: {unassigned(PACKAGE)}"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_point_downstream(layer):
    wrong = downstream_violations(PACKAGE, layer)
    assert not wrong, "\n".join(wrong)


def test_leaves_import_only_leaves():
    wrong = [f"{path.relative_to(PACKAGE)} imports {module}" for leaf in sorted(COMMON) for path in _files(PACKAGE, leaf)
             for module, names in imports(path) for target in _targets(PACKAGE, module, names)
             if (unit := unit_of(target)) is not None and unit in units(PACKAGE) and unit not in COMMON]
    assert not wrong, "\n".join(wrong)


def test_renderers_import_only_the_views_units_and_text():
    wrong = renderer_violations(PACKAGE)
    assert not wrong, "\n".join(wrong)


def test_view_fields_hold_view_types():
    wrong = foreign_view_fields(PACKAGE)
    assert not wrong, "\n".join(wrong)


def test_passed_through_records_are_plain():
    wrong = computing_records(PACKAGE)
    assert not wrong, "\n".join(wrong)


def test_no_rule_imports_another():
    wrong = rule_to_rule_imports(PACKAGE)
    assert not wrong, "\n".join(wrong)


def test_no_module_circles():
    found = circles(PACKAGE)
    assert not found, "\n".join(" ↔ ".join(item) for item in found)


@pytest.mark.parametrize("layer", CORE)
def test_core_names_neither_torch_nor_rich(layer):
    wrong = [f"{path.relative_to(PACKAGE)} imports {module}" for path in _files(PACKAGE, layer)
             for module, _ in imports(path) if module.split(".")[0] in FORBIDDEN_IN_CORE]
    assert not wrong, "\n".join(wrong)


def test_no_cli_module_builds_a_table_or_a_screen():
    """The CLI parses and dispatches: rich's tables, texts and live screens are the renderers' (only
    ``analyze``'s loading progress bar, on stderr, is drawn by its command)."""
    wrong = [f"{path.relative_to(PACKAGE)} imports {module}.{name}" for path in _files(PACKAGE, "cli")
             for module, names in imports(path) if module.split(".")[0] == "rich"
             for name in names or ("",) if name in ("Table", "Panel", "Tree", "Columns", "Group", "Live", "Text", "")]
    assert not wrong, "\n".join(wrong)


#: The longest a module may be: past it, it holds more than one stage and gets split along them.
MAX_MODULE_LINES = 700


def test_no_module_is_over_700_lines():
    long = [f"{path.relative_to(PACKAGE)}: {count} lines" for path in sorted(PACKAGE.rglob("*.py"))
            if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not long, "\n".join(long)


def test_report_model_loads_with_torch_and_rich_blocked():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('torch', 'rich', 'pandas'):\n"
        "            raise ImportError(f'blocked: {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import stepscope.report.model, stepscope.report.command_views, stepscope.diagnosis.rules\n"
        "import stepscope.analysis.bundle, stepscope.pipeline.diagnose, stepscope.pipeline.commands\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(PACKAGE.parent)}, check=False)
    assert out.stdout.strip() == "ok", out.stderr


# -- the checks fail on each planted form ----------------------------------------------------------
@pytest.fixture
def copy(tmp_path):
    target = tmp_path / "stepscope"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _plant(path: Path, *lines: str) -> None:
    body = "".join(f"    {line}\n" for line in lines)
    path.write_text(path.read_text(encoding="utf-8") + f"\n\ndef _planted():\n{body}", encoding="utf-8")


def added(check, copy: Path, path: str, *lines: str) -> list[str]:
    """What ``check(copy)`` reports once ``lines`` are planted in ``path`` that it did not before
    (so a plant is judged alone, whatever else the working tree holds)."""
    before = check(copy)
    _plant(copy / path, *lines)
    return [item for item in check(copy) if item not in before]


def _cli(copy: Path) -> list[str]:
    return downstream_violations(copy, "cli")


ENGINE_ONLY = ": only pipeline/diagnose.py runs the engine and the rules"


def test_a_renderer_importing_the_analysis_is_caught(copy):
    assert added(renderer_violations, copy, "report/render/terminal.py",
                 "from stepscope.analysis.run.signals import SATURATED") == [
        "report/render/terminal.py imports stepscope.analysis.run.signals"]


def test_a_second_engine_caller_is_caught(copy):
    assert added(_cli, copy, "cli/report_cmd.py", "from stepscope.diagnosis.engine import run_rules") == [
        f"cli/report_cmd.py imports stepscope.diagnosis.engine (run_rules){ENGINE_ONLY}"]


def test_the_engine_module_imported_then_called_is_caught(copy):
    """``from stepscope.diagnosis import engine`` then ``engine.run_rules(...)``."""
    assert added(lambda package: downstream_violations(package, "api"), copy, "api.py",
                 "from stepscope.diagnosis import engine", "return engine.run_rules(None)") == [
        f"api.py imports stepscope.diagnosis.engine{ENGINE_ONLY}"]


def test_the_engine_imported_as_a_module_path_is_caught(copy):
    """``import stepscope.diagnosis.engine`` then a call through the dotted name."""
    assert added(lambda package: downstream_violations(package, "integrations"), copy, "integrations/lightning.py",
                 "import stepscope.diagnosis.engine", "return stepscope.diagnosis.engine.diagnose_job(())") == [
        f"integrations/lightning.py imports stepscope.diagnosis.engine{ENGINE_ONLY}"]


def test_running_the_rules_from_the_cli_is_caught(copy):
    """``RULES`` run directly, bypassing the engine and the pipeline."""
    assert added(_cli, copy, "cli/run_cmd.py", "from stepscope.diagnosis.rules import RULES",
                 "return [rule(None) for rule in RULES]") == [f"cli/run_cmd.py imports stepscope.diagnosis.rules{ENGINE_ONLY}"]


def test_a_cli_module_importing_a_rule_is_caught(copy):
    assert added(_cli, copy, "cli/exports.py", "from stepscope.diagnosis.rules.compute import good_mfu") == [
        f"cli/exports.py imports stepscope.diagnosis.rules.compute{ENGINE_ONLY}"]


def test_a_relative_upward_import_is_caught(copy):
    """``from ..analysis import bundle`` in ``record/``: the same arrow as the absolute import."""
    assert added(lambda package: downstream_violations(package, "record"), copy, "record/run.py",
                 "from ..analysis import bundle") == ["record/run.py imports stepscope.analysis.bundle"]


def test_an_analysis_type_passed_on_through_the_view_model_is_caught(copy):
    model = copy / "report/model.py"
    model.write_text(model.read_text(encoding="utf-8") + "\nfrom stepscope.analysis.run.steady import SteadyState\n",
                     encoding="utf-8")
    assert added(renderer_violations, copy, "report/render/terminal.py",
                 "from stepscope.report.model import SteadyState") == [
        "report/render/terminal.py imports SteadyState through stepscope.report.model (defined elsewhere)"]


def _edited(check, copy: Path, path: str, edit) -> list[str]:
    """What ``check(copy)`` reports once ``path``'s text is ``edit(text)`` that it did not before."""
    before = check(copy)
    target = copy / path
    target.write_text(edit(target.read_text(encoding="utf-8")), encoding="utf-8")
    return [item for item in check(copy) if item not in before]


def test_an_analysis_type_held_by_a_view_field_is_caught(copy):
    """``tuple[StepStats, ...] | None``: the type is found anywhere in the annotation."""
    planted = ("\nfrom stepscope.analysis.run.steady import StepStats\n\n\n@dataclass(frozen=True)\n"
               "class Planted:\n    stats: tuple[StepStats, ...] | None\n")
    assert _edited(foreign_view_fields, copy, "report/model.py", lambda text: text + planted) == [
        "report/model.py: Planted.stats holds StepStats"]


def test_a_property_on_a_passed_through_record_is_caught(copy):
    planted = "class KernelRow:\n    @property\n    def share(self) -> float:\n        return 0.0\n\n"
    assert _edited(computing_records, copy, "analysis/trace/kernels.py",
                   lambda text: text.replace("class KernelRow:\n", planted, 1)) == ["KernelRow.share computes"]


def test_importlib_of_the_analysis_in_a_renderer_is_caught(copy):
    assert added(renderer_violations, copy, "report/render/html.py", "import importlib",
                 "return importlib.import_module('stepscope.analysis.run.steady').steady_state") == [
        "report/render/html.py imports stepscope.analysis.run.steady"]


def test_a_dynamic_import_of_an_unnamed_module_in_a_renderer_is_caught(copy):
    assert added(renderer_violations, copy, "report/render/html.py", "name = 'stepscope.analysis.run.steady'",
                 "return __import__(name)") == ["report/render/html.py imports a module it does not name"]


def test_a_rule_importing_another_is_caught(copy):
    assert added(rule_to_rule_imports, copy, "diagnosis/rules/healthy.py",
                 "from stepscope.diagnosis.rules.compute import good_mfu") == ["rules/healthy.py imports rules/compute.py"]


def test_a_relative_import_between_rules_is_caught(copy):
    """``from . import compute`` in a rule."""
    assert added(rule_to_rule_imports, copy, "diagnosis/rules/healthy.py", "from . import compute") == [
        "rules/healthy.py imports rules/compute.py"]


def test_a_package_without_a_layer_is_caught(copy):
    (copy / "newpkg").mkdir()
    (copy / "newpkg" / "__init__.py").write_text("", encoding="utf-8")
    (copy / "newmodule.py").write_text("", encoding="utf-8")
    assert unassigned(copy) == ["newmodule", "newpkg"]


def test_a_circle_is_caught(copy):
    assert added(circles, copy, "traces/events.py", "from stepscope.traces.links import link_events") == [
        ["stepscope.traces.events", "stepscope.traces.links"]]


def test_an_upstream_import_is_caught(copy):
    assert added(lambda package: downstream_violations(package, "analysis"), copy, "analysis/run/steady.py",
                 "from stepscope.diagnosis.findings import Finding") == [
        "analysis/run/steady.py imports stepscope.diagnosis.findings"]


def test_a_cli_table_is_caught(copy, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", copy)
    _plant(copy / "cli/runs_cmd.py", "from rich.table import Table")
    with pytest.raises(AssertionError, match="cli/runs_cmd.py imports rich.table.Table"):
        test_no_cli_module_builds_a_table_or_a_screen()
