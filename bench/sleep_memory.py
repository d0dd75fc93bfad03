"""Issue 20 bench (c): memory of the bundled endpoint server put to sleep and woken
through the real driver and GPU worker path.

One endpoint ``chat`` runs the bundled endpoint server (``makespan.workers.endpoint_server``,
``--hold-gpu-mib``, ``--sleep-ram-mib``) under the ``process`` driver; a second endpoint
``embed`` (simulated driver) displaces it. Each step is a job leased on the GPU and run
through the GPU worker's phases (:class:`makespan.workers.phases.PhaseRunner`, the code a
GPU worker runs; real Redis, a real subprocess, real HTTP): the evict phase puts chat to
sleep at the level the plan chose (``PhaseContext.sleep_levels``), the start phase wakes it.

Samples after each step — start, sleep level 1, wake, sleep level 2, wake:

* ``nvml_used_mib``: NVML's used memory of the GPU (``nvmlDeviceGetMemoryInfo``) where
  NVML and a GPU are present (then the GPU's real UUID is used and the server holds real
  CUDA memory through torch); None otherwise;
* the server's own accounting (``GET /metrics``): ``gpu_memory_mib`` (what it holds per GPU:
  ``--hold-gpu-mib`` awake, 0 asleep) and ``gpu_memory_allocated`` (1: torch really
  allocated it; 0: the CPU-only emulation's figure), ``sleep_ram_mib`` (the host RAM a
  level-1 sleeper holds);
* ``rss_mib``: the server process's resident set size (psutil), where a level-1 sleeper's
  host RAM shows up.

Run: ``.venv/bin/python bench/sleep_memory.py [--hold-gpu-mib 2048] [--sleep-ram-mib 1024]
[--json OUT]`` (Redis at ``MAKESPAN_REDIS_URL``, default ``redis://127.0.0.1:6379/0``; its
keys go under a private prefix, deleted at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEPS = (("start", "chat", None), ("sleep level 1", "embed", 1), ("wake", "chat", None),
         ("sleep level 2", "embed", 2), ("wake", "chat", None))


def nvml_gpu() -> tuple[str, Any] | None:
    """(UUID, NVML handle) of the first GPU, or None without NVML or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount() < 1:
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        uuid_ = pynvml.nvmlDeviceGetUUID(handle)
        return (uuid_.decode() if isinstance(uuid_, bytes) else uuid_), handle
    except Exception:  # noqa: BLE001 — no library, no driver, no GPU: all mean "no NVML here"
        return None


def _fleet(gpu_uuid: str, hold_gpu_mib: int, sleep_ram_mib: int):
    from makespan.models import FleetSpec

    server = [sys.executable, "-m", "makespan.workers.endpoint_server", "--port", "{port}", "--model", "{model}",
              "--sleep-s", "{sleep_s}", "--wake-s", "{wake_s}", "--hold-gpu-mib", str(hold_gpu_mib),
              "--sleep-ram-mib", str(sleep_ram_mib)]
    return FleetSpec.model_validate({
        "name": "sleep-memory",
        "hosts": [{"name": "host-a", "gpus": [{"uuid": gpu_uuid, "index": 0, "memory_mib": 81920}]}],
        "endpoints": {
            "chat": {"model": "m/chat", "memory_mib_per_gpu": max(hold_gpu_mib, 1024), "cold_start_s": 60,
                     "evict_s": 5, "wake_s": 4, "wake_level2_s": 8, "sleep_host_memory_mib": max(sleep_ram_mib, 1),
                     "launch": {"driver": "process", "command": server, "health_timeout_s": 60}},
            "embed": {"model": "m/embed", "memory_mib_per_gpu": 1024, "cold_start_s": 30, "evict_s": 3,
                      "launch": {"driver": "simulated"}},
        }})


def _metrics(url: str) -> dict[str, float]:
    import httpx

    out = {}
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        name, _, value = line.partition(" ")
        out[name.removeprefix("endpoint_")] = float(value)
    return out


