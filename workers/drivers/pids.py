"""Process liveness as the drivers, the observer and the orphan sweep read it."""

from __future__ import annotations

import os
from pathlib import Path


def process_alive(pid: int) -> bool:
    """True if process ``pid`` runs and is not a zombie (one we may not signal counts as
    running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


__all__ = ["process_alive"]
