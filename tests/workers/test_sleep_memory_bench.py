"""Issue 20 bench (c) (bench/sleep_memory.py) as a test: the bundled endpoint server put to
sleep at level 1 and level 2 and woken through the process driver and the GPU worker's
phases (real Redis, a real subprocess, real HTTP) releases what it holds and takes it
back. Without a GPU the figures are the CPU-only emulation's own accounting and the
server's RSS (a level-1 sleeper's host RAM is resident memory of the process)."""

from __future__ import annotations

import pytest

HOLD_GPU_MIB, SLEEP_RAM_MIB = 256, 128


def test_sleep_releases_memory_and_wake_takes_it_back(redis_url):
    pytest.importorskip("bench.sleep_memory")
    from bench.sleep_memory import run, table

    result = run(HOLD_GPU_MIB, SLEEP_RAM_MIB, redis_url)
    samples = result["samples"]
    assert [s["step"] for s in samples] == ["start", "sleep level 1", "wake", "sleep level 2", "wake"]
    assert all(s["outcome"] == "completed" for s in samples)
    assert len({s["instance"] for s in samples}) == 1  # woken in place: one instance, one process
    assert [s["state"] for s in samples] == ["running", "asleep", "running", "asleep", "running"]
    assert [s["sleep_level"] for s in samples] == [0, 1, 0, 2, 0]
    assert [s["gpu_memory_mib"] for s in samples] == [HOLD_GPU_MIB, 0, HOLD_GPU_MIB, 0, HOLD_GPU_MIB]
    assert [s["sleep_ram_mib"] for s in samples] == [0, SLEEP_RAM_MIB, 0, 0, 0]
    start, level1, woken, level2, _ = (s["rss_mib"] for s in samples)
    assert level1 >= start + 0.9 * SLEEP_RAM_MIB  # the level-1 sleeper's weights are resident host RAM
    assert woken < level1 - 0.9 * SLEEP_RAM_MIB and level2 < level1 - 0.9 * SLEEP_RAM_MIB
    if result["nvml"]:  # a GPU: NVML sees the memory released on sleep and back on wake
        used = [s["nvml_used_mib"] for s in samples]
        assert used[1] <= used[0] - 0.9 * HOLD_GPU_MIB and used[2] >= used[1] + 0.9 * HOLD_GPU_MIB
    assert "sleep level 2" in table(result)
