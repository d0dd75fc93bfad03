"""The import layers hold: import-linter's contracts (pyproject ``[tool.importlinter]``) on
the package as installed, every top-level module placed in a layer, and no private name
imported across packages."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tools"))
sys.path.insert(0, str(REPO_ROOT / "bench"))
import package_layout  # noqa: E402  (tools/ and bench/ are folders of scripts, put on the path above)
import static_checks  # noqa: E402
import structure  # noqa: E402

UNLAYERED = {"makespan", "makespan.data"}  # the user's one import on top of everything; no Python


def contract_of_type(contract_type: str) -> dict:
    """The pyproject contract of ``contract_type`` (one of each type there)."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    return next(contract for contract in contracts if contract["type"] == contract_type)


def copy_sources(dest: Path) -> Path:
    """A copy of the package's source folders and pyproject, to add a module to."""
    for folder in {*package_layout.package_dirs(REPO_ROOT).values()}:
        shutil.copytree(REPO_ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(REPO_ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_the_import_contracts_are_kept():
    completed = static_checks.run_check("imports")
    assert completed.returncode == 0, completed.stdout
    assert "0 broken" in completed.stdout


@pytest.mark.parametrize("module_path, added_import, contract_type", [
    ("planner/probe_upward.py", "from makespan.workers import phases", "layers"),  # planner -> workers
    ("planner/probe_shell.py", "from makespan.traces import read_trace", "layers"),  # planner -> shell
    ("app/errors.py", "import makespan.models", "layers"),  # core -> infrastructure
    ("planner/probe_io.py", "import redis", "forbidden"),  # planner -> an I/O library
    ("planner/restore.py", "from makespan.planner import evaluator", "acyclic_siblings"),  # a planner cycle
])
def test_a_forbidden_import_breaks_its_contract(tmp_path, module_path, added_import, contract_type):
    sources = copy_sources(tmp_path / "src")
    target = sources / module_path
    target.write_text((target.read_text() if target.exists() else '"""probe"""\n') + f"\n{added_import}  # probe\n")
    static_checks.CONFIG, saved = sources / "pyproject.toml", static_checks.CONFIG
    try:
        completed = static_checks.run_check("imports", sources)
    finally:
        static_checks.CONFIG = saved
    assert completed.returncode != 0, completed.stdout
    flowing = " ".join(completed.stdout.split())  # the report wraps long contract names
    assert f"{contract_of_type(contract_type)['name']} BROKEN" in flowing, completed.stdout


def test_every_top_level_module_is_in_a_layer(tmp_path):
    layout_root = tmp_path / "layout"
    package_layout.assemble(REPO_ROOT, layout_root)
    modules = structure.load_modules(layout_root)
    top_level = {".".join(module.name.split(".")[:2]) for module in modules}
    layered = {tail.strip().strip("()") for layer in contract_of_type("layers")["layers"]
               for tail in layer.replace("|", ":").split(":")}
    assert top_level - UNLAYERED - layered == set(), "place each new module in a layer of pyproject's [tool.importlinter]"


def test_no_private_name_is_imported_across_packages(tmp_path):
    layout_root = tmp_path / "layout"
    package_layout.assemble(REPO_ROOT, layout_root)
    assert structure.private_imports(structure.load_modules(layout_root)) == []


def test_a_private_import_across_packages_is_found(tmp_path):
    layout_root = tmp_path / "layout"
    package_layout.assemble(REPO_ROOT, layout_root)
    probe = layout_root / "makespan" / "workers" / "probe.py"
    probe.write_text("from makespan.planner.simulator import _demand\n")
    assert structure.private_imports(structure.load_modules(layout_root)) == [
        "makespan.workers.probe: from makespan.planner.simulator import _demand"]


CYCLES_OF_LAYOUT = """
import json, sys
sys.path.insert(0, sys.argv[2])
import structure
graph_edges = structure.edges(structure.import_graph(structure.Path(sys.argv[1])))
print(json.dumps(structure.cycles(graph_edges)))
"""


def module_cycles(layout_root: Path) -> list[list[str]]:
    """Module-level import cycles of an assembled package (in a fresh interpreter: grimp's
    graph is built from the copy, which must not replace this process's makespan)."""
    completed = subprocess.run([sys.executable, "-c", CYCLES_OF_LAYOUT, str(layout_root), str(REPO_ROOT / "bench")],
                               capture_output=True, text=True, check=True)
    return json.loads(completed.stdout)


def test_no_module_level_import_cycle_in_the_planner_or_the_workers(tmp_path):
    layout_root = tmp_path / "layout"
    package_layout.assemble(REPO_ROOT, layout_root)
    inside = [cycle for cycle in module_cycles(layout_root)
              if any(structure.in_package(module, package) for module in cycle
                     for package in (structure.PLANNER_PACKAGE, structure.WORKERS_PACKAGE))]
    assert inside == []


def test_a_module_level_cycle_in_the_workers_is_found(tmp_path):
    layout_root = tmp_path / "layout"
    package_layout.assemble(REPO_ROOT, layout_root)
    workers = layout_root / "makespan" / "workers"
    (workers / "probe_a.py").write_text("def f():\n    from makespan.workers import probe_b  # function-level\n")
    (workers / "probe_b.py").write_text("from makespan.workers import probe_a\n")
    assert ["makespan.workers.probe_a", "makespan.workers.probe_b"] in module_cycles(layout_root)
