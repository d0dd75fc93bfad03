"""Policies as objects (makespan.planner.policies): one registry, read-only; plan() passes
a policy exactly the options it was given, through a typed SolveOptions; a benchmark's
variant is a copy, never a change of the shipped registry."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from makespan.errors import PlannerError
from makespan.planner import greedy
from makespan.planner.api import plan
from makespan.planner.evaluator import OBJECTIVES
from makespan.planner.policies import POLICY_REGISTRY, Policy, PolicyRegistry, SolveOptions
from makespan.planner.synthetic import instance
from tests.planner.preemption_gen import instance as preemptive_instance

ROOT = Path(__file__).resolve().parents[2]


def _recording(name: str, seen: list[SolveOptions], **facts) -> Policy:
    """A policy that records the options it is given and plans with the portfolio."""

    def solver(batch, state, options):
        seen.append(options)
        return greedy.portfolio(batch, state)

    return Policy(name, facts.pop("objective", "weighted_completion"), facts.pop("floor", "portfolio"), False,
                  "records its options", solver, **facts)


def test_every_policy_states_its_facts():
    assert POLICY_REGISTRY.names()[:4] == ("fifo", "min-evict", "wspt", "portfolio")
    for policy in POLICY_REGISTRY.values():
        assert policy.objective in OBJECTIVES
        assert policy.floor is None or policy.floor in POLICY_REGISTRY
        assert policy.description and "\n" not in policy.description
        if policy.improver:  # the live planner plans each tick with the floor
            assert policy.floor is not None and policy.time_limit_s is not None
    assert [p.name for p in POLICY_REGISTRY.values() if p.improver] == ["cpsat", "default", "tardiness"]
    assert POLICY_REGISTRY["tardiness"].floor == "tardiness-portfolio"
    assert {POLICY_REGISTRY[n].floor for n in ("fifo", "min-evict", "wspt")} == {None}


def test_registry_is_read_only_and_a_copy_leaves_it_unchanged():
    with pytest.raises(TypeError):
        POLICY_REGISTRY["fast"] = POLICY_REGISTRY["cpsat"]  # type: ignore[index]
    fast = replace(POLICY_REGISTRY["cpsat"], name="cpsat-fast", time_limit_s=0.1)
    copy = POLICY_REGISTRY.with_policies(fast, replace(POLICY_REGISTRY["fifo"], description="changed"))
    assert "cpsat-fast" in copy and "cpsat-fast" not in POLICY_REGISTRY
    assert copy.names() == (*POLICY_REGISTRY.names(), "cpsat-fast")
    assert copy["fifo"].description == "changed" != POLICY_REGISTRY["fifo"].description


def test_a_registry_refuses_duplicates_and_unknown_floors():
    with pytest.raises(PlannerError, match="registered twice"):
        PolicyRegistry([POLICY_REGISTRY["fifo"], POLICY_REGISTRY["fifo"]])
    with pytest.raises(PlannerError, match="floor 'portfolio' is not registered"):
        PolicyRegistry([POLICY_REGISTRY["cpsat"]])
    with pytest.raises(PlannerError, match="unknown objective"):
        replace(POLICY_REGISTRY["fifo"], objective="makespan")


def test_unknown_policy_names_the_known_ones():
    batch, state = instance(6, 2, 2, seed=1)
    with pytest.raises(PlannerError) as ei:
        plan(batch, state, "bogus")
    assert str(ei.value) == f"unknown policy 'bogus'; known: {', '.join(POLICY_REGISTRY.names())}"


def test_plan_passes_the_options_it_was_given_and_the_policy_default_limit():
    batch, state = instance(12, 4, 3, seed=2)
    seen: list[SolveOptions] = []
    previous = greedy.fifo(batch, state)
    out = plan(batch, state, _recording("rec", seen, time_limit_s=0.7), num_workers=3, previous=previous)
    assert out.assignments and seen == [SolveOptions(time_limit_s=0.7, num_workers=3, previous=previous)]
    plan(batch, state, _recording("rec", seen), time_limit_s=0.2)
    assert seen[-1] == SolveOptions(time_limit_s=0.2)


@pytest.mark.parametrize("window_preemption", [False, True])
def test_preemptive_plan_tells_only_a_window_preemption_policy_its_preemptors(window_preemption):
    """The floor decides first; a policy whose windows preempt then gets the batch's ids
    as preemptors, and, when the floor took a preemption, a second solve of the batch
    without it at UNDO_SHARE of the limit (makespan.planner.api module doc)."""
    from makespan.planner.api import UNDO_SHARE, UNDO_WINDOW_SHARE

    for seed in range(40):
        state, batch = preemptive_instance(seed)
        floor_took = plan(batch, state, "portfolio", preemption=True).preemptions
        if floor_took:
            break
    else:  # pragma: no cover - the generator's instances preempt often
        pytest.fail("no instance where the floor preempts")
    seen: list[SolveOptions] = []
    policy = _recording("rec", seen, time_limit_s=1.0, window_preemption=window_preemption)
    plan(batch, state, policy, preemption=True)
    ids = frozenset(j.id for j in batch)
    if not window_preemption:
        assert seen == [SolveOptions(time_limit_s=1.0)]  # the policy's own limit, no preemptors
    else:
        assert seen == [SolveOptions(time_limit_s=1.0 * (1.0 - UNDO_SHARE), preemptors=ids),
                        SolveOptions(time_limit_s=1.0 * UNDO_SHARE, preemptors=ids,
                                     first_window_share=UNDO_WINDOW_SHARE)]


def test_simulate_takes_a_policy_object_and_reports_its_name():
    from makespan.planner.simulator import simulate

    batch, state = instance(20, 4, 3, seed=4, spread_s=300)
    seen: list[SolveOptions] = []
    rep = simulate(batch, state, _recording("rec", seen), preemption=False, restore=False)
    assert rep["policy"] == "rec" and seen
    same = simulate(batch, state, "portfolio", preemption=False, restore=False)
    timed = ("policy", "sim", "planner")  # the name, and wall times
    assert {k: v for k, v in rep.items() if k not in timed} == {k: v for k, v in same.items() if k not in timed}
    assert rep["planner"]["batches"] == same["planner"]["batches"]


def test_cli_help_lists_every_policy_from_the_registry():
    from typer.testing import CliRunner

    from makespan.cli import app as cli_app

    for command in ("planner", "demo", "replay", "simulate"):
        res = CliRunner().invoke(cli_app, [command, "--help"], env={"COLUMNS": "2000", "TERMINAL_WIDTH": "2000"})
        assert res.exit_code == 0, res.output
        text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", res.output).split())
        for policy in POLICY_REGISTRY.values():
            assert f"{policy.name} ({policy.description})" in text, (command, policy.name)


def test_user_page_lists_every_policy_with_its_description():
    """docs/planner.md's policy table: one row per registered policy, in registry order,
    with its description, objective and floor."""
    text = (ROOT / "docs" / "planner.md").read_text()
    rows = re.findall(r"^\| `([a-z-]+)` \| (.+?) \| `([a-z_]+)` \| (.+?) \|", text, re.M)
    assert [r[0] for r in rows] == list(POLICY_REGISTRY.names())
    for name, description, objective, floor in rows:
        policy = POLICY_REGISTRY[name]
        assert description == policy.description and objective == policy.objective
        assert floor == (f"`{policy.floor}`" if policy.floor else "–"), name
