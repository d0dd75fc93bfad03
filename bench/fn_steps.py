"""The step function of ``bench/workloads_fn_ab.py`` (loaded by its GPU worker with
``--workloads bench.fn_steps``)."""

from __future__ import annotations

import time
from typing import Any

import makespan


@makespan.workload(name="bench.step")
def step(ctx, name: str, per_record: int, records: int, *inputs: dict[str, Any]) -> dict[str, Any]:
    """Send ``per_record`` completions per record to the job's endpoint; the step's records
    are its inputs' records (the first input's, tagged by the others), or ``records`` new ones."""
    if inputs:
        base = list(inputs[0]["records"])
        for other in inputs[1:]:
            base = [f"{a}+{b[:4]}" for a, b in zip(base, other["records"])]
    else:
        base = [f"r{i}" for i in range(records)]
    prompts = [f"{name}:{rec[:16]}:{k}" for rec in base for k in range(per_record)]
    t0 = time.monotonic()
    answers = ctx.requests(prompts, max_tokens=8)
    execute_s = time.monotonic() - t0
    ctx.progress(len(prompts), len(prompts))
    out = [f"{name}{answers[i * per_record].split()[1] if answers[i * per_record] else '?'}" for i in range(len(base))]
    return {"records": out, "requests": len(prompts), "execute_s": execute_s}