def run(hold_gpu_mib: int, sleep_ram_mib: int, redis_url: str) -> dict[str, Any]:
    """The samples (module doc) and what the run used: {gpu, nvml, samples: [...]}."""
    import psutil

    from makespan.keys import Keys
    from makespan.producer import Producer
    from makespan.redis_conn import connect
    from makespan.settings import Settings
    from makespan.workers.drivers import get_driver
    from makespan.workers.drivers.registry import list_instances
    from makespan.workers.leases import LeaseStore
    from makespan.workers.phases import PhaseContext, PhaseRunner
    from makespan.workers.warm import run_phases

    gpu = nvml_gpu()
    gpu_uuid = gpu[0] if gpu else "GPU-host-a-0"
    prefix = f"bench-sleep-memory-{uuid.uuid4().hex[:8]}"
    settings = Settings(redis_url=redis_url, key_prefix=prefix, time_scale=0.01, lease_ttl_s=10.0, heartbeat_s=0.5)
    fleet = _fleet(gpu_uuid, hold_gpu_mib, sleep_ram_mib)
    r = connect(redis_url)
    keys = Keys(prefix)
    producer, runner = Producer(r, keys, fleet, settings), PhaseRunner(r, settings, fleet)
    samples = []
    try:
        for n, (label, endpoint, level) in enumerate(STEPS, 1):
            job_id = producer.submit({"endpoint": endpoint, "service_s": 1, "priority": "HIGH"}).id
            lease = LeaseStore(r, keys).acquire(f"L{n}", (gpu_uuid,), 30.0, job_id=job_id, kind="job",
                                                         holder="host-a", queue=keys.queue("HIGH"))
            assert lease is not None, "the bench's GPU is free"
            ctx = PhaseContext(f"L{n}", lease.token, [gpu_uuid], "host-a", "job", endpoint, job_id, "HIGH", 1.0,
                               sleep_levels={"chat": level} if level else None)
            outcome = run_phases(runner, ctx)
            [(chat, state)] = [(i, s) for i, s in list_instances(r, keys, with_state=True)
                               if i.endpoint == "chat"]
            server = _metrics(chat.url)
            sample = {"step": label, "job": endpoint, "outcome": outcome, "instance": chat.id, "state": state,
                      "pid": chat.pid, "rss_mib": round(psutil.Process(chat.pid).memory_info().rss / 2**20, 1),
                      "gpu_memory_mib": server.get("gpu_memory_mib"),
                      "gpu_memory_allocated": server.get("gpu_memory_allocated"),
                      "sleep_level": server.get("sleep_level"), "sleep_ram_mib": server.get("sleep_ram_mib"),
                      "nvml_used_mib": None}
            if gpu:
                import pynvml

                sample["nvml_used_mib"] = pynvml.nvmlDeviceGetMemoryInfo(gpu[1]).used // 2**20
            samples.append(sample)
    finally:
        for inst in list_instances(r, keys):
            if inst.driver != "simulated":
                get_driver(inst.driver).stop(inst)
        for key in list(r.scan_iter(f"{prefix}:*", count=1000)):
            r.delete(key)
        r.close()
    return {"gpu": gpu_uuid, "nvml": gpu is not None, "hold_gpu_mib": hold_gpu_mib, "sleep_ram_mib": sleep_ram_mib,
            "samples": samples}


def table(result: dict[str, Any]) -> str:
    """The samples as a markdown table."""
    lines = ["| step | instance state | server's GPU MiB (own accounting) | allocated on a GPU | NVML used MiB "
             "| level | server's host RAM MiB | server RSS MiB |", "|---|---|---|---|---|---|---|---|"]
    for s in result["samples"]:
        nvml = "—" if s["nvml_used_mib"] is None else f"{s['nvml_used_mib']}"
        lines.append(f"| {s['step']} | {s['state']} | {s['gpu_memory_mib']:.0f} | "
                     f"{'yes' if s['gpu_memory_allocated'] else 'no (emulation)'} | {nvml} | {s['sleep_level']:.0f} "
                     f"| {s['sleep_ram_mib']:.0f} | {s['rss_mib']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Issue 20 bench (c): memory of the bundled endpoint server put to sleep and woken through "
        "the real driver and GPU worker path. Where NVML sees no GPU, the figures are the bundled "
        "server's CPU-only emulation (its own accounting and its RSS), and the output says so.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--hold-gpu-mib", type=int, default=2048,
                    help="GPU memory the endpoint server holds while awake, MiB (real CUDA memory with a GPU)")
    ap.add_argument("--sleep-ram-mib", type=int, default=1024,
                    help="host RAM a level-1 sleeper holds, MiB")
    ap.add_argument("--json", type=Path, default=None, help="also write the samples here")
    args = ap.parse_args()
    result = run(args.hold_gpu_mib, args.sleep_ram_mib,
                 os.environ.get("MAKESPAN_REDIS_URL") or "redis://127.0.0.1:6379/0")
    print(f"GPU {result['gpu']}; NVML {'present' if result['nvml'] else 'absent: CPU-only emulation figures'}\n")
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
