"""Process liveness as the drivers, the observer and the orphan sweep read it: of one
process (:func:`process_alive`) and of an endpoint's process group (:func:`group_members`,
:func:`group_alive`)."""

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


def group_members(leader_pid: int) -> list[int]:
    """Live (not zombie) processes whose process group or session is ``leader_pid``'s
    (an endpoint is started as the leader of its own session), read from ``/proc``;
    sorted pids, the leader included while it runs. Empty where ``/proc`` is absent."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for name in entries:
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue  # ended meanwhile
        rest = stat.rsplit(")", 1)[-1].split()
        if len(rest) < 4 or rest[0] == "Z":
            continue
        pgrp, session = int(rest[2]), int(rest[3])
        if leader_pid in (pgrp, session):
            out.append(int(name))
    return sorted(out)


def group_alive(leader_pid: int) -> bool:
    """True while the process ``leader_pid`` runs or any member of its process group or
    session does (a child that ignored SIGTERM outlives its leader)."""
    return process_alive(leader_pid) or bool(group_members(leader_pid))


__all__ = ["group_alive", "group_members", "process_alive"]
