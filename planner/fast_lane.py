"""No class worse off than under strict priority: the fast lane, pure.

``fifo`` (strict priority: level, then submission; the earliest-free group) is the baseline
a top-class user compares with. The policies trade waits between jobs to lower Σ w(C − r),
and that trade can push a CRITICAL job behind work it would have gone before under strict
priority (issue 19 point 4: the p95 wait of CRITICAL was 3.0× fifo's on some trace windows).

The lane's levels (default :data:`DEFAULT_LANE_LEVELS`: CRITICAL, and HIGH with f = 1.25), each with a factor f
≥ 1 (1 unless given), are planned as strict priority would plan them on the same state: the
lane jobs whose dependencies are done, in (level, release, submission) order, each after the
work running and the lane jobs before it, on the group where it starts first (``fifo``'s
rule, paying any load): that gives its strict-priority completion C*. Its **allowed
completion** is r + f·(C* − r) (release r: its response time at most f × the strict-priority
one). Its lane placement is the group where it completes first (a warm group that frees a
little later beats a cold one free now: it completes earlier, and a plan that waits for it
is not late).

:func:`enforce` checks the policy's plan: when every lane job completes by its allowed
completion, the plan is returned unchanged. Otherwise it is rebuilt as a list schedule on a
:class:`makespan.planner.replay.Replay` of the state: the late lane jobs first (the
**forced** set, in lane order, each on the group where it completes first), then every other
job of the plan in the plan's start order on its planned group at its earliest time there
(the policy's groups, its order and so its transitions are kept; a job only moves behind a
forced job that now takes its GPUs first). A lane job that the rebuild makes late joins the
forced set and the rebuild is repeated (at most once per lane job: with every lane job
forced, the placements are the lane's, and none is late). The other lane jobs keep the
policy's order among themselves (a short CRITICAL job before a long one) as long as each
completes in time. A second candidate, when the caller gives a ``replan`` policy
(:func:`makespan.planner.api.plan` gives the greedy floor, ``portfolio``, or the policy
itself for the fixed baselines; the live worker the same), is the forced placements plus
that policy's plan of the other jobs on the state they leave; it is kept when its score is
lower and no lane job is late in it. The result is evaluated
(:func:`makespan.planner.evaluator.evaluate`): a feasible plan of the same batch.

**Start bound** (``start_grace_s``: level -> grace G s; ``Settings.fast_lane_start``,
default :data:`DEFAULT_START_GRACE`: CRITICAL with 30 s, HIGH with 30 s and a peer floor). The bench's target is on waits
(issue 19 point 4: p95 of start − submission, CRITICAL ≤ 1.1× ``fifo``'s, HIGH ≤ 1.25×), and
a completion bound lets a plan wait for a warm GPU as long as that completes the job no
later than a cold start would: on the bench's windows the default then waited up to 3× as
long as ``fifo`` for its CRITICAL jobs (bench/RESULTS.md). A level in ``start_grace_s`` is
bounded on its *start* instead: its allowed start is r + f·(S* − r) + G (S*: strict
priority's start from the same state, in the same lane order); a late one is forced onto the
group where it completes first among those it can start on by then (strict priority's group
always can), and for each forced job up to :data:`GROUP_TRIALS` other such groups are tried
(the rebuild kept when it scores lower: a warm group, or one whose loss the rest of the plan
feels least), at most :data:`TRIAL_BUDGET` trials per plan, in lane order (each trial
rebuilds the plan: with HIGH in the lane, 76 forced jobs of a 256-job batch took 304
trials, 1–2 s per tick). G lets the plan still wait a little for a warm GPU (one planning window).

**Wait floor** (a level's grace given as (G, W) s; ``LEVEL:G/W`` in
``MAKESPAN_FAST_LANE_START``; none by default): the allowed start is never before r + W, so
the plan may delay a start-bounded job behind its strict-priority start as long as its wait
stays under W; only a job it would push past both bounds is forced (or takes the rule's
preemption). Measured with HIGH in the lane (bench/RESULTS.md, "Wait floor"): it bounds
HIGH's tail with less forcing than a plain grace, but not enough less to keep the default's
weighted completion within the issue's limit, so no default level has one.

**Peer floor** (a level's grace given as (G, W, P); ``LEVEL:G/xP`` in
``MAKESPAN_FAST_LANE_START``; HIGH with P = 1.4 by default): the target is a tail, the p95
of the level's waits, not every job's wait. The lane is placed once without the peer floor
for each job's strict-priority start S*; the level's longest strict wait from the state,
L = max (S* − r) over its jobs in the batch, then gives each of them a floor: the allowed
start is never before r + P·f·L. A job strict priority would start soon may then wait about
as long as strict priority makes the level's longest waiter wait, so the plan keeps its
warm groups and its order for the short waits, and only the jobs that would stretch the
level's tail are forced. The floor never passes r + f·L + :data:`PEER_SLACK_S`: in a burst
(18 HIGH jobs in one batch, L = 309–374 s) P·f·L let every HIGH job wait longer than strict
priority makes its slowest one wait, which then set the level's p95. Measured
(bench/RESULTS.md, "Peer floor for HIGH" and "HIGH's burst window, round 7").

The guarantee: at every planning point, no lane job is planned to complete later than its
allowed completion (f = 1: later than strict priority would complete it from that state),
and no start-bounded one to start later than its allowed start. A plan with preemptions is returned as
is (the preemptors start at once; the rest of such a plan is checked by the caller on the
state the preemptions leave, :func:`makespan.planner.api.plan`). The lane comes after the
aging reservation (:mod:`makespan.planner.reservation`): a CRITICAL job goes before a
reserved lower-level job, as a CRITICAL preemption does.

**Preemption** (:func:`rule_preemptions`; plans with preemption, ``plan(preemption=True)``,
when ``lane_preempt``): strict priority with the preemption rule
(:mod:`makespan.planner.preemption`) starts a CRITICAL or HIGH job at once by preempting
lower-level work when no group it could have frees within its cold start; its strict start
is then now. Before the scored preemptions are decided, each start-bounded lane job
(CRITICAL/HIGH) whose strict start without preempting is past its allowed start from now
(r + f·(now − r) + G) and for which the rule would preempt takes that preemption. The
rule's test looks at the GPUs the lane jobs ahead of it leave (each on its lane group until
its lane end): the groups that free soonest are taken by the CRITICAL and earlier HIGH jobs
of a burst, and strict priority preempts for the ones behind them. The job starts now on the
first candidate in :func:`makespan.planner.preemption_plan.candidate_order` (NORMAL/LOW
victims before HIGH ones, then the least weighted lost work; the victims' budget and
minimum runtime hold as for every preemption) that takes no GPU a waiting lane job of a
higher level is placed on (a HIGH burst that took those pushed CRITICAL jobs to
1.13–1.39× ``fifo``'s p95 wait). The scored decision then runs on the state it leaves. The
peer floor does not hold a rule preemption back: it is tested against the start bound
without it, as strict priority with the rule would preempt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from makespan.planner import placement_index, preemption_plan
from makespan.planner.evaluator import TOL_S, evaluate_retimed, score
from makespan.planner.helpers import helpers_start_s
from makespan.planner.model import Assignment, FleetState, Plan, PlanJob, PlannedPreemption
from makespan.planner.replay import Group, Replay, state_after

Replan = Callable[[Sequence[PlanJob], FleetState], Plan]
Levels = Sequence[int] | Mapping[int, float]  # levels, or level -> factor (a sequence: factor 1)

DEFAULT_LANE_LEVELS: dict[int, float] = {0: 1.0, 1: 1.25}  # CRITICAL, HIGH × 1.25 (Settings.fast_lane)
# level -> grace s, or (grace s, wait floor s), or (grace s, wait floor s, peer factor): start-bounded levels
GraceValue = float | tuple[float, float] | tuple[float, float, float]
Grace = Mapping[int, GraceValue]
# CRITICAL: 30 s; HIGH: 30 s with a peer floor of 1.4 × its longest strict wait (Settings.fast_lane_start)
DEFAULT_START_GRACE: dict[int, GraceValue] = {0: 30.0, 1: (30.0, 0.0, 1.4)}
GROUP_TRIALS = 4  # other groups tried per start-bounded forced job (enforce)
TRIAL_BUDGET = 16  # group trials per enforce call, in lane order (each rebuilds the plan: bounds a tick's cost)
RULE_PREEMPTION_BUDGET = 16  # rule preemptions per call, in lane order (each re-places the lane: bounds a tick's cost)
PEER_SLACK_S = 60.0  # the peer floor never past f·L + this, s (a burst's L would otherwise set the level's tail)


def factors(levels: Levels) -> dict[int, float]:
    """``levels`` as level -> factor (a plain sequence of levels: factor 1 each)."""
    return dict(levels) if isinstance(levels, Mapping) else {int(x): 1.0 for x in levels}


def grace_parts(grace: GraceValue) -> tuple[float, float, float]:
    """A start-bounded level's grace value as (grace G s, wait floor W s, peer factor P;
    0: no peer floor)."""
    if not isinstance(grace, tuple):
        return float(grace), 0.0, 0.0
    return (grace[0], grace[1], grace[2]) if len(grace) == 3 else (grace[0], grace[1], 0.0)


def allowed_start(j: PlanJob, strict_start_s: float, factor: float, grace: GraceValue,
                  peer_wait_s: float = 0.0) -> float:
    """The latest start the lane allows the start-bounded job ``j`` whose strict-priority
    start is ``strict_start_s`` (module doc, "Wait floor" and "Peer floor"): r + f·(S* − r) + G,
    never before r + W (``grace`` = (G, W)) nor, with a peer factor P (``grace`` = (G, W, P)),
    before r + min(P·f·L, f·L + :data:`PEER_SLACK_S`), L = ``peer_wait_s`` (the longest
    strict-priority wait S* − r of the level's jobs in the batch). Workload s."""
    g, floor_s, peer = grace_parts(grace)
    peer_floor_s = min(peer * factor * peer_wait_s, factor * peer_wait_s + PEER_SLACK_S)
    return max(j.release_s + factor * (strict_start_s - j.release_s) + g, j.release_s + floor_s,
               j.release_s + peer_floor_s)


def lane_plan(batch: Sequence[PlanJob], state: FleetState, levels: Levels,
              start_grace_s: Grace | None = None) -> tuple[Replay, list[Assignment], dict[str, float]]:
    """The lane jobs of ``batch`` placed as the lane places them (module doc): the replay
    after them, their assignments ([] when the batch has none) and each one's latest
    allowed completion (a level in ``start_grace_s``: latest allowed start), workload s.
    A level with a peer factor is placed twice: first without its peer floor, for the
    longest strict-priority wait of its jobs, then with it (module doc, "Peer floor")."""
    grace = start_grace_s or {}
    peer_levels = {lvl for lvl, g in grace.items() if grace_parts(g)[2] > 0.0}
    if not peer_levels:
        return _lane_pass(batch, state, levels, grace, {})[:3]
    release = {j.id: (j.priority, j.release_s) for j in batch}
    longest: dict[int, float] = {}
    for jid, strict_start in _lane_pass(batch, state, levels, grace, {})[3].items():
        lvl, r = release[jid]
        if lvl in peer_levels:
            longest[lvl] = max(longest.get(lvl, 0.0), strict_start - r)
    return _lane_pass(batch, state, levels, grace, longest)[:3]


def _lane_pass(batch: Sequence[PlanJob], state: FleetState, levels: Levels, grace: Grace,
               peer_wait_s: Mapping[int, float]) -> tuple[Replay, list[Assignment], dict[str, float], dict[str, float]]:
    """One placement of :func:`lane_plan` with the levels' longest strict waits
    ``peer_wait_s`` (level -> s; a level not in it: no peer floor); also returns each
    lane job's strict-priority start."""
    ids = {j.id for j in batch}
    now = state.now_s
    fac = factors(levels)
    lane = sorted((j for j in batch if j.priority in fac
                   and all(d not in ids and state.end_of.get(d, now) <= now + TOL_S for d in j.deps)),
                  key=lambda j: (j.priority, j.release_s, j.seq))
    rep = Replay(state)
    cands = _Candidates(rep)
    out: list[Assignment] = []
    allowed: dict[str, float] = {}
    strict: dict[str, float] = {}
    for j in lane:
        ep = state.endpoints.get(j.endpoint)
        if ep is None or not rep.job_groups(j):
            continue
        g_strict, g_best = _groups(rep, j, cands=cands)
        r = rep.ready(j)
        strict_start = strict[j.id] = max(r, rep.group_free(g_strict))
        if j.priority in grace:
            allowed[j.id] = allowed_start(j, strict_start, fac[j.priority], grace[j.priority],
                                          peer_wait_s.get(j.priority, 0.0))
            g_best = _groups(rep, j, allowed[j.id], cands)[1]
        else:
            strict_end = strict_start + rep.transition_s(g_strict, ep) + j.service_s
            if j.helpers:
                strict_end += helpers_start_s(j.helpers, rep.endpoints)
            allowed[j.id] = j.release_s + fac[j.priority] * (strict_end - j.release_s)
        out.append(rep.place(j, g_best))
        cands.touch(g_best)
    return rep, out, allowed, strict


def rule_preemptions(branch: preemption_plan.Branch, levels: Levels,
                     start_grace_s: Grace | None) -> preemption_plan.Branch:
    """``branch`` with the preemptions strict priority's rule would take for the start-bounded
    lane jobs that cannot start in time without one (module doc, "Preemption"), each
    applied as :func:`makespan.planner.preemption_plan.apply` applies a scored one (the
    cheapest candidate: least victim work lost, then least victim weight, then group order);
    ``branch`` itself when none is needed. At most :data:`RULE_PREEMPTION_BUDGET` per call,
    in lane order (each one re-places the lane on the state it leaves: on a full fleet of
    1,024 GPUs a burst of 67 took 1.9 s, bench/lane_cost.py; the live planner takes the rest
    at its next tick, and a fleet of at most that many GPUs never reaches the cap, since
    every preemption takes a GPU no later one can). The returned branch's ``plan`` is None
    (re-plan its batch on its state)."""
    grace = start_grace_s or {}
    fac = factors(levels)
    if not grace or not branch.state.running:
        return branch
    cur, taken = branch, False
    tried: set[str] = set()
    while len(cur.taken) - len(branch.taken) < RULE_PREEMPTION_BUDGET:
        st = cur.state
        now = st.now_s
        _rep, lane, allowed = lane_plan(cur.batch, st, levels, grace)
        jobs = {j.id: j for j in cur.batch}
        pick = None
        free_at = dict(st.free_at)  # the free times the lane jobs before ``a`` leave
        before: Assignment | None = None
        for a in lane:
            if before is not None:
                for u in before.gpus:
                    free_at[u] = max(free_at.get(u, now), before.end_s)
            before = a
            j = jobs[a.job_id]
            if j.id in tried or j.priority not in grace or j.priority > 1:
                continue
            bound_now = allowed_start(j, max(now, j.release_s), fac[j.priority], grace[j.priority])
            if allowed[j.id] <= bound_now + TOL_S:  # strict priority's start without preempting is in time
                continue
            ep = st.endpoints[j.endpoint]
            groups = st.groups(ep.tp, ep.memory_mib) if not j.narrowed else Replay(st).job_groups(j)
            if not groups:
                continue
            soonest = min(max(free_at.get(u, now) for u in g) for g in groups)
            if soonest - now <= ep.cold_start_s + TOL_S:  # the rule's test: preempting would not start it sooner
                continue
            tried.add(j.id)
            # GPUs a waiting lane job of a higher level is placed on: a preemption must not take them
            held = {u for b in lane if jobs[b.job_id].priority < j.priority and b.start_s > now + TOL_S
                    for u in b.gpus}
            cands = [c for c in preemption_plan.candidates(j, st, cur.batch, per_job=len(groups))
                     if not held & set(c.group)]
            if cands:
                pick = cands[0]
                break
        if pick is None:
            break
        new_state, rest, start = preemption_plan.apply(st, cur.batch, pick)
        pp = PlannedPreemption(pick.job.id, tuple(v.id for v in pick.victims), pick.group, now, 0.0, rule=True)
        cur = preemption_plan.Branch(new_state, rest, None, cur.taken + [pp], cur.starts + [start],
                                     cur.preemptors + [pick.job])
        taken = True
    return cur if taken else branch


class _Candidates:
    """The groups :func:`_groups` looks at on one replay: every group of the job's list, or,
    for a list of :data:`makespan.planner.placement_index.INDEX_MIN_GROUPS` groups or more,
    those a :class:`makespan.planner.placement_index.GroupIndex` keeps (among groups of one
    signature, start and transition order them as they order a group rule's cost, so the
    dominated ones are never chosen: ``tests/planner/test_placement_index.py`` checks the
    lane against the full scan). Call :meth:`touch` after every placement on the replay."""

    def __init__(self, rep: Replay):
        self.rep = rep
        self.indexes: dict[int, tuple[list[Group], placement_index.GroupIndex]] = {}

    def positions(self, j: PlanJob) -> tuple[list[Group], Sequence[int]]:
        groups = self.rep.job_groups(j)
        if not placement_index.enabled(len(groups)):
            return groups, range(len(groups))
        hit = self.indexes.get(id(groups))
        if hit is None:  # the list object is the replay's cache entry: alive as long as the replay
            hit = self.indexes[id(groups)] = (groups, placement_index.GroupIndex(self.rep, groups))
        return groups, hit[1].positions(self.rep.ready(j))

    def touch(self, gpus: Sequence[str]) -> None:
        for _groups_list, index in self.indexes.values():
            index.touch(gpus)


def _groups(rep: Replay, j: PlanJob, start_by: float | None = None,
            cands: _Candidates | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(strict priority's group: earliest start, ties: shortest transition, then group
    order; the lane's group: earliest completion, ties: earliest start, among the groups
    where ``j`` starts by ``start_by`` when given — strict priority's group always does
    when ``start_by`` is at least its start) of ``j`` on ``rep``."""
    ep = rep.endpoints[j.endpoint]
    r = rep.ready(j)
    groups, at = cands.positions(j) if cands is not None else (rep.job_groups(j), range(len(rep.job_groups(j))))
    cand = [(max(r, rep.group_free(groups[i])), rep.transition_s(groups[i], ep), i, groups[i]) for i in at]
    strict = min(cand, key=lambda c: (c[0], c[1], c[2]))
    if start_by is not None:
        cand = [c for c in cand if c[0] <= start_by + TOL_S] or [strict]
    best = min(cand, key=lambda c: (c[0] + c[1], c[0], c[2]))[3]
    return strict[3], best


def enforce(p: Plan, batch: Sequence[PlanJob], state: FleetState, levels: Levels = DEFAULT_LANE_LEVELS,
            slack_s: float = 0.0, objective: str = "weighted_completion",
            replan: Replan | None = None, start_grace_s: Grace | None = None) -> tuple[Plan, int]:
    """``p`` with no lane job completing after its allowed completion + ``slack_s`` (module
    doc), and how many lane jobs ``p`` had completing later (0: ``p`` returned unchanged).
    ``p`` must be a plan of ``batch`` on ``state``; one with preemptions is returned as is.
    The rebuilt plan has no restores (plan them after) and is scored with ``objective``.

    ``levels``: the lane's levels, or level -> factor f ≥ 1 (module doc: a lane job is
    late when its planned completion is past release + f × (strict-priority completion −
    release); f = 1 for a plain sequence); a late plan is rebuilt with the late lane jobs
    forced first (module doc; ``stats['fast_lane_forced']``: how many).

    ``replan(jobs, state)``: a policy (without preemption) that plans the jobs not forced on
    the state the forced placements leave (:func:`makespan.planner.replay.state_after`);
    when given, the forced placements plus its plan compete with the rebuilt list schedule
    and the lower score is kept if no lane job is late in it
    (``stats['fast_lane_replanned']`` = 1 when the replan won) — except when ``p`` holds an
    aged job's reservation (``stats['reserved']``): the replan does not know it, so only the
    rebuild, in ``p``'s order, is kept.

    Returns ``(plan, late)``; ``plan.stats['fast_lane_late']`` = ``late`` when rebuilt."""
    if not levels or not batch or p.preemptions:
        return p, 0
    _rep, lane, allowed = lane_plan(batch, state, levels, start_grace_s)
    if not lane:
        return p, 0
    jobs = {j.id: j for j in batch}
    lim = {jid: t + slack_s + TOL_S for jid, t in allowed.items()}
    by_start = {a.job_id for a in lane if jobs[a.job_id].priority in (start_grace_s or {})}  # bounded on start

    def late_in(q: Plan) -> set[str]:
        mine = q.by_job()
        return {a.job_id for a in lane if a.job_id not in mine
                or (mine[a.job_id].start_s if a.job_id in by_start else mine[a.job_id].end_s) > lim[a.job_id]}
    late = late_in(p)
    if not late:
        return p, 0
    n_late = len(late)
    forced: set[str] = set()
    start_by = {k: allowed[k] for k in by_start}
    choice: dict[str, tuple[str, ...]] = {}  # forced job -> group other than the lane's (the search below)

    def rebuild(chosen: dict[str, tuple[str, ...]]) -> tuple[list[Assignment], Plan | None]:
        rep, first = _forced(lane, forced, jobs, state, start_by, chosen)
        out = list(first)
        for a in sorted(p.assignments, key=lambda a: (a.start_s, a.end_s)):
            if a.job_id not in forced:
                out.append(rep.place(jobs[a.job_id], tuple(a.gpus)))
        return first, evaluate_retimed(out, batch, state, p.policy, objective)
    ev = p
    for _ in range(len(lane)):  # force the late lane jobs first; repeat while the rebuild makes others late
        forced |= late
        first, rebuilt = rebuild(choice)
        if rebuilt is None:  # no consistent rebuild (evaluate_retimed): the policy's plan, feasible, stands
            p.stats["fast_lane_late"] = float(n_late)
            p.stats["fast_lane_unrebuilt"] = 1.0
            return p, n_late
        ev = rebuilt
        late = late_in(ev)
        if not late:
            break
    if not late:  # a start-bounded forced job: the group (of those it starts on in time) the rest loses least on
        trials = TRIAL_BUDGET
        for jid in [a.job_id for a in lane if a.job_id in forced and a.job_id in by_start]:
            if trials <= 0:
                break
            for g in _start_groups(lane, forced, jobs, state, start_by, choice, jid)[:min(GROUP_TRIALS, trials)]:
                trials -= 1
                trial_first, trial = rebuild({**choice, jid: g})
                if trial is not None and score(trial) < score(ev) - TOL_S and not late_in(trial):
                    choice, first, ev = {**choice, jid: g}, trial_first, trial
    rest = [j for j in batch if j.id not in forced]
    reserved = bool(p.stats.get("reserved"))  # a reservation in p (makespan.planner.reservation.enforce)
    # the replan is a fresh plan of the rest that knows nothing of the reservation: with one,
    # only the rebuild (p's order, the reservation's backfill and deferrals kept) competes
    if replan is not None and rest and not late and not reserved:
        q = replan(rest, state_after(state, jobs, first, forced))
        if not q.preemptions:
            alt = evaluate_retimed(list(first) + list(q.assignments), batch, state, p.policy, objective)
            if alt is not None and score(alt) < score(ev) and not late_in(alt):
                alt.stats["fast_lane_replanned"] = 1.0
                ev = alt
    ev.stats["fast_lane_late"] = float(n_late)
    ev.stats["fast_lane_forced"] = float(len(forced))
    if reserved:
        ev.stats["reserved"] = 1.0
    return ev, n_late


def _start_groups(lane: list[Assignment], forced: set[str], jobs: dict[str, PlanJob], state: FleetState,
                  start_by: dict[str, float], choice: dict[str, tuple[str, ...]],
                  job_id: str) -> list[tuple[str, ...]]:
    """The groups other than its current one on which the forced lane job ``job_id``
    starts by its allowed start, after the forced jobs before it: earliest completion first."""
    rep = Replay(state)
    for a in lane:
        if a.job_id not in forced:
            continue
        j = jobs[a.job_id]
        current = choice.get(j.id) or _groups(rep, j, start_by.get(j.id))[1]
        if j.id == job_id:
            ep, r = rep.endpoints[j.endpoint], rep.ready(j)
            cand = [(max(r, rep.group_free(g)) + rep.transition_s(g, ep), i, g) for i, g in enumerate(rep.job_groups(j))
                    if g != current and max(r, rep.group_free(g)) <= start_by[j.id] + TOL_S]
            return [c[2] for c in sorted(cand)]
        rep.place(j, current)
    return []


def _forced(lane: list[Assignment], forced: set[str], jobs: dict[str, PlanJob], state: FleetState,
            start_by: dict[str, float],
            choice: dict[str, tuple[str, ...]] | None = None) -> tuple[Replay, list[Assignment]]:
    """The ``forced`` lane jobs alone, in lane order, each on the group where it completes
    first (a job in ``start_by``: among those where it starts by then): the replay after
    them and their assignments (each completes, or starts, by its allowed time: no more lane
    jobs are ahead of it than in :func:`lane_plan`)."""
    rep = Replay(state)
    cands = _Candidates(rep)
    out = []
    for a in lane:
        if a.job_id in forced:
            j = jobs[a.job_id]
            g = (choice or {}).get(j.id) or _groups(rep, j, start_by.get(j.id), cands)[1]
            out.append(rep.place(j, g))
            cands.touch(g)
    return rep, out
