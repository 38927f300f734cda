"""Content hashes of the script and its local modules (stepscope.capture.sources)."""

from __future__ import annotations

import hashlib
import importlib
import sys

from stepscope.capture.sources import source_hashes


def test_the_script_and_the_local_modules_it_imported_are_hashed(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "src" / "pkg" / "__init__.py").write_text("")
    (repo / "src" / "pkg" / "model.py").write_text("WIDTH = 8\n")
    (repo / "scripts").mkdir()
    script = repo / "scripts" / "train.py"
    script.write_text("import pkg.model\n")
    installed = tmp_path / "venv" / "lib" / "site-packages"
    installed.mkdir(parents=True)
    (installed / "elsewhere_mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(repo / "src"))
    monkeypatch.syspath_prepend(str(installed))
    for name in ("pkg", "pkg.model", "elsewhere_mod"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.import_module("pkg.model")
    importlib.import_module("elsewhere_mod")
    hashes = source_hashes("scripts/train.py", "script", str(repo))
    assert set(hashes) == {"scripts/train.py", "src/pkg/__init__.py", "src/pkg/model.py"}
    assert hashes["src/pkg/model.py"] == hashlib.sha256(b"WIDTH = 8\n").hexdigest()[:16]
    (repo / "src" / "pkg" / "model.py").write_text("WIDTH = 16\n")  # an edit changes the hash
    assert source_hashes("scripts/train.py", "script", str(repo))["src/pkg/model.py"] != hashes["src/pkg/model.py"]


def test_a_script_outside_a_repository_is_rooted_at_its_directory(tmp_path):
    script = tmp_path / "alone.py"
    script.write_text("print(1)\n")
    assert set(source_hashes("alone.py", "script", str(tmp_path))) == {"alone.py"}
    assert source_hashes("missing.py", "script", str(tmp_path)) == {}
