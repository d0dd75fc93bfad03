"""Bench (b) of issue 21: CRITICAL submit → first phase started, live, with the critical
lane (:mod:`makespan.workers.critical_lane`) on and off.

Run: ``.venv/bin/python -m bench.critical_latency [--gpus 8,512] [--samples 30] [--lanes on,off]``
(without ``--redis-url`` it starts a private redis-server).

The fleet: host ``host-w`` (4 GPUs of 16 GiB) where the ``urgent`` endpoint (TP 1) is at the
set point on GPU 0, and ``(gpus - 4) / 8`` hosts of 80 GiB GPUs for the ``bulk`` endpoint
(TP 1, 40 GiB per GPU: it never fits on ``host-w``). One real planner process and one real
Celery GPU worker process, for ``host-w``; the other hosts are simulated by leases the
bench holds on every one of their GPUs (kind ``hold``, never renewed within the run's lease
TTL), so no GPU worker serves them and nothing of ``bulk`` ever starts.

Per fleet size and lane setting, two loads:

* ``idle``: nothing queued; each sample submits one CRITICAL ``urgent`` job and waits for it
  to complete (a warm instance stays on GPU 0).
* ``tick``: 256 LOW ``bulk`` jobs queued (the batch size): the planner re-plans that batch
  of 256 every tick, back to back (each tick ends with nothing started, and every
  ``planner_tick_s`` or submit wakes the next); each sample waits a random 0–300 ms, then
  submits a CRITICAL job, which therefore arrives at a random point of a tick.

A sample's latency is the first ``phase_start`` event of the job minus its ``submitted``
event (both on this host's clock). It prints p50/p95/max per case, the share of samples the
lane placed while a tick ran (its event's ``during_tick``), the lane's own placement time,
and the planner's solve time per tick (``P:planner:solve_s``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from makespan import events as ev
from makespan.keys import Keys
from makespan.live import LiveSystem, delete_prefix, wait_for
from makespan.models import load_fleet
from makespan.producer import Producer
from makespan.redis_conn import connect, start_embedded
from makespan.settings import Settings
from makespan.workers.leases import LeaseStore
from makespan.workers.phases import instance_value

WARM_HOST = "host-w"
BULK_BATCH = 256
HOLD_TTL_S = 3600.0


def fleet_toml(gpus: int) -> str:
    """The bench fleet (module doc) with ``gpus`` GPUs in all (4 on host-w, the rest 8 per host)."""
    big = max(gpus - 4, 4)
    hosts = [f'[[hosts]]\nname = "{WARM_HOST}"\ngpu_count = 4\nmemory_mib = 16384\n']
    for n in range(0, big, 8):
        hosts.append(f'[[hosts]]\nname = "sim-{n // 8}"\ngpu_count = {min(8, big - n)}\nmemory_mib = 81920\n')
    return ('name = "critical-latency"\n' + "".join(hosts)
            + '[endpoints.urgent]\nmodel = "urgent"\ntensor_parallel = 1\nmemory_mib_per_gpu = 6000\n'
              f'cold_start_s = 30\nevict_s = 3\nslots = 8\nset_point = [{{ host = "{WARM_HOST}", gpus = [0] }}]\n'
            + '[endpoints.bulk]\nmodel = "bulk"\ntensor_parallel = 1\nmemory_mib_per_gpu = 40000\n'
              'cold_start_s = 60\nevict_s = 5\nslots = 8\n')


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 1) if values else None


def _job_times(r, keys: Keys, job_ids: set[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {job_id: {} for job_id in job_ids}
    for e in ev.read_all(r, keys.events):
        rec = out.get(e.get("job", ""))
        if rec is None:
            continue
        if e["kind"] == "submitted":
            rec["submitted"] = e["ts"]
        elif e["kind"] == "phase_start" and "phase" not in rec:
            rec["phase"], rec["first_phase"] = e["ts"], e.get("phase")
        elif e["kind"] == "critical_lane":
            rec["lane"] = e
        elif e["kind"] == "leased":
            rec.setdefault("leased", e["ts"])
    return out


def _hold_simulated_hosts(r, keys: Keys, fleet) -> int:
    """Lease every GPU of the simulated hosts to the bench (kind ``hold``)."""
    leases = LeaseStore(r, keys)
    held = 0
    for host in fleet.hosts:
        if host.name == WARM_HOST:
            continue
        gpus = tuple(gpu.uuid for gpu in host.gpus)
        if leases.acquire(f"hold-{host.name}", gpus, HOLD_TTL_S, kind="hold", holder=host.name) is None:
            raise RuntimeError(f"could not hold {host.name}")
        held += len(gpus)
    return held


def _sample(r, keys: Keys, prod: Producer, pause_s: float) -> str:
    time.sleep(pause_s)
    job_id = prod.submit({"endpoint": "urgent", "service_s": 1, "priority": "CRITICAL"}).id
    wait_for(lambda: r.hget(keys.job(job_id), "state") == "completed", 120, f"CRITICAL job {job_id}", 0.005)
    return job_id


def run_case(base: Settings, gpus: int, lane: bool, samples: int, workdir: Path) -> list[dict[str, Any]]:
    """Both loads (module doc) on a fresh system of ``gpus`` GPUs; one row per load."""
    fleet_path = workdir / f"fleet-{gpus}.toml"
    fleet_path.write_text(fleet_toml(gpus))
    fleet = load_fleet(fleet_path)
    settings = replace(base, key_prefix=f"bench-cl-{uuid.uuid4().hex[:8]}", critical_lane=lane)
    keys = Keys(settings.key_prefix)
    r = connect(settings.redis_url)
    system = LiveSystem(fleet_path, fleet, settings, workdir / f"logs-{gpus}-{lane}", observer=False)
    rows = []
    try:
        system.start_gpu_worker(WARM_HOST)
        system.start_planner()
        system.wait_workers(180, hosts=[WARM_HOST])
        warm_gpu = fleet.hosts[0].gpus[0].uuid
        wait_for(lambda: r.get(keys.resident(warm_gpu)) == instance_value("urgent", [warm_gpu]), 120,
                 "the urgent set point", 0.1)
        wait_for(lambda: not r.zcard(keys.leases), 60, "the restores to end", 0.1)
        held = _hold_simulated_hosts(r, keys, fleet)
        prod = Producer(r, keys, fleet, settings)
        rng = random.Random(gpus)
        for load in ("idle", "tick"):
            if load == "tick":
                for _ in range(BULK_BATCH):
                    prod.submit({"endpoint": "bulk", "service_s": 600, "priority": "LOW"})
                r.delete(keys.planner_solve_times)
                wait_for(lambda: any(x.endswith(f":{BULK_BATCH}") for x in r.lrange(keys.planner_solve_times, 0, -1)),
                         300, "a tick of the full batch", 0.05)
            ids = [_sample(r, keys, prod, rng.uniform(0.0, 0.3) if load == "tick" else 0.02) for _ in range(samples)]
            times = _job_times(r, keys, set(ids))
            lat_ms = [(times[j]["phase"] - times[j]["submitted"]) * 1000.0 for j in ids]
            lanes = [times[j].get("lane") or {} for j in ids]
            solves = [float(x.split(":")[0]) * 1000.0 for x in r.lrange(keys.planner_solve_times, 0, -1)
                      if x.endswith(f":{BULK_BATCH}")]
            rows.append({
                "gpus": len(fleet.gpu_uuids()), "held": held, "lane": lane, "load": load, "samples": len(ids),
                "p50_ms": round(_pct(lat_ms, 0.5), 1), "p95_ms": round(_pct(lat_ms, 0.95), 1),
                "max_ms": round(max(lat_ms), 1),
                "by_lane": sum(1 for e in lanes if e.get("outcome") in ("warm", "cold_start", "preempted")),
                "during_tick": sum(1 for e in lanes if e.get("during_tick")),
                "lane_place_ms_p50": round(statistics.median([e["took_ms"] for e in lanes if "took_ms" in e]), 1)
                if any("took_ms" in e for e in lanes) else None,
                "lane_read_ms_p50": _median([e["read_ms"] for e in lanes if "read_ms" in e]),
                "lane_chosen_ms_p50": _median([e["chosen_ms"] for e in lanes if "chosen_ms" in e]),
                "tick_solve_ms_p50": round(statistics.median(solves), 1) if solves else None,
                "outcomes": sorted({e.get("outcome", "-") for e in lanes}),
            })
            print(json.dumps(rows[-1]), flush=True)
    finally:
        system.stop()
        delete_prefix(r, keys)
        r.close()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| GPUs | lane | load | samples | p50 ms | p95 ms | max ms | placed by lane | of them during a tick "
            "| lane: read / chosen / sent p50 ms | tick solve p50 ms (256 jobs) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    return head + "".join(
        f"| {x['gpus']} | {'on' if x['lane'] else 'off'} | {x['load']} | {x['samples']} | {x['p50_ms']} | "
        f"{x['p95_ms']} | {x['max_ms']} | {x['by_lane']} | {x['during_tick']} | "
        f"{x.get('lane_read_ms_p50')} / {x.get('lane_chosen_ms_p50')} / {x['lane_place_ms_p50']} | "
        f"{x['tick_solve_ms_p50']} |\n" for x in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", default="8,512")
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--lanes", default="on,off")
    ap.add_argument("--redis-url", default=None, help="default: a private embedded redis-server")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    embedded = None if args.redis_url else start_embedded()
    url = args.redis_url or embedded.url  # type: ignore[union-attr]
    base = Settings.from_env(redis_url=url, time_scale=0.01, lease_ttl_s=30.0, heartbeat_s=2.0)
    os.environ.setdefault("MAKESPAN_LOG_LEVEL", "WARNING")
    rows: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="critical-latency-") as tmp:
            for gpus in (int(x) for x in args.gpus.split(",")):
                for lane in (x.strip() == "on" for x in args.lanes.split(",")):
                    rows += run_case(base, gpus, lane, args.samples, Path(tmp))
    finally:
        if embedded is not None:
            embedded.stop()
    print(table(rows))
    print(f"load average: {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
