"""Helpers for the static checks of compose/ and the Procfile: which commands the
project really provides, and how a command line maps onto them."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import shlex
import shutil
from pathlib import Path

import typer

ROOT = Path(__file__).resolve().parent.parent.parent


def makespan_commands() -> set[str]:
    """Subcommand names of the real ``makespan`` CLI (``makespan.cli:app``)."""
    from makespan.cli import app

    return set(typer.main.get_command(app).commands)


def celery_subcommands() -> set[str]:
    from celery.bin.celery import celery as celery_cli

    return set(celery_cli.commands) | {ep.name for ep in importlib.metadata.entry_points(group="celery.commands")}


def strip_env(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split leading ``NAME=value`` words off a command line."""
    env = {}
    while argv and "=" in argv[0] and argv[0].split("=", 1)[0].isidentifier():
        k, v = argv[0].split("=", 1)
        env[k] = v
        argv = argv[1:]
    return env, argv


def option(argv: list[str], name: str) -> str | None:
    """Value of ``--name value`` or ``--name=value`` in ``argv``."""
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def check_project_command(argv: list[str]) -> list[str]:
    """Problems with a makespan-image command (``[]`` when it exists): ``makespan SUB``,
    ``python -m MODULE`` and ``celery -A MODULE:ATTR SUB``."""
    if not argv:
        return ["empty command"]
    prog = argv[0]
    if prog == "makespan":
        return [] if len(argv) > 1 and argv[1] in makespan_commands() else [f"no makespan command {argv[1:2]}"]
    if prog in ("python", "python3") and argv[1:2] == ["-m"]:
        return [] if importlib.util.find_spec(argv[2]) else [f"no module {argv[2]}"]
    if prog == "celery":
        target = option(argv, "-A") or option(argv, "--app")
        if not target:
            return ["celery without -A: it would not use makespan's global_keyprefix"]
        mod, _, attr = target.partition(":")
        obj = getattr(importlib.import_module(mod), attr or "celery", None)
        from celery import Celery

        problems = [] if isinstance(obj, Celery) else [f"{target} is not a Celery app"]
        sub = [a for a in argv[1:] if not a.startswith("-") and a != target]
        if not sub or sub[0] not in celery_subcommands():
            problems.append(f"no celery subcommand {sub[:1]}")
        return problems
    return [f"unknown program {prog}"]


def shell_commands(line: str) -> list[list[str]]:
    """The simple commands of a Procfile line (split on ``&&``; ``exec`` dropped)."""
    out = []
    for part in line.split("&&"):
        argv = shlex.split(part)
        if argv and argv[0] == "exec":
            argv = argv[1:]
        out.append(argv)
    return out


def have_redis_server() -> bool:
    if shutil.which("redis-server"):
        return True
    from makespan.redis_conn import redis_server_binary

    try:
        redis_server_binary()
        return True
    except Exception:  # noqa: BLE001
        return False
