"""Process liveness as the drivers, the observer and the orphan sweep read it: of one
process (:func:`process_alive`), of an endpoint's process group (:func:`group_members`) and
of the processes that are an instance's own (:func:`is_instance_process`, :func:`instance_members`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

INSTANCE_ENV = "MAKESPAN_INSTANCE_ID"
"""The environment variable a driver sets in every endpoint process it spawns, to the
instance's id: :func:`is_instance_process` reads it back before a process is signalled."""


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


def is_instance_process(pid: int, instance_id: str, gpus: Sequence[str]) -> bool:
    """False when ``pid`` runs a process that is not the endpoint process spawned for the
    instance ``instance_id`` on ``gpus``: its initial environment (``/proc/PID/environ``)
    names another instance in :data:`INSTANCE_ENV`, or names none (a spawn by a version
    before the variable) and its ``CUDA_VISIBLE_DEVICES`` is not ``gpus``; or it belongs to
    another user (unreadable). An instance record names a pid; after a reboot, or long after
    the process ended, the pid may be another program's, and a record written into Redis by
    anyone could name any pid: nothing such is signalled. True when nothing runs under
    ``pid`` (nothing to mistake) or the platform has no ``/proc`` (no way to tell)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except PermissionError:
        return False
    except OSError:  # no such process, or no /proc
        return True
    if not raw:  # a zombie (its group's pid cannot be reused while it is there) or a kernel thread: no
        return True  # environment to read, and nothing a signal would end
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    marker = env.get(INSTANCE_ENV.encode())
    if marker is not None:
        return marker.decode("utf-8", "replace") == instance_id
    visible = env.get(b"CUDA_VISIBLE_DEVICES")  # a spawn before the marker: its GPUs must be the record's
    return bool(gpus) and visible is not None and visible.decode("utf-8", "replace") == ",".join(gpus)


def of_another_user(pid: int) -> bool:
    """True when ``pid`` runs and its environment cannot be read (another Unix user's
    process): :func:`is_instance_process` cannot tell it from an instance's own. A GPU
    worker or observer running as another user than the one that spawned an endpoint
    process must neither signal it nor take it for ended (it would start a second copy on
    its GPUs)."""
    try:
        Path(f"/proc/{pid}/environ").read_bytes()
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def instance_members(leader_pid: int, instance_id: str, gpus: Sequence[str]) -> list[int]:
    """The live processes of the endpoint instance ``instance_id`` under ``leader_pid``: the
    members of its process group or session (:func:`group_members`; the leader alone where
    there is no ``/proc``) that :func:`is_instance_process` takes for the instance's own. A
    record naming the dead leader of another program's session (a daemon whose parent
    exited) names none of that session's processes: they do not carry the instance's id."""
    members = group_members(leader_pid)
    if not members and process_alive(leader_pid):
        members = [leader_pid]
    return [pid for pid in members if is_instance_process(pid, instance_id, gpus)]


__all__ = ["INSTANCE_ENV", "group_members", "instance_members", "is_instance_process", "of_another_user",
           "process_alive"]
