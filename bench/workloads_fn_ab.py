"""Workload DAGs of user functions: makespan's DAG scheduling vs a per-step barrier, paired A/B,
at the evidence standard of the DataDesigner scheduler PR.

``nice -n 5 python -m bench.workloads_fn_ab [--pairs 8] [--records 1000] [--load-gate 2.5] [--gate-wait-s 10]
[--only CELLS] [--out bench-fn-ab.json]``

Valid by design: every endpoint answers a request after a fixed 400 ms, so the per-request
overhead of the path (a request lease in Redis taken and given back, the HTTP round trip,
the endpoint server's thread: a few ms) is about 1 % of a request's service time and the
planned service (⌈requests / slots⌉ × 400 ms) holds within the 5 % dilation gate while the
machine has the CPU for it; the caps (64, 32, 64 slots) keep the request rate at 160 req/s
per endpoint at most, at most 400 req/s when steps overlap, so that a run of 10,000
requests lasts 44-75 s (the ≥ 8 s gate holds with room). On a machine whose CPU is taken by
others the dilation gate or the load gate says so (the cell is printed INVALID).

Every step is a call of the workload function ``bench.step`` (:mod:`bench.fn_steps`) that
sends ``per_record`` OpenAI-compatible requests per record through ``ctx.requests`` to
its endpoint (real bundled endpoint-server processes with a fixed latency, under the
endpoint's concurrency cap) and returns the step's records; a step's records are the
result of the steps it depends on (passed as ``Job`` arguments, so the DAG's edges are
the jobs' dependencies).

* A = makespan: the whole DAG is submitted at once (``client.submit`` with Job
  arguments); a step starts when its own dependencies complete.
* B = barrier: the steps one at a time in topological order; each is submitted after the
  previous one's result came back.
* control = no scheduler: the same requests sent straight to the endpoint instances
  (already running) by the same sender as ``ctx.requests``, a step as soon as its
  dependencies ended (a perfect DAG executor without makespan): the achievable wall time
  and utilization on this machine.

Evidence gates per cell (a cell failing one is printed INVALID with the reason):
≥ ``--records`` records (1,000) and ≥ 10,000 model requests per run, ≥ 8 s wall,
planned/actual service dilation ≤ 5 % (per step: actual execute time ÷ the ideal
⌈requests / slots⌉ × latency, median over steps and runs), the 1-minute load average
≤ ``--load-gate`` before each pair (otherwise the bench waits for it, up to 120 s, and
marks the pair), and ≥ 8 ABBA pairs with a paired 95 % interval on log(A/B).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.workloads_ab import ratio_ci, topo  # the same topological order and paired interval

FLEET_TOML = """
name = "bench-fn-ab"
[[hosts]]
name = "h0"
gpu_count = 4
memory_mib = 81920
{endpoints}
"""
# endpoint -> (latency ms, slots): the service time of a request dominates its overhead (module doc)
ENDPOINTS = {"gen": (400.0, 64), "judge": (400.0, 32), "embed": (400.0, 64)}
# cell -> [(step, endpoint, requests per record, deps)]; each cell: 10 requests per record
CELLS: dict[str, list[tuple[str, str, int, tuple[str, ...]]]] = {
    "fork/fan-in": [("s", "gen", 2, ()), ("x", "judge", 1, ("s",)), ("y", "embed", 4, ("s",)), ("z", "gen", 2, ("s",)),
                    ("t", "embed", 1, ("x", "y", "z"))],
    "diamond": [("a", "gen", 3, ()), ("b", "judge", 1, ("a",)), ("c", "embed", 4, ("a",)), ("d", "gen", 2, ("b", "c"))],
    "bottleneck": [("j", "judge", 2, ()), ("g", "gen", 4, ()), ("e", "embed", 3, ("g",)), ("f", "gen", 1, ("j", "e"))],
    "linear": [("a", "gen", 4, ()), ("b", "judge", 1, ("a",)), ("c", "embed", 5, ("b",))],
}


def fleet_toml() -> str:
    eps = []
    for name, (lat, slots) in ENDPOINTS.items():
        eps.append(f'[endpoints.{name}]\nmodel = "{name}"\nmemory_mib_per_gpu = 20000\ncold_start_s = 10\nevict_s = 1\n'
                   f'slots = {slots}\nlaunch = {{ driver = "process", command = ["{{python}}", "-m", '
                   f'"makespan.workers.endpoint_server", "--port", "{{port}}", "--model", "{{model}}", '
                   f'"--load-time-s", "{{load_time_s}}", "--latency-ms", "{lat:g}"] }}\n')
    return FLEET_TOML.format(endpoints="\n".join(eps))


def ideal_s(endpoint: str, requests: int) -> float:
    lat, slots = ENDPOINTS[endpoint]
    return math.ceil(requests / slots) * lat / 1000.0


class Bench:
    """A live system (planner + GPU worker loading bench.fn_steps) on a private prefix."""

    def __init__(self, workdir: Path):
        import makespan
        from makespan.live import LiveSystem, wait_for
        from makespan.models import load_fleet
        from makespan.settings import Settings

        workdir.mkdir(parents=True, exist_ok=True)
        self.fleet_path = workdir / "fleet.toml"
        self.fleet_path.write_text(fleet_toml())
        self.fleet = load_fleet(self.fleet_path)
        self.settings = Settings.from_env(key_prefix=f"bench-fnab-{uuid.uuid4().hex[:6]}", time_scale=1.0,
                                          lease_ttl_s=10.0, heartbeat_s=2.0, planner_tick_s=0.02, batch_wait_s=0.01,
                                          workload_modules="bench.fn_steps", result_max_bytes=8 * 1024 * 1024)
        self.system = LiveSystem(self.fleet_path, self.fleet, self.settings, workdir / "logs", observer=False)
        self.system.start()
        self.client = makespan.connect(self.settings.redis_url, key_prefix=self.settings.key_prefix)
        wait_for(lambda: self.client.r.exists(self.client.keys.fn_live("bench.step")), 60, "bench.step to be published")

    def close(self) -> None:
        from makespan.live import delete_prefix

        self.system.stop()
        delete_prefix(self.client.r, self.client.keys)

    def _submit(self, step, inputs, records: int):
        name, ep, per_record, _deps = step
        return self.client.submit("bench.step", name, per_record, records, *inputs, endpoint=ep,
                                  service_s=ideal_s(ep, per_record * records))

    def run(self, cell: str, mode: str, records: int) -> dict[str, Any]:
        steps = CELLS[cell]
        t0 = time.time()
        jobs: dict[str, Any] = {}
        if mode == "A":
            for step in topo(steps):
                jobs[step[0]] = self._submit(step, [jobs[d] for d in step[3]], records)
            outs = {name: job.result(timeout_s=1800) for name, job in jobs.items()}
        else:
            outs = {}
            for step in topo(steps):  # the same Job arguments; each submitted once the previous one ended
                jobs[step[0]] = self._submit(step, [jobs[d] for d in step[3]], records)
                outs[step[0]] = jobs[step[0]].result(timeout_s=1800)
        wall = time.time() - t0
        dilation, busy = [], 0.0
        for name, ep, per_record, _ in steps:
            out = outs[name]
            dilation.append(out["execute_s"] / ideal_s(ep, per_record * records))
            busy += out["requests"] * ENDPOINTS[ep][0] / 1000.0
        return {"wall_s": wall, "requests": sum(o["requests"] for o in outs.values()),
                "records": min(len(o["records"]) for o in outs.values()), "dilation": statistics.median(dilation),
                "slot_util": busy / (wall * sum(s for _, s in ENDPOINTS.values()))}

    def control(self, cell: str, records: int) -> dict[str, Any]:
        """The same requests straight to the running instances, with no scheduler: each step
        in a thread of this process as soon as its dependencies ended, through the same
        request sender as ``ctx.requests`` (:class:`makespan.workers.requests.RequestRunner`,
        the endpoint's cap shared by request leases), in one process as on the GPU worker."""
        from makespan.workers.drivers.registry import list_instances
        from makespan.workers.requests import RequestRunner

        running = {i.endpoint: i for i in list_instances(self.client.r, self.client.keys) if i.url}
        missing = set(ENDPOINTS) - set(running)
        if missing:
            raise RuntimeError(f"control needs running instances of {sorted(missing)} (run A/B first)")
        steps = CELLS[cell]
        done: dict[str, float] = {}
        failed: list[str] = []  # a step that raised: the steps after it stop waiting (the cell fails)
        t0 = time.time()

        def run_step(step) -> None:
            name, ep, per_record, deps = step
            while not all(d in done for d in deps):
                if failed:
                    raise RuntimeError(f"control step {name}: step {failed[0]} failed")
                time.sleep(0.005)
            inst, job = running[ep], f"control-{uuid.uuid4().hex[:8]}"
            try:
                RequestRunner(self.client.r, self.client.keys, inst.id, inst.url or "", ep, ENDPOINTS[ep][1]).run(
                    job, {"requests": per_record * records, "prompt": f"{name}:{{i}}", "max_tokens": 8})
            except Exception:
                failed.append(name)
                raise
            finally:
                self.client.r.delete(self.client.keys.requests(job))
            done[name] = time.time()
        with ThreadPoolExecutor(max_workers=len(steps)) as outer:
            list(outer.map(run_step, topo(steps)))
        wall = time.time() - t0
        busy = sum(per_record * records * ENDPOINTS[ep][0] / 1000.0 for _, ep, per_record, _ in steps)
        return {"wall_s": wall, "slot_util": busy / (wall * sum(s for _, s in ENDPOINTS.values()))}


def wait_load(gate: float, timeout_s: float = 10.0) -> tuple[float, bool]:
    """Wait (up to ``timeout_s``) for the 1-minute load average to drop to ``gate``."""
    deadline = time.monotonic() + timeout_s
    while os.getloadavg()[0] > gate and time.monotonic() < deadline:
        time.sleep(2.0)
    load = os.getloadavg()[0]
    return load, load <= gate


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8, help="ABBA repetitions per cell (each: A, B, B, A = 2 pairs)")
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--load-gate", type=float, default=2.5, help="1-minute load average allowed before a pair")
    ap.add_argument("--gate-wait-s", type=float, default=10.0, help="wait this long for the load to drop before a "
                    "pair (then the pair runs anyway and its cell is INVALID)")
    ap.add_argument("--only", default="", help="comma-separated cells")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    cells = [c for c in CELLS if not a.only or c in a.only.split(",")]
    bench = Bench(Path("/tmp") / f"bench-fn-ab-{uuid.uuid4().hex[:6]}")
    rows = {}
    print(f"workloads_fn_ab: {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, cells {', '.join(cells)}, "
          f"{a.records} records, pairs {a.pairs}, load gate {a.load_gate}, load now "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs", flush=True)
    try:
        bench.run(cells[0], "A", min(a.records, 50))  # warm-up: every endpoint's cold start
        for cell in cells:
            runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
            loads, gated = [], 0
            reps = max(1, math.ceil(a.pairs / 2))
            for rep in range(reps):
                load, ok = wait_load(a.load_gate, a.gate_wait_s)
                loads.append(load)
                gated += not ok
                for mode in "ABBA":
                    runs[mode].append(bench.run(cell, mode, a.records))
                walls = {m: " ".join(f"{x['wall_s']:.1f}" for x in runs[m][-2:]) for m in "AB"}
                dil = max(x["dilation"] for m in "AB" for x in runs[m][-2:])
                print(f"  {cell} ABBA {rep + 1}/{reps}: A {walls['A']} s, B {walls['B']} s, dilation <= {dil:.3f}, "
                      f"load before {load:.2f}{'' if ok else ' (over the gate)'}", flush=True)
            control = bench.control(cell, a.records)
            pairs = list(zip([x["wall_s"] for x in runs["A"]], [x["wall_s"] for x in runs["B"]]))
            ci = ratio_ci(pairs)
            every = runs["A"] + runs["B"]
            row = {"A_wall_s": statistics.median(x["wall_s"] for x in runs["A"]),
                   "B_wall_s": statistics.median(x["wall_s"] for x in runs["B"]), "pairs": len(pairs),
                   **{f"ratio_{k}": v for k, v in ci.items()},
                   "requests": min(x["requests"] for x in every), "records": min(x["records"] for x in every),
                   "min_wall_s": min(x["wall_s"] for x in every),
                   "dilation": statistics.median(x["dilation"] for x in every),
                   "A_slot_util": statistics.median(x["slot_util"] for x in runs["A"]),
                   "B_slot_util": statistics.median(x["slot_util"] for x in runs["B"]),
                   "control_wall_s": control["wall_s"], "control_slot_util": control["slot_util"],
                   "load_max": max(loads), "pairs_over_load_gate": gated}
            why = [w for w, bad in (("records", row["records"] < a.records), ("requests", row["requests"] < 10_000),
                                    ("wall < 8 s", row["min_wall_s"] < 8.0), ("dilation > 5 %", row["dilation"] > 1.05),
                                    ("pairs < 8", row["pairs"] < 8), ("load gate", gated > 0)) if bad]
            row["valid"], row["invalid_because"] = not why, why
            rows[cell] = row
            print(f"{cell:12s} A {row['A_wall_s']:.2f}s B {row['B_wall_s']:.2f}s ratio {ci['ratio']:.3f} "
                  f"[{ci['lo']:.3f}, {ci['hi']:.3f}] n={len(pairs)} | control {control['wall_s']:.2f}s | util A "
                  f"{row['A_slot_util']:.3f} B {row['B_slot_util']:.3f} control {control['slot_util']:.3f} | "
                  f"requests {row['requests']} records {row['records']} dilation {row['dilation']:.3f} "
                  f"load<= {row['load_max']:.2f} {'VALID' if not why else 'INVALID: ' + ', '.join(why)}", flush=True)
    finally:
        bench.close()
    if a.out:
        a.out.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
