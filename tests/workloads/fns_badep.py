"""A workload function naming an endpoint no test fleet has (``--workloads tests.workloads.fns_badep``)."""

from __future__ import annotations

import makespan


@makespan.workload(endpoint="nope", name="badep")
def badep(ctx):
    return "never runs"
