"""Check a fleet file's host against the GPUs NVML reports, and write a host entry
from them.

The fleet file is the one source of what a GPU worker may lease; this module makes
sure it matches the machine the worker runs on before any lease is taken:

* every GPU the fleet lists for the host must be visible to this process (NVML,
  honouring ``CUDA_VISIBLE_DEVICES``; see :mod:`makespan.workers.discovery`), by UUID;
* its physical NVML index must match the fleet's ``index`` (set points name GPUs
  by index);
* its total memory (MiB) must be at least the fleet's ``memory_mib`` (the fleet's
  promise is what the planner packs against; used memory is not compared, so an
  idle GPU showing a few hundred MiB used still fits). Where NVML cannot report a
  GPU's memory (unified-memory GPUs), the fleet's ``memory_mib`` is taken as given;
  :func:`host_toml` then leaves ``memory_mib`` out with a comment, so the written
  entry fails to load (naming the field) until someone fills it in.

Simulated hosts (``gpu_count`` in the fleet file) are not checked: their UUIDs are
made up. When NVML reports no GPU at all (no driver), nothing can be checked and the
caller decides (the GPU worker logs it and goes on, so CPU-only test fleets run).
"""

from __future__ import annotations

from makespan.models import HostSpec
from makespan.workers.discovery import DiscoveredGpu


def check_host(host: HostSpec, found: list[DiscoveredGpu]) -> list[str]:
    """Problems with ``host`` on this machine (empty: the fleet file matches).

    Args:
        host: the fleet file's host entry.
        found: what :meth:`NvmlDiscovery.discover` returned in this process.
    Returns:
        one message per mismatch, each naming the GPU (UUID and fleet index), the
        fleet's figure and what NVML reported.
    """
    if host.simulated:
        return []  # simulated host
    by_uuid = {g.uuid: g for g in found}
    seen = ", ".join(f"{g.uuid} (index {g.index}, "
                     f"{'unknown' if g.memory_mib is None else g.memory_mib} MiB)" for g in found) or "none"
    problems = []
    for g in host.gpus:
        d = by_uuid.get(g.uuid)
        if d is None:
            problems.append(f"host {host.name!r}: GPU {g.uuid} (fleet index {g.index}) is not visible here "
                            f"(NVML, CUDA_VISIBLE_DEVICES applied, sees: {seen})")
            continue
        if d.index != g.index:
            problems.append(f"host {host.name!r}: GPU {g.uuid} has NVML index {d.index}, the fleet file says "
                            f"index {g.index} (set points name GPUs by index)")
        if d.memory_mib is None:
            continue  # NVML cannot say (d.notes): the fleet file's memory_mib is taken as given
        if d.memory_mib < g.memory_mib:
            problems.append(f"host {host.name!r}: GPU {g.uuid} has {d.memory_mib} MiB, the fleet file promises "
                            f"memory_mib = {g.memory_mib}")
    return problems


SLEEPER_RAM_SHARE = 0.5  # of a host's RAM, the budget makespan gpus proposes for sleepers


def host_memory_mib(meminfo: str = "/proc/meminfo") -> int | None:
    """This host's RAM (``MemTotal``), MiB; None where ``/proc/meminfo`` cannot say."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_toml(name: str, found: list[DiscoveredGpu], ram_mib: int | None = None) -> str:
    """A ``[[hosts]]`` entry for the fleet file listing ``found`` (UUID, physical
    index, total memory in MiB), e.g. for ``makespan gpus --host-name NAME``. With
    ``ram_mib`` (the host's RAM) it proposes ``host_memory_mib``, the RAM level-1 sleepers
    may hold there: SLEEPER_RAM_SHARE of it."""
    lines = ["[[hosts]]", f'name = "{name}"']
    if ram_mib:
        lines.append(f"host_memory_mib = {int(ram_mib * SLEEPER_RAM_SHARE)}  # RAM sleepers may hold: half of this "
                     f"host's {ram_mib} MiB (sleep level 1 keeps weights in RAM); edit to taste")
    lines.append("gpus = [")
    for g in found:
        parts = [g.name] if g.name else []
        if g.mig_parent:
            parts.append(f"MIG slice of {g.mig_parent}")
        note = f"  # {', '.join(parts)}" if parts else ""
        if g.memory_mib is None:  # NVML cannot say: a person must give it
            parts.append("memory_mib unknown to NVML: add memory_mib = <MiB> by hand")
            note = f"  # {', '.join(parts)}"
            lines.append(f'  {{ uuid = "{g.uuid}", index = {g.index} }},{note}')
            continue
        lines.append(f'  {{ uuid = "{g.uuid}", index = {g.index}, memory_mib = {g.memory_mib} }},{note}')
    lines.append("]")
    return "\n".join(lines) + "\n"
