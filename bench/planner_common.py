"""Shared fleet for the planner benchmarks: 8 endpoints (TP 1/2/4, cold starts 45–240 s,
one with a sleep mode), hosts of 8 GPUs, a few endpoints at the set point."""

from app.models import parse_fleet

ITP = "/work/shared/data/traces/msft-itp-2021/"
ALIBABA = "/work/shared/data/traces/alibaba-fgd-2023/openb_pod_list_default.csv"


def bench_fleet(gpus: int):
    hosts = [{"name": f"h{i}", "gpu_count": 8, "memory_mib": 81920} for i in range(max(1, gpus // 8))]
    eps = {
        "m1": (1, 45, None), "m2": (1, 90, None), "m3": (1, 150, None), "m4": (1, 240, 20),
        "m5": (1, 60, None), "m6": (1, 120, None), "t2": (2, 120, None), "t4": (4, 200, None),
    }
    out = {}
    for n, (tp, cold, wake) in eps.items():
        d = {"model": n, "tensor_parallel": tp, "memory_mib_per_gpu": 20000 * tp, "cold_start_s": cold, "evict_s": 5}
        if wake:
            d["wake_s"] = wake
        out[n] = d
    out["m1"]["set_point"] = [{"host": "h0", "gpus": [0]}]
    out["m2"]["set_point"] = [{"host": "h0", "gpus": [1]}]
    return parse_fleet({"name": f"bench{gpus}", "hosts": hosts, "endpoints": out})
