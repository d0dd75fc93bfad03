"""The no-op workload function of ``bench/scale.py --modes function`` (loaded by its GPU worker)."""

import makespan


@makespan.workload(endpoint="noop", name="bench.noop")
def noop(ctx):
    return None
