"""Measure makespan's structure (issue 17's table) on the working tree or on a commit.

Usage::

    python bench/structure.py                  # the working tree
    python bench/structure.py --rev 9cf659a    # a commit (git archive into a temp folder)
    python bench/structure.py --no-mypy        # skip the type check (the slowest part)

Prints one Markdown table; the same source gives the same numbers (no timing, no
randomness). The package is assembled as installed (``tools/package_layout.py``) and
every measure reads that copy. The exact rules:

- **Lua scripts outside the store**: string literals (an f-string counts as one) that
  contain ``redis.call(`` or ``redis.pcall(``, in modules outside ``makespan.store``;
  a shared fragment is a literal of its own and counts.
- **modules writing a job's state field**: modules with a Lua literal holding a
  ``redis.call('HSET', key, ..., 'state', ...)``, a Python ``.hset(...)`` /
  ``.hsetnx(...)`` call with the constant ``"state"`` as an argument or as a key of a
  ``mapping={...}`` literal, or a tuple/list literal starting ``"HSET"`` that holds
  ``"state"`` (the fenced-ops form). Writes of a whole prepared field list
  (``unpack(flat)``, ``mapping=fields``) are not seen.
- **mypy errors**: ``mypy -p makespan`` with the working tree's ``[tool.mypy]``
  settings (also for an older commit), its ``error:`` lines and those tagged
  ``[attr-defined]``.
- **local names of <= 3 characters**: per function (and lambda), the distinct names it
  binds: its parameters except ``self``, ``cls`` and ``_``, and every name assigned in its
  own body (assignment, augmented/annotated assignment, ``for``/``with``/``except``
  targets, walrus, comprehension variables, local imports); nested functions count on
  their own. Share = names of at most 3 characters / all such names.
- **largest function**: every function, method and nested function; lines from
  ``def`` to its last line; McCabe complexity from the ``mccabe`` package (ruff's C901).
- **import edges**: grimp's graph of ``makespan`` (module-level and function-level
  imports); an edge is one (importer, imported) module pair. "planner -> outside core"
  counts edges from ``makespan.planner.*`` to a ``makespan`` module that is neither in the
  planner nor in :data:`CORE_MODULES`. Cycles: strongly connected sets of more than one
  module.
- **private names across packages**: ``from makespan.X import _name`` (a leading
  underscore, not a dunder) where the importer's package differs from ``X``'s package;
  one per (importer, module, name).
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "tools"))
import package_layout  # noqa: E402  (tools/ is not a package; its folder is put on the path above)

PACKAGE = "makespan"
STORE_PACKAGE = "makespan.store"
PLANNER_PACKAGE = "makespan.planner"
WORKERS_PACKAGE = "makespan.workers"
# the core every layer may import (pyproject's [tool.importlinter] names the same modules)
CORE_MODULES = ("makespan.errors", "makespan.priorities", "makespan.job_states", "makespan.planning_types")
SHORT_NAME_MAX_CHARS = 3
IGNORED_PARAMETERS = {"self", "cls", "_"}
LUA_CALL = re.compile(r"redis\.p?call\(")
LUA_HSET = re.compile(r"redis\.p?call\(\s*['\"]HSET['\"]")
STATE_FIELD = re.compile(r"['\"]state['\"]")


@dataclass
class Module:
    """One parsed module of the assembled package."""

    name: str
    path: Path
    tree: ast.Module
    source: str

    @property
    def package(self) -> str:
        """The package the module belongs to (itself for an ``__init__``)."""
        return self.name if self.path.name == "__init__.py" else self.name.rpartition(".")[0]


@dataclass
class Measures:
    """The table's rows, in the order printed."""

    rows: list[tuple[str, str]] = field(default_factory=list)

    def add(self, label: str, value: object) -> None:
        self.rows.append((label, str(value)))


