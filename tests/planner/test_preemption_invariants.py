import pytest

from makespan.planner.api import POLICY_REGISTRY, plan
from tests.planner.preemption_gen import instance, total


def _check(p, batch, state, obj):
    tot, ev = total(p, batch, state, obj)
    assert ev.objective == pytest.approx(p.objective, rel=1e-9, abs=1e-6)
    cut = [v for x in p.preemptions for v in x.victims]
    assert len(cut) == len(set(cut))
    assert sorted(a.job_id for a in ev.assignments) == sorted([j.id for j in batch] + cut)
    by = {a.job_id: a for a in ev.assignments}
    for x in p.preemptions:
        pre = by[x.job_id]
        for v in x.victims:
            a = by[v]
            if set(a.gpus) & set(x.gpus):
                assert a.start_s >= pre.end_s - 1e-6, (v, a, pre)
        for v in x.victims:  # victims never preempt in the same plan
            assert v not in {y.job_id for y in p.preemptions}
    # victims cut during their transition excluded from the solver's windows
    return tot


@pytest.mark.parametrize("policy,limit", [("cpsat", 0.3), ("tardiness", 0.3)])
@pytest.mark.parametrize("seed", range(15))
def test_random_preemptive_plans_replay_and_beat_the_floor_branch(policy, limit, seed):
    tard = policy == "tardiness"
    state, batch = instance(seed, deadlines=tard, deps=seed % 3 == 0)
    obj = POLICY_REGISTRY[policy].objective
    p = plan(batch, state, policy, preemption=True, time_limit_s=limit)
    tot = _check(p, batch, state, obj)
    floor = plan(batch, state, POLICY_REGISTRY[policy].floor, preemption=True)
    ftot = _check(floor, batch, state, obj)
    assert tot <= ftot + 1e-6 * max(1.0, abs(ftot))
