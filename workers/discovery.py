"""GPU discovery through NVML (nvidia-ml-py's ``pynvml`` module), behind a small seam.

:class:`NvmlDiscovery` takes any object with pynvml's functions (tests pass a fake;
the default imports ``pynvml`` lazily) and reports GPUs keyed by UUID:

* ``CUDA_VISIBLE_DEVICES`` is respected as CUDA reads it: unset → every device;
  empty → none; a comma list of indices (``2,3``), GPU UUIDs (``GPU-…``, a unique
  prefix is enough) or MIG UUIDs (``MIG-…``); CUDA stops at the first entry that
  names no device, and so does this.
* ``index`` is the physical NVML index (what the fleet file's set point names), not
  the renumbered CUDA ordinal, so lease, memory check and launch (which sets
  ``CUDA_VISIBLE_DEVICES`` to UUIDs) all name the same physical GPUs.
* memory from ``nvmlDeviceGetMemoryInfo(handle, version=nvmlMemory_v2)`` where the
  driver has it (its ``used`` excludes driver-reserved memory), else the v1 call.
  ``memory_mib`` is the *total*: an idle GPU showing a few hundred MiB used still
  fits what the fleet file promises.
* a GPU in MIG mode is reported as its MIG slices (each with its own ``MIG-`` UUID
  and memory), never as the whole GPU.
* NVML is initialised once per process and again in a forked child
  (``os.register_at_fork``): NVML handles do not survive ``fork``.
* each field is read on its own: a field NVML cannot give for one GPU (``NotSupported``,
  value 3, as ``nvmlDeviceGetMemoryInfo`` on unified-memory GPUs such as the GB10, or
  any other NVML error) is reported unknown for that GPU (``memory_mib``/``used_mib``
  None, ``name`` empty), with a message in :attr:`DiscoveredGpu.notes` and
  :attr:`NvmlDiscovery.warnings`; it never hides the GPU or the host. A GPU whose memory
  is unknown takes its ``memory_mib`` from the fleet file (:func:`gpus_for_host`; a
  clear :class:`makespan.errors.ValidationError` when the fleet file has none). Only a
  GPU whose UUID NVML cannot read is left out (nothing could lease it), with a message.
* no NVML library (``NVMLError_LibraryNotFound``, value 12), no ``pynvml`` module,
  or an NVML error that stops the listing itself (``nvmlInit``, ``nvmlDeviceGetCount``):
  an empty list and one clear log line, never a crash; :func:`gpus_for_host` then falls
  back to the fleet file's GPUs.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from makespan.errors import ValidationError
from makespan.models import FleetSpec, GpuSpec

log = logging.getLogger(__name__)

NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
_MIB = 1024 * 1024
_live: weakref.WeakSet[NvmlDiscovery] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for d in list(_live):
        d._initialised_pid = None


os.register_at_fork(after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class DiscoveredGpu:
    """One GPU or MIG slice as NVML reports it.

    Attributes:
        uuid: ``GPU-…`` or ``MIG-…``; index: physical NVML index (a slice: its parent's).
        memory_mib / used_mib: total and used memory (MiB); None: NVML could not say
            (see ``notes``).
        name: product name ('' when NVML could not say); mig_parent: the parent GPU's
            UUID for a MIG slice.
        notes: one message per field NVML could not report for this GPU.
    """

    uuid: str
    memory_mib: int | None
    index: int
    name: str = ""
    used_mib: int | None = 0
    mig_parent: str | None = None
    notes: tuple[str, ...] = ()

    def to_spec(self, memory_mib: int | None = None) -> GpuSpec:
        """A :class:`GpuSpec`; ``memory_mib`` (MiB, e.g. the fleet file's) is used when
        NVML could not report it.

        Raises:
            ValidationError: the memory is unknown and no ``memory_mib`` is given."""
        mem = self.memory_mib if self.memory_mib is not None else memory_mib
        if mem is None:
            raise ValidationError(f"gpus.{self.uuid}.memory_mib", None,
                                  "NVML cannot report this GPU's memory (" + "; ".join(self.notes) +
                                  "): give memory_mib for it in the fleet file")
        return GpuSpec(uuid=self.uuid, memory_mib=mem, index=self.index)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlDiscovery:
    """Discover GPUs through ``nvml`` (the pynvml module or a fake with its API)."""

    def __init__(self, nvml: Any = None):
        self._nvml = nvml
        self._initialised_pid: int | None = None
        self._lock = threading.Lock()
        self.last_error: str | None = None
        self.warnings: list[str] = []  # per-field messages of the last discover()
        _live.add(self)

    def _module(self) -> Any:
        if self._nvml is None:
            import pynvml  # nvidia-ml-py

            self._nvml = pynvml
        return self._nvml

    def _ensure_init(self, nvml: Any) -> None:
        with self._lock:
            if self._initialised_pid != os.getpid():
                nvml.nvmlInit()
                self._initialised_pid = os.getpid()

    def discover(self, visible: str | None = None, use_env: bool = True) -> list[DiscoveredGpu]:
        """GPUs this process may use. ``visible`` overrides ``CUDA_VISIBLE_DEVICES``
        (read from the environment when ``use_env`` and ``visible`` is None).
        Returns [] (and sets :attr:`last_error`) when NVML is unavailable."""
        if visible is None and use_env:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        try:
            nvml = self._module()
        except ImportError as e:
            return self._none(f"GPU discovery: the pynvml module (nvidia-ml-py) is not installed ({e}); "
                              "reporting no GPUs")
        self.warnings = []
        try:
            self._ensure_init(nvml)
            devices = self._all_devices(nvml)
        except Exception as e:  # NVMLError and its generated subclasses
            if getattr(e, "value", None) == NVML_ERROR_LIBRARY_NOT_FOUND:
                return self._none("GPU discovery: NVML library not found (no NVIDIA driver on this host); "
                                  "reporting no GPUs")
            if not isinstance(e, getattr(nvml, "NVMLError", ())):
                raise
            return self._none(f"GPU discovery: NVML failed ({e}); reporting no GPUs")
        self.last_error = None
        return _select(devices, visible)

    def _none(self, msg: str) -> list[DiscoveredGpu]:
        self.last_error = msg
        log.warning(msg)
        return []

    def _field(self, nvml: Any, what: str, label: str, fn, *args) -> tuple[Any, str | None]:
        """``fn(*args)``, or (None, message) when NVML raises for this field alone."""
        try:
            return fn(*args), None
        except Exception as e:
            if not isinstance(e, getattr(nvml, "NVMLError", ())):
                raise
            why = "not supported" if getattr(e, "value", None) == NVML_ERROR_NOT_SUPPORTED else str(e)
            msg = f"GPU discovery: {label}: NVML cannot report {what} ({why}); reported unknown"
            self.warnings.append(msg)
            log.warning(msg)
            return None, msg

    def _memory(self, nvml: Any, handle: Any, label: str) -> tuple[int | None, int | None, str | None]:
        """(total MiB, used MiB, message): both None with a message when NVML cannot say."""
        v2 = getattr(nvml, "nvmlMemory_v2", None)
        info = None
        if v2 is not None:
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=v2)
            except (TypeError, getattr(nvml, "NVMLError", TypeError)):
                info = None  # an older driver without the v2 entry point (or no memory info: tried below)
        if info is None:
            info, msg = self._field(nvml, "its memory (nvmlDeviceGetMemoryInfo)", label,
                                    nvml.nvmlDeviceGetMemoryInfo, handle)
            if info is None:
                return None, None, msg
        return int(info.total) // _MIB, int(info.used) // _MIB, None

    def _all_devices(self, nvml: Any) -> list[tuple[DiscoveredGpu, list[DiscoveredGpu]]]:
        """Every physical GPU with its MIG slices (empty list when MIG is off). A GPU
        whose handle or UUID NVML cannot give is left out (with a warning)."""
        out = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h, _ = self._field(nvml, "its handle", f"GPU index {i}", nvml.nvmlDeviceGetHandleByIndex, i)
            uuid = None if h is None else self._field(nvml, "its UUID; left out", f"GPU index {i}",
                                                      nvml.nvmlDeviceGetUUID, h)[0]
            if uuid is None:
                continue
            uuid = _text(uuid)
            label = f"GPU {uuid} (index {i})"
            total, used, mem_note = self._memory(nvml, h, label)
            name, name_note = ("", None)
            if hasattr(nvml, "nvmlDeviceGetName"):
                name, name_note = self._field(nvml, "its name", label, nvml.nvmlDeviceGetName, h)
            notes = tuple(n for n in (mem_note, name_note) if n)
            gpu = DiscoveredGpu(uuid, total, i, _text(name) if name else "", used, notes=notes)
            out.append((gpu, self._mig_slices(nvml, h, gpu)))
        return out

    def _mig_slices(self, nvml: Any, handle: Any, parent: DiscoveredGpu) -> list[DiscoveredGpu]:
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except Exception as e:
            if isinstance(e, getattr(nvml, "NVMLError", ())):
                return []  # not MIG-capable
            raise
        if current != getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return []
        slices = []
        for j in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
            except Exception as e:
                if isinstance(e, getattr(nvml, "NVMLError", ())):
                    continue  # no slice configured at this position
                raise
            uuid, _ = self._field(nvml, "a MIG slice's UUID; left out", f"GPU {parent.uuid} slice {j}",
                                  nvml.nvmlDeviceGetUUID, mh)
            if uuid is None:
                continue
            total, used, note = self._memory(nvml, mh, f"MIG slice {_text(uuid)}")
            slices.append(DiscoveredGpu(_text(uuid), total, parent.index, parent.name, used, parent.uuid,
                                        notes=(note,) if note else ()))
        return slices


def _select(devices: list[tuple[DiscoveredGpu, list[DiscoveredGpu]]], visible: str | None) -> list[DiscoveredGpu]:
    def expand(gpu: DiscoveredGpu, slices: list[DiscoveredGpu]) -> list[DiscoveredGpu]:
        return slices if slices else [gpu]

    if visible is None:
        return [g for gpu, sl in devices for g in expand(gpu, sl)]
    out: list[DiscoveredGpu] = []
    for token in (t.strip() for t in visible.split(",")):
        found: list[DiscoveredGpu] = []
        if token.isdigit():
            idx = int(token)
            found = expand(*devices[idx]) if idx < len(devices) else []
        elif token.startswith("MIG-"):
            found = [s for _, sl in devices for s in sl if s.uuid == token]
        elif token.startswith("GPU-"):
            matches = [(g, sl) for g, sl in devices if g.uuid.startswith(token)]
            found = expand(*matches[0]) if len(matches) == 1 else []
        if not found:
            break  # CUDA ignores the rest of the list after an invalid entry
        out.extend(g for g in found if g not in out)
    return out


def discover_gpus(nvml: Any = None, visible: str | None = None) -> list[GpuSpec]:
    """This host's GPUs as :class:`GpuSpec` records ([] without NVML).

    Raises:
        ValidationError: NVML cannot report a GPU's memory (use :func:`gpus_for_host`,
            which takes it from the fleet file)."""
    return [g.to_spec() for g in NvmlDiscovery(nvml).discover(visible)]


def gpus_for_host(fleet: FleetSpec, host: str, nvml: Any = None, visible: str | None = None) -> list[GpuSpec]:
    """Discovered GPUs of this host, or the fleet file's GPUs for ``host`` when NVML
    reports none (no driver, simulated fleets). A discovered GPU whose memory NVML
    cannot report takes ``memory_mib`` from the fleet file's entry with its UUID.

    Raises:
        KeyError: ``host`` is not in the fleet and NVML found no GPU.
        ValidationError: a GPU's memory is unknown to NVML and the fleet file does not
            list that GPU (field ``gpus.<uuid>.memory_mib``).
    """
    found = NvmlDiscovery(nvml).discover(visible)
    listed = {g.uuid: g for h in fleet.hosts if h.name == host for g in h.gpus}
    if found:
        return [g.to_spec(listed[g.uuid].memory_mib if g.uuid in listed else None) for g in found]
    for h in fleet.hosts:
        if h.name == host:
            log.info("GPU discovery: using the fleet file's %d GPUs for host %s", len(h.gpus), host)
            return list(h.gpus)
    raise KeyError(f"host {host!r} is not in fleet {fleet.name!r} and NVML found no GPU")