def load_modules(layout_root: Path) -> list[Module]:
    """Parse every ``.py`` file under ``layout_root/makespan``, sorted by module name."""
    modules = []
    for path in sorted((layout_root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(layout_root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        source = path.read_text()
        modules.append(Module(".".join(parts), path, ast.parse(source, str(path)), source))
    return sorted(modules, key=lambda module: module.name)


def in_package(module_name: str, package: str) -> bool:
    """Whether ``module_name`` is ``package`` or one of its descendants."""
    return module_name == package or module_name.startswith(package + ".")


def string_literals(tree: ast.AST) -> Iterator[str]:
    """Yield each string literal's text; an f-string yields its constant parts joined."""
    inside_fstrings: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [value.value for value in node.values
                     if isinstance(value, ast.Constant) and isinstance(value.value, str)]
            inside_fstrings.update(id(value) for value in node.values)
            yield "".join(parts)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside_fstrings:
            yield node.value


def lua_literals(module: Module) -> list[str]:
    """The module's string literals that are Lua (they call ``redis.call``)."""
    return [text for text in string_literals(module.tree) if LUA_CALL.search(text)]


def lua_writes_state(lua: str) -> bool:
    """Whether a Lua text has an ``HSET`` call whose arguments include ``'state'``."""
    for match in LUA_HSET.finditer(lua):
        opening = match.start() + match.group().index("(")
        depth, end = 0, opening
        for end in range(opening, len(lua)):
            depth += {"(": 1, ")": -1}.get(lua[end], 0)
            if depth == 0:
                break
        if STATE_FIELD.search(lua[match.end():end]):
            return True
    return False


def is_state_constant(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value == "state"


def python_writes_state(tree: ast.AST) -> bool:
    """Whether Python code writes a hash's ``state`` field (rules in the module docstring)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in {"hset", "hsetnx"}:
            if any(is_state_constant(argument) for argument in node.args):
                return True
            for keyword in node.keywords:
                if keyword.arg == "mapping" and isinstance(keyword.value, ast.Dict):
                    if any(is_state_constant(key) for key in keyword.value.keys):
                        return True
        if isinstance(node, (ast.Tuple, ast.List)) and node.elts:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value == "HSET" and any(map(is_state_constant, node.elts)):
                return True
    return False


def bound_names(function: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    """The names a function binds itself (parameters and its own body; see the docstring)."""
    arguments = function.args
    names = {argument.arg for argument in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                                           *filter(None, [arguments.vararg, arguments.kwarg])]}
    names -= IGNORED_PARAMETERS
    body = function.body if isinstance(function.body, list) else [function.body]
    pending: list[ast.AST] = list(body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            pending.extend(node.decorator_list)
            continue  # its body is its own scope
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        pending.extend(ast.iter_child_nodes(node))
    return names - {"_"}


def short_name_share(modules: list[Module], package: str) -> tuple[int, int]:
    """(short names, all names) bound in the functions of ``package``'s modules."""
    short = total = 0
    for module in modules:
        if not in_package(module.name, package):
            continue
        for node in ast.walk(module.tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                names = bound_names(node)
                total += len(names)
                short += sum(len(name) <= SHORT_NAME_MAX_CHARS for name in names)
    return short, total


def function_blocks(modules: list[Module]) -> list[tuple[str, int, int]]:
    """(qualified name, lines, McCabe complexity) of every function and method.

    Complexity is the ``mccabe`` package's (the one ruff's C901 and flake8 use); a function
    nested in another is part of its parent's graph and gets the parent's figure 0 here.
    """
    import mccabe

    blocks = []
    for module in modules:
        visitor = mccabe.PathGraphingAstVisitor()
        visitor.preorder(module.tree, visitor)
        complexity_by_line = {graph.lineno: graph.complexity() for graph in visitor.graphs.values()}
        pending: list[tuple[str, ast.AST]] = [(module.name, node) for node in module.tree.body]
        while pending:
            prefix, node = pending.pop()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualified = f"{prefix}.{node.name}"
                if not isinstance(node, ast.ClassDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    blocks.append((qualified, lines, complexity_by_line.get(node.lineno, 0)))
                pending.extend((qualified, child) for child in ast.iter_child_nodes(node))
            else:
                pending.extend((prefix, child) for child in ast.iter_child_nodes(node))
    return blocks


def import_graph(layout_root: Path):
    """grimp's graph of the assembled package (the copy under ``layout_root`` is found first)."""
    import grimp

    sys.path.insert(0, str(layout_root))
    for loaded in [name for name in sys.modules if in_package(name, PACKAGE)]:
        del sys.modules[loaded]  # an installed makespan must not shadow the copy
    return grimp.build_graph(PACKAGE, cache_dir=None)


def edges(graph) -> set[tuple[str, str]]:
    return {(importer, imported) for importer in graph.modules
            for imported in graph.find_modules_directly_imported_by(importer)}


def cycles(graph_edges: set[tuple[str, str]]) -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    successors: dict[str, list[str]] = {}
    for importer, imported in sorted(graph_edges):
        successors.setdefault(importer, []).append(imported)
        successors.setdefault(imported, [])
    index: dict[str, int] = {}
    lowlink: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = lowlink[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for root in successors:
        if root in index:
            continue
        visit(root)
        work = [(root, iter(successors[root]))]
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    visit(child)
                    work.append((child, iter(successors[child])))
                    break
                if child in on_stack:
                    lowlink[node] = min(lowlink[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    lowlink[parent] = min(lowlink[parent], lowlink[node])
                if lowlink[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return sorted(components)


def private_imports(modules: list[Module]) -> list[str]:
    """``importer: from module import _name`` lines crossing a package boundary."""
    packages = {module.name: module.package for module in modules}
    found = set()
    for module in modules:
        for node in ast.walk(module.tree):
            if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
                continue
            if node.module not in packages:
                continue
            for alias in node.names:
                private = alias.name.startswith("_") and not alias.name.startswith("__")
                if private and packages[node.module] != module.package:
                    found.add(f"{module.name}: from {node.module} import {alias.name}")
    return sorted(found)


def mypy_counts(layout_root: Path) -> tuple[int, int]:
    """(errors, attr-defined errors) of ``mypy -p makespan`` with this tree's settings."""
    with tempfile.TemporaryDirectory() as cache_dir:
        completed = subprocess.run(
            [sys.executable, "-m", "mypy", "-p", PACKAGE, "--config-file", str(REPO_ROOT / "pyproject.toml"),
             "--cache-dir", cache_dir, "--no-error-summary"],
            capture_output=True, text=True, env={"MYPYPATH": str(layout_root), "PATH": ""}, cwd=layout_root)
    errors = [line for line in completed.stdout.splitlines() if ": error:" in line]
    return len(errors), sum(line.endswith("[attr-defined]") for line in errors)


def measure(layout_root: Path, run_mypy: bool, verbose: bool) -> Measures:
    modules = load_modules(layout_root)
    measures = Measures()

    outside_store = [module for module in modules if not in_package(module.name, STORE_PACKAGE)]
    lua_by_module = {module.name: lua_literals(module) for module in outside_store}
    lua_count = sum(map(len, lua_by_module.values()))
    measures.add("Lua scripts (and fragments) as Python strings outside makespan.store",
                 f"{lua_count} in {sum(bool(texts) for texts in lua_by_module.values())} modules")

    state_writers = [module.name for module in modules
                     if any(lua_writes_state(text) for text in lua_literals(module)) or python_writes_state(module.tree)]
    measures.add("modules writing a hash's `state` field", len(state_writers))

    if run_mypy:
        errors, attr_defined = mypy_counts(layout_root)
        measures.add("mypy errors, whole package (attr-defined)", f"{errors} ({attr_defined})")

    for label, package in (("whole package", PACKAGE), ("planner", PLANNER_PACKAGE)):
        short, total = short_name_share(modules, package)
        measures.add(f"local names <= {SHORT_NAME_MAX_CHARS} chars, {label}", f"{short / total:.1%} ({short} of {total})")

    blocks = function_blocks(modules)
    longest = max(blocks, key=lambda block: (block[1], block[0]))
    most_complex = max(blocks, key=lambda block: (block[2], block[0]))
    measures.add("largest function (lines, complexity)", f"{longest[0]} ({longest[1]}, {longest[2]})")
    measures.add("most complex function (lines, complexity)",
                 f"{most_complex[0]} ({most_complex[1]}, {most_complex[2]})")
    measures.add("functions with complexity > 20", sum(block[2] > 20 for block in blocks))

    graph_edges = edges(import_graph(layout_root))
    from_planner = [(a, b) for a, b in graph_edges if in_package(a, PLANNER_PACKAGE) and not in_package(b, PLANNER_PACKAGE)]
    beyond_core = sorted((a, b) for a, b in from_planner if b not in CORE_MODULES)
    measures.add("import edges planner -> rest of makespan", len(from_planner))
    measures.add("import edges planner -> outside planner and core", len(beyond_core))
    measures.add("import edges planner -> workers",
                 sum(in_package(b, WORKERS_PACKAGE) for _, b in from_planner))
    module_cycles = cycles(graph_edges)
    planner_cycles = [cycle for cycle in module_cycles if all(in_package(m, PLANNER_PACKAGE) for m in cycle)]
    measures.add("import cycles (modules in them), planner only",
                 f"{len(planner_cycles)} ({sum(map(len, planner_cycles))})")
    measures.add("import cycles (modules in them), whole package",
                 f"{len(module_cycles)} ({sum(map(len, module_cycles))})")
    crossing = private_imports(modules)
    measures.add("private names imported across packages", len(crossing))

    if verbose:
        print("state writers:", ", ".join(state_writers))
        print("planner -> outside core:", ", ".join(f"{a} -> {b}" for a, b in beyond_core))
        print("cycles:", *(" <-> ".join(cycle) for cycle in module_cycles), sep="\n  ")
        print("private imports:", *crossing, sep="\n  ")
        print()
    return measures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Measure makespan's structure; prints a Markdown table.")
    parser.add_argument("--rev", help="git commit to measure (default: the working tree)")
    parser.add_argument("--no-mypy", action="store_true", help="skip the mypy count")
    parser.add_argument("--verbose", action="store_true", help="also list what each count found")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as work:
        source_root = REPO_ROOT
        if args.rev:
            source_root = package_layout.export_revision(args.rev, Path(work) / "source")
        layout_root = Path(work) / "layout"
        package_layout.assemble(source_root, layout_root)
        measures = measure(layout_root, run_mypy=not args.no_mypy, verbose=args.verbose)
    revision = args.rev or "working tree"
    print(f"| measure ({revision}) | value |\n| --- | --- |")
    for label, value in measures.rows:
        print(f"| {label} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
