"""Preemption as a decision of the CP-SAT window model (:mod:`makespan.planner.cpsat`).

The greedy decider (:mod:`makespan.planner.preemption_plan`) scores each candidate with a whole
greedy plan, one job at a time. Here candidates become variables of the first window of
the windowed LNS (the window that starts at the plan's first job, so the running jobs
are the window's only predecessors) and CP-SAT weighs them jointly with the placement of
the window's jobs.

Model additions, for the candidates ``c`` (preemptor ``P_c``, group ``G_c``, victims
``V_c``; :func:`makespan.planner.preemption_plan.candidates`, the design's level rules) of the
window's jobs whose victims are all past their transition:
    variables:   ``y_c`` (take c); per victim v: ``keep_v`` (not cut) and, as a window
                 job, an optional start and candidate-group literals (present iff cut);
                 per GPU u of v an optional fixed interval [0, E_v) present iff
                 ``keep_v`` (v still holds u), in both per-GPU no-overlaps;
    constraints: ``keep_v + Σ_{c ∋ v} y_c = 1`` (a victim is cut at most once);
                 at most one ``y_c`` per preemptor; ``y_c`` ⇒ P_c on G_c, the residency of
                 P_c's model on G_c starts at 0 and P_c starts right after its transition
                 (committed at now: no victim can take G_c first); a cut victim restarts
                 from zero (full service time) on one of its groups;
    objective:   a kept victim counts w_v·E_v, a cut one w_v·C_v (and their tardiness with
                 the tardiness objective), so both branches count the same jobs — the
                 comparison of :func:`makespan.planner.preemption_plan.decide`.
Residencies on a victim's GPUs may start at 0 (the GPU is free at now once the victim is
cut). A solution that takes candidates is decoded by applying them to the state
(:func:`makespan.planner.preemption_plan.apply`) and re-placing the rest through the exact replay;
it is accepted only when the evaluator's score of the rest plus the preemptors' fixed
completions plus the victims' lost work (:func:`makespan.planner.preemption_plan.lost_work_cost`)
is below the incumbent's plus the victims' original completions.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

from makespan.planner.evaluator import TOL_S
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob, PlannedPreemption
from makespan.planner.preemption_plan import Candidate, Branch, apply, candidates, fixed_score, lost_work_cost

PER_JOB = 2  # candidate groups per waiting job offered to the model


def window_candidates(inc: Plan, lo: int, hi: int, batch: Sequence[PlanJob], state: FleetState,
                      per_job: int = PER_JOB, eligible: Collection[str] | None = None) -> list[Candidate]:
    """The candidates of the jobs in ``inc.assignments[lo:hi]`` on ``state`` that the
    window model can express: only windows with ``lo == 0`` (nothing placed before them),
    victims past their transition, the preemptor planned later than now and, when
    ``eligible`` is given, one of those ids (the planning point's own batch: a victim
    cut by this plan does not preempt in it — it is requeued first)."""
    if lo != 0 or not state.running:
        return []
    now = state.now_s
    out: list[Candidate] = []
    by_id = {j.id: j for j in batch}
    for a in inc.assignments[lo:hi]:
        job = by_id[a.job_id]
        if job.priority > 1 or a.start_s <= now + TOL_S or (eligible is not None and job.id not in eligible):
            continue
        for c in candidates(job, state, batch, per_job):
            if all(v.service_start_s <= now + TOL_S for v in c.victims):
                out.append(c)
    return out


def preemptive_window_end(inc: Plan, batch: Sequence[PlanJob], state: FleetState, k: int, max_k: int,
                          eligible: Collection[str] | None = None) -> int:
    """The end of a first window (``lo`` = 0) of at least ``k`` jobs that holds every
    waiting job with a candidate among the first ``max_k`` jobs; 0 when none has one."""
    pre = {c.job.id for c in window_candidates(inc, 0, max_k, batch, state, 1, eligible)}
    idx = [i for i, a in enumerate(inc.assignments[:max_k]) if a.job_id in pre]
    return 0 if not idx else min(len(inc.assignments), max(k, idx[-1] + 1))


def decodings(inc: Plan, hi: int, order: list[str], groups: dict, taken: Taken) -> list[tuple[Plan, list[str], dict]]:
    """Ways to read a window solution that took preemptions, as (incumbent to splice,
    window order, groups) for :func:`makespan.planner.local.decode_window` with ``lo`` = 0: the
    model's order and groups; the victims first, each back on the GPUs it held; the
    victims last (after the jobs behind the window), on those GPUs. The model sees only
    the window's jobs, so where a restarted victim goes is also tried outside it: a
    restart the model puts on another group can delay the jobs after the window."""
    cut = {v.id: v for c in taken.cuts for v in c.victims}
    gone = {j.id for j in taken.preemptors}
    rest = [j for j in order if j not in gone and j not in cut]
    own = {**groups, **{vid: tuple(v.gpus) for vid, v in cut.items()}}
    model = [j for j in order if j not in gone]
    tail = [replace(inc.assignments[0], job_id=vid, gpus=tuple(v.gpus)) for vid, v in cut.items()]
    last = Plan(inc.policy, list(inc.assignments) + tail)
    return [(inc, model, groups), (inc, list(cut) + rest, own), (last, rest, own)]


@dataclass
class Taken:
    """The preemptions a window solution took, applied in order: the branch after them."""

    state: FleetState
    batch: list[PlanJob]
    preemptions: list[PlannedPreemption] = field(default_factory=list)
    starts: list[Assignment] = field(default_factory=list)
    preemptors: list[PlanJob] = field(default_factory=list)
    cuts: list[Candidate] = field(default_factory=list)  # as applied (victims as they were)
    fixed_delta: float = 0.0  # F(preemptors at their C) − F(victims at their original C)


def take(state: FleetState, batch: Sequence[PlanJob], cands: Sequence[Candidate], objective: str) -> Taken:
    """Apply ``cands`` (disjoint victims, in preemptor level-then-submission order) to
    ``state``/``batch``. ``fixed_delta`` is what the fixed completions add to the score
    (:func:`makespan.planner.preemption_plan.fixed_score`, weight·s)."""
    out = Taken(state, list(batch))
    for c in sorted(cands, key=lambda c: (c.job.priority, c.job.seq, c.job.id)):
        live = {x.group: x for x in candidates(c.job, out.state, out.batch, per_job=10 ** 6)}
        cur = live.get(c.group)
        if cur is None or {v.id for v in cur.victims} != {v.id for v in c.victims}:
            raise ValueError(f"candidate {c.job.id} on {c.group} is no longer valid")
        out.state, out.batch, a = apply(out.state, out.batch, cur)
        out.starts.append(a)
        out.preemptors.append(c.job)
        out.cuts.append(cur)
        out.preemptions.append(PlannedPreemption(c.job.id, tuple(v.id for v in cur.victims), cur.group,
                                                 state.now_s, 0.0))
        out.fixed_delta += (fixed_score([(c.job, a.end_s)], objective)
                            - fixed_score([(v.job, v.end_s) for v in cur.victims], objective)
                            + lost_work_cost(cur, state.now_s))
    return out


def branch_of(taken: Sequence[Taken]) -> Branch | None:
    """The branch of every preemption the improver took (for
    :func:`makespan.planner.preemption_plan.assemble`); None when it took none."""
    if not taken:
        return None
    last = taken[-1]
    return Branch(last.state, last.batch, None, [p for t in taken for p in t.preemptions],
                  [a for t in taken for a in t.starts], [j for t in taken for j in t.preemptors])


class Holders:
    """The model additions of the module doc for candidates ``pre`` (CP-SAT model ``m``,
    integer seconds from now via ``ti``); a no-op without candidates."""

    def __init__(self, m, pre: Sequence[Candidate], victims: dict, ti, by_gpu_job: dict[str, list]):
        self.pre, self.victims = list(pre), victims
        self.y = [m.NewBoolVar(f"pre_{i}") for i in range(len(self.pre))]
        self.keep = {vid: m.NewBoolVar(f"keep_{vid}") for vid in victims}
        self.completions: dict[str, object] = {}
        self.occupied: dict[str, list] = {}
        for vid, v in victims.items():
            m.Add(self.keep[vid] + sum(y for c, y in zip(self.pre, self.y) if vid in {w.id for w in c.victims}) == 1)
            for u in v.gpus:  # v holds u until its end unless it is cut
                iv = m.NewOptionalFixedSizeIntervalVar(0, max(1, ti(v.end_s)), self.keep[vid], "")
                self.occupied.setdefault(u, []).append(iv)
                by_gpu_job[u].append(iv)
        by_job: dict[str, list] = {}
        for c, y in zip(self.pre, self.y):
            by_job.setdefault(c.job.id, []).append(y)
        for ys in by_job.values():
            m.AddAtMostOne(ys)

    def completion(self, m, vid: str, lits: list, s, pj: int, horizon: int, ti):
        """A victim's completion: its own end when kept, else its restart's end (its group
        literals are present iff it is cut)."""
        cut = self.keep[vid].Not()
        m.Add(sum(lits) == 1).OnlyEnforceIf(cut)
        for lit in lits:
            m.AddImplication(lit, cut)
        c = m.NewIntVar(0, horizon + pj, "")
        m.Add(c == s + pj).OnlyEnforceIf(cut)
        m.Add(c == ti(self.victims[vid].end_s)).OnlyEnforceIf(self.keep[vid])
        self.completions[vid] = c
        return c

    def link(self, m, res: dict, x: dict, start: dict) -> None:
        """``y_c`` ⇒ the preemptor on its group, its residency from 0, its start right
        after the transition (``res``: (group, endpoint) → (presence, start, end, interval, σ, warm))."""
        for c, y in zip(self.pre, self.y):
            _p, rs, _e, _iv, sigma, _w = res[(c.group, c.job.endpoint)]
            m.AddImplication(y, x[(c.job.id, c.group)])
            m.Add(rs == 0).OnlyEnforceIf(y)
            m.Add(start[c.job.id] == sigma).OnlyEnforceIf(y)

    def hint(self, x: dict, cands: dict, start: dict, ti) -> list[tuple[object, int]]:
        """The incumbent's values of the additions: nothing taken, every victim kept."""
        out: list[tuple[object, int]] = [(y, 0) for y in self.y]
        for vid, v in self.victims.items():
            out += [(self.keep[vid], 1), (start[vid], 0), (self.completions[vid], ti(v.end_s))]
            out += [(x[(vid, g)], 0) for g in cands[vid]]
        return out
