"""GPU discovery through a fake NVML (no GPU here) and on a host without the library."""

from __future__ import annotations

import logging
import os

import pytest

from makespan.models import load_fleet
from fake_nvml import FakeGpu, FakeNvml, four_gpu_host
from makespan.workers.discovery import NvmlDiscovery, discover_gpus, gpus_for_host

FLEET = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "render-pipeline.toml")


def test_all_gpus_keyed_by_uuid_with_v2_memory():
    nvml = four_gpu_host()
    gpus = NvmlDiscovery(nvml).discover(use_env=False)
    assert [g.uuid for g in gpus] == [f"GPU-{i:02d}aa-bbbb-cccc" for i in range(4)]
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert all(g.memory_mib == 81559 and g.used_mib == 0 for g in gpus)  # v2: reserved not counted as used
    assert nvml.v2_calls == 4


def test_v1_fallback_when_driver_has_no_v2():
    nvml = FakeNvml([FakeGpu("GPU-old", 16384, used_mib=900)], has_v2=False)
    [g] = NvmlDiscovery(nvml).discover(use_env=False)
    assert g.memory_mib == 16384 and g.used_mib == 900
    assert nvml.v2_calls == 0


@pytest.mark.parametrize("visible", ["2,3", "GPU-02aa-bbbb-cccc,GPU-03aa", "2,GPU-03aa-bbbb-cccc"])
def test_cuda_visible_devices_subset_by_index_or_uuid(monkeypatch, visible):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    specs = discover_gpus(four_gpu_host())
    # physical indices and UUIDs: the same GPUs the lease and the launch name
    assert [(s.uuid, s.index) for s in specs] == [("GPU-02aa-bbbb-cccc", 2), ("GPU-03aa-bbbb-cccc", 3)]


def test_cuda_visible_devices_empty_invalid_and_order():
    d = NvmlDiscovery(four_gpu_host())
    assert d.discover("") == []
    assert [g.index for g in d.discover("3,1")] == [3, 1]
    assert [g.index for g in d.discover("1,9,2")] == [1]  # CUDA stops at the invalid entry
    assert d.discover("GPU-0") == []  # ambiguous prefix names no device


def test_mig_device_reported_as_slices():
    d = NvmlDiscovery(four_gpu_host(mig_on=1))
    gpus = d.discover(use_env=False)
    assert [g.uuid for g in gpus] == ["GPU-00aa-bbbb-cccc", "MIG-1-slice-0", "MIG-1-slice-1",
                                      "GPU-02aa-bbbb-cccc", "GPU-03aa-bbbb-cccc"]
    slices = [g for g in gpus if g.mig_parent]
    assert {g.memory_mib for g in slices} == {16384} and {g.index for g in slices} == {1}
    assert all(g.mig_parent == "GPU-01aa-bbbb-cccc" for g in slices)
    assert [g.uuid for g in d.discover("MIG-1-slice-1")] == ["MIG-1-slice-1"]
    assert [g.uuid for g in d.discover("1")] == ["MIG-1-slice-0", "MIG-1-slice-1"]


def test_no_library_reports_no_gpus_and_falls_back_to_fleet(caplog):
    nvml = FakeNvml([], library_missing=True)
    d = NvmlDiscovery(nvml)
    with caplog.at_level(logging.WARNING, logger="makespan.workers.discovery"):
        assert d.discover(use_env=False) == []
    assert "NVML library not found" in caplog.text and d.last_error
    fleet = load_fleet(FLEET)
    specs = gpus_for_host(fleet, "host-b", nvml=nvml)
    assert [s.uuid for s in specs] == [f"GPU-host-b-{i}" for i in range(4)]
    with pytest.raises(KeyError):
        gpus_for_host(fleet, "host-z", nvml=nvml)


def test_real_pynvml_on_this_host_does_not_crash():
    d = NvmlDiscovery()
    gpus = d.discover(use_env=False)
    if os.path.exists("/dev/nvidiactl"):
        assert all(g.uuid.startswith(("GPU-", "MIG-")) for g in gpus)
    else:  # no driver here: [] and a reason, not an exception
        assert gpus == [] and d.last_error


def test_nvml_initialised_again_in_forked_child():
    nvml = four_gpu_host()
    d = NvmlDiscovery(nvml)
    d.discover(use_env=False)
    d.discover(use_env=False)
    assert nvml.init_calls == 1  # once per process
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the fork hook forgot the parent's NVML state
        try:
            d.discover(use_env=False)
            os.write(wfd, str(nvml.init_calls).encode())
        finally:
            os._exit(0)
    os.close(wfd)
    got = os.read(rfd, 16).decode()
    os.waitpid(pid, 0)
    assert got == "2"
    assert nvml.init_calls == 1  # the parent did not re-initialise
