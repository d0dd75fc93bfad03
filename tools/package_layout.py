"""Assemble the installed layout of the ``makespan`` package from a source tree.

The repository's folders map into one import package (pyproject's
``[tool.setuptools.package-dir]``: ``app/`` is ``makespan``, ``planner/`` is
``makespan.planner`` ...). Tools that find modules by walking folders (mypy, grimp on
an older commit) need the folders as Python sees them; this module copies the ``.py``
files (and ``py.typed``) into ``DEST/makespan/...``.

Usage::

    python tools/package_layout.py DEST            # from the working tree
    python tools/package_layout.py DEST --rev REV  # from a git commit (git archive)
"""
from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
COPIED_SUFFIXES = (".py", ".pyi", ".typed")


def package_dirs(source_root: Path) -> dict[str, str]:
    """Map each package name to its source folder, as pyproject's package-dir says.

    Returns:
        ``{"makespan": "app", "makespan.planner": "planner", ...}`` (folders relative
        to ``source_root``).
    """
    config = tomllib.loads((source_root / "pyproject.toml").read_text())
    return dict(config["tool"]["setuptools"]["package-dir"])


def export_revision(rev: str, dest: Path) -> Path:
    """Extract the files of git commit ``rev`` of this repository into ``dest``.

    Raises:
        subprocess.CalledProcessError: ``rev`` is not a commit of the repository.
    """
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", rev],
                             check=True, capture_output=True).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def assemble(source_root: Path, dest: Path) -> dict[Path, Path]:
    """Copy the package's source files from ``source_root`` into ``dest`` as installed.

    The mapped folders are siblings (none lies inside another), so each file is copied
    once. ``dest`` is emptied first.

    Returns:
        ``{copied folder: source folder}`` for each package, to map tool output back.
    """
    if dest.exists():
        shutil.rmtree(dest)
    mapping: dict[Path, Path] = {}
    for package, folder in sorted(package_dirs(source_root).items()):
        target = dest.joinpath(*package.split("."))
        mapping[target] = source_root / folder
        for path in (source_root / folder).rglob("*"):
            if path.suffix not in COPIED_SUFFIXES or not path.is_file():
                continue
            relative = path.relative_to(source_root / folder)
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / relative)
    return mapping


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="folder to create DEST/makespan/... in (emptied first)")
    parser.add_argument("--rev", help="git commit to take the files from (default: the working tree)")
    args = parser.parse_args(argv)
    source_root = REPO_ROOT
    if args.rev:
        source_root = export_revision(args.rev, args.dest.with_name(args.dest.name + "-src"))
    assemble(source_root, args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
