"""Issue 18, failure 6: one unsupported NVML call must not hide the host.

A fake NVML whose ``nvmlDeviceGetMemoryInfo`` raises NotSupported (unified-memory GPUs
such as the GB10) on one or every GPU, every other call working.
"""

from __future__ import annotations

import logging

import pytest
from fake_nvml import FakeGpu, UnifiedMemoryNvml

from makespan.errors import ValidationError
from makespan.models import FleetSpec, GpuSpec, HostSpec
from makespan.workers.discovery import NvmlDiscovery, discover_gpus, gpus_for_host
from makespan.workers.host_check import check_host, host_toml


def _host(no_memory: set[str]) -> UnifiedMemoryNvml:
    return UnifiedMemoryNvml([FakeGpu("GPU-gb10-0000", 0), FakeGpu("GPU-h100-0001", 81559)], no_memory)


def _fleet(gpus: tuple[GpuSpec, ...]) -> FleetSpec:
    """A fleet of one host ``spark-1`` (only its hosts matter to discovery)."""
    return FleetSpec.model_construct(name="spark", hosts=(HostSpec(name="spark-1", gpus=gpus),), endpoints={})


def test_unsupported_memory_is_unknown_for_that_gpu_only(caplog):
    d = NvmlDiscovery(_host({"GPU-gb10-0000"}))
    with caplog.at_level(logging.WARNING):
        gpus = d.discover(use_env=False)
    assert [g.uuid for g in gpus] == ["GPU-gb10-0000", "GPU-h100-0001"]  # the host is not lost
    gb10, h100 = gpus
    assert gb10.memory_mib is None and gb10.used_mib is None
    assert gb10.name == "NVIDIA H100 80GB HBM3"  # the other fields are still read
    assert h100.memory_mib == 81559
    assert len(gb10.notes) == 1 and "GPU-gb10-0000" in gb10.notes[0] and "not supported" in gb10.notes[0]
    assert d.warnings == list(gb10.notes) and gb10.notes[0] in caplog.text
    assert d.last_error is None


def test_memory_comes_from_the_fleet_file():
    fleet_gpus = (GpuSpec(uuid="GPU-gb10-0000", memory_mib=122_880, index=0),
                  GpuSpec(uuid="GPU-h100-0001", memory_mib=80_000, index=1))
    fleet = _fleet(fleet_gpus)
    specs = gpus_for_host(fleet, "spark-1", nvml=_host({"GPU-gb10-0000", "GPU-h100-0001"}), visible=None)
    assert [(s.uuid, s.memory_mib) for s in specs] == [("GPU-gb10-0000", 122_880), ("GPU-h100-0001", 80_000)]
    host = HostSpec(name="spark-1", gpus=fleet_gpus)
    found = NvmlDiscovery(_host({"GPU-gb10-0000"})).discover(use_env=False)
    assert check_host(host, found) == []  # the worker's fleet check runs, and passes


def test_unknown_memory_without_a_fleet_value_is_a_clear_error():
    fleet = _fleet((GpuSpec(uuid="GPU-h100-0001", memory_mib=80_000, index=1),))
    with pytest.raises(ValidationError) as ei:
        gpus_for_host(fleet, "spark-1", nvml=_host({"GPU-gb10-0000"}), visible=None)
    assert ei.value.field == "gpus.GPU-gb10-0000.memory_mib" and "fleet file" in str(ei.value)
    with pytest.raises(ValidationError):
        discover_gpus(_host({"GPU-gb10-0000"}), visible=None)


def test_host_entry_asks_for_the_unknown_memory():
    found = NvmlDiscovery(_host({"GPU-gb10-0000"})).discover(use_env=False)
    text = host_toml("spark-1", found)
    assert '{ uuid = "GPU-gb10-0000", index = 0 },' in text and "add memory_mib" in text
    assert '{ uuid = "GPU-h100-0001", index = 1, memory_mib = 81559 }' in text
