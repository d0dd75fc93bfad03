"""What every ``makespan`` CLI module shares: the settings, Redis and keys of a command,
and the one way a command fails (``error: ...`` in red on stderr, exit 2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:  # pragma: no cover
    import redis

    from makespan.keys import Keys
    from makespan.settings import Settings


def context() -> tuple[Settings, redis.Redis, Keys]:
    """Settings from the environment, a Redis client and the key builder."""
    from makespan.keys import Keys
    from makespan.redis_conn import connect
    from makespan.settings import Settings

    s = Settings.from_env()
    return s, connect(s.redis_url), Keys(s.key_prefix)


def fail(e: Exception) -> None:
    """Print ``error: {e}`` and exit 2."""
    typer.secho(f"error: {e}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)
