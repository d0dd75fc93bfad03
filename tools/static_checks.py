"""The static checks CI runs before the tests: import contracts and types.

Usage::

    python tools/static_checks.py imports   # import-linter: pyproject's [tool.importlinter]
    python tools/static_checks.py types     # mypy: the modules of pyproject's [tool.mypy] `packages`/`modules`

Both tools find modules by walking folders, and the editable install maps folders into
the package (app/ is makespan, planner/ is makespan.planner ...), so each check runs on
the package assembled as installed (:mod:`package_layout`) in a temporary folder; file
paths in the output are mapped back to the repository's. Exit status: the tool's (0:
clean).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import package_layout  # noqa: E402  (this folder is not a package; put on the path above)

REPO_ROOT = package_layout.REPO_ROOT
CONFIG = REPO_ROOT / "pyproject.toml"


def command_for(check: str, layout_root: Path, cache_dir: Path) -> list[str]:
    """The tool's command line for ``check`` ("imports" or "types")."""
    bin_dir = Path(sys.executable).parent
    if check == "imports":
        return [str(bin_dir / "lint-imports"), str(CONFIG), "--no-cache"]
    return [sys.executable, "-m", "mypy", "--config-file", str(CONFIG), "--cache-dir", str(cache_dir)]


def run_check(check: str, source_root: Path = REPO_ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``check`` on ``source_root``'s package; returns the finished process (output
    with paths mapped back to ``source_root``'s folders)."""
    with tempfile.TemporaryDirectory(prefix="makespan-checks-") as work:
        layout_root = Path(work) / "layout"
        mapping = package_layout.assemble(source_root, layout_root)
        environment = dict(os.environ, MYPYPATH=str(layout_root), PYTHONPATH=str(layout_root))
        completed = subprocess.run(command_for(check, layout_root, Path(work) / "mypy-cache"), cwd=layout_root,
                                   env=environment, capture_output=True, text=True)
        output = completed.stdout + completed.stderr
        # longest first: makespan/planner/ before makespan/
        for copied, source in sorted(mapping.items(), key=lambda item: -len(str(item[0]))):
            output = output.replace(str(copied.relative_to(layout_root)) + "/",
                                    str(source.relative_to(source_root)) + "/")
            output = output.replace(str(copied) + "/", str(source) + "/")
        return subprocess.CompletedProcess(completed.args, completed.returncode, output, "")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ("imports", "types"):
        print(__doc__, file=sys.stderr)
        return 2
    import importlib.util

    tool = {"imports": "importlinter", "types": "mypy"}[args[0]]
    if importlib.util.find_spec(tool) is None:
        print(f"error: {tool} is not installed in {sys.executable}'s environment; the checks need the "
              "test extra: pip install -e '.[test]'", file=sys.stderr)
        return 2
    completed = run_check(args[0])
    print(completed.stdout, end="")
    return completed.returncode


if __name__ == "__main__":
    sys.exit(main())
