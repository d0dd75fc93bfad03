"""A fake of the pynvml API subset that makespan.workers.discovery uses (no GPU on CI hosts).

Build one with a list of GPUs; a GPU with ``mig`` slices reports MIG mode enabled.
``library_missing=True`` makes ``nvmlInit`` raise like a host without the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

NVML_DEVICE_MIG_ENABLE = 1
nvmlMemory_v2 = 0x02000028
MIB = 1024 * 1024


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 (pynvml's name)
    def __init__(self):
        super().__init__(12)


@dataclass
class FakeGpu:
    uuid: str
    total_mib: int
    used_mib: int = 0
    reserved_mib: int = 0  # v1 'used' includes it, v2 does not
    mig: list[FakeGpu] = field(default_factory=list)


class FakeNvml:
    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVML_DEVICE_MIG_ENABLE = NVML_DEVICE_MIG_ENABLE

    def __init__(self, gpus: list[FakeGpu], library_missing: bool = False, has_v2: bool = True):
        self.gpus = gpus
        self.library_missing = library_missing
        self.init_calls = 0
        self.v2_calls = 0
        if has_v2:
            self.nvmlMemory_v2 = nvmlMemory_v2

    def nvmlInit(self):
        if self.library_missing:
            raise NVMLError_LibraryNotFound()
        self.init_calls += 1

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h):
        return h.uuid

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        if version:
            self.v2_calls += 1
            return SimpleNamespace(total=h.total_mib * MIB, used=h.used_mib * MIB, reserved=h.reserved_mib * MIB,
                                   free=(h.total_mib - h.used_mib - h.reserved_mib) * MIB)
        return SimpleNamespace(total=h.total_mib * MIB, used=(h.used_mib + h.reserved_mib) * MIB,
                               free=(h.total_mib - h.used_mib - h.reserved_mib) * MIB)

    def nvmlDeviceGetMigMode(self, h):
        if not h.mig:
            raise NVMLError(3)  # NOT_SUPPORTED
        return (NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE)

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, j):
        if j >= len(h.mig):
            raise NVMLError(6)  # NOT_FOUND
        return h.mig[j]


def four_gpu_host(mig_on: int | None = None) -> FakeNvml:
    gpus = [FakeGpu(f"GPU-{i:02d}aa-bbbb-cccc", 81559, used_mib=0, reserved_mib=512) for i in range(4)]
    if mig_on is not None:
        gpus[mig_on].mig = [FakeGpu(f"MIG-{mig_on}-slice-{j}", 16384) for j in range(2)]
    return FakeNvml(gpus)


class NVMLError_NotSupported(NVMLError):  # noqa: N801 (pynvml's name)
    def __init__(self):
        super().__init__(3)


class UnifiedMemoryNvml(FakeNvml):
    """A host like DGX Spark / GB10: ``nvmlDeviceGetMemoryInfo`` raises NotSupported on
    the GPUs named in ``no_memory`` (every other call works)."""

    def __init__(self, gpus: list[FakeGpu], no_memory: set[str]):
        super().__init__(gpus)
        self.no_memory = no_memory

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        if h.uuid in self.no_memory:
            raise NVMLError_NotSupported()
        return super().nvmlDeviceGetMemoryInfo(h, version)
