"""A workload function only one host's GPU worker registers (``--workloads tests.workloads.fns_only_b``
on host-b alone): a rolling deploy that has reached one host."""

from __future__ import annotations

import makespan


@makespan.workload(endpoint="sim", name="only_b")
def only_b(ctx, n):
    return {"n": n, "host": ctx.host}
