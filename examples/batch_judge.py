"""A batch-judge workload: N prompts through a judge endpoint, the verdicts returned.

It sends real requests (``ctx.requests``), so its ``judge`` endpoint needs a server: a
``launch`` driver that runs one (``process`` with the bundled endpoint server, or
``vllm``; docs/drivers.md). On the example fleet's simulated judge it fails at once with
``makespan.errors.NoEndpointServer``.

::

    job = makespan.connect().submit("batch_judge", ["Is 7 prime?", "Is 9 prime?"], priority="HIGH")
    for row in job.result(timeout_s=3600):
        print(row["prompt"], "->", row["verdict"])
"""

from __future__ import annotations

from typing import Any

import makespan

CHUNK = 256  # prompts per ctx.requests call: progress and cancellation between chunks


@makespan.workload(endpoint="judge", name="batch_judge", retries=2, retry_backoff_s=5, expected_s=600)
def batch_judge(ctx: makespan.WorkloadContext, prompts: list[str], max_tokens: int = 32) -> list[dict[str, Any]]:
    """Judge each prompt (a chat completion on the judge); returns ``[{"prompt", "verdict"}]``
    in order. Stops between chunks when the job is cancelled."""
    if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
        # checked before any request: a single string would be judged character by character
        raise TypeError(f"prompts: a list of strings, got {prompts!r:.80}")
    out: list[dict[str, Any]] = []
    for start in range(0, len(prompts), CHUNK):
        if ctx.cancelled.is_set():
            break
        chunk = prompts[start:start + CHUNK]
        verdicts = ctx.requests(chunk, route="/v1/chat/completions", max_tokens=max_tokens)
        out.extend({"prompt": p, "verdict": v} for p, v in zip(chunk, verdicts))
        ctx.progress(len(out), len(prompts))
    return out
