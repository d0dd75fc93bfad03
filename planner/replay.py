"""The fleet's state while a plan is built or replayed: the one transition rule.

Every construction (greedy, CP-SAT decoding) and the evaluator place jobs through
:class:`Replay`, so they agree on transitions by construction.

Transition rule (a job holds its group exclusively from ``start_s`` to ``end_s``):
    * warm: every GPU of the group already holds the job's endpoint → 0 s;
    * otherwise evict every distinct endpoint resident on the group (in parallel:
      the largest ``evict_s`` counts; a partially resident copy of the job's own
      endpoint is evicted too), then load: a wake (``wake_s``) when the endpoint has a
      sleep mode and is asleep on every GPU of the group, else a cold start;
    * an evicted endpoint with a sleep mode goes to sleep on the GPUs it left, if what a
      sleeper holds fits (host RAM against its host's budget, GPU memory beside the new
      resident and the other sleepers); else it is stopped. Loading an endpoint on a GPU
      stops the sleepers that no longer fit beside it (:mod:`makespan.planner.sleepers`;
      only where some endpoint holds something asleep or a host has a RAM budget).
    * the transition choice (issue 20 point 3): a displaced endpoint with
      ``sleep_options`` sleeps at the level :func:`makespan.planner.sleepers.choose_level`
      scores best, or is stopped (``FleetState.transition_rule`` ``"stop"``: always
      stopped); its wake then costs that level's ``wake_s`` and, at level 1, its RAM counts
      against the host's budget. A set-point endpoint displaced from its set-point GPUs
      counts its certain restore as need (a restore then wakes it instead of a cold start).
      The choice is made where the instance is displaced, so every construction and the
      evaluator make the same one.
    * a job with ``helpers`` (:mod:`makespan.planner.helpers`) then pays their cold starts
      as part of its transition (the main endpoint's load kind is unchanged, "warm"
      included) and is placed only on groups where they fit beside it
      (:meth:`Replay.job_groups`).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from makespan.planner.helpers import fitting_groups, helpers_start_s, need_mib
from makespan.planner.model import Assignment, EndpointModel, FleetState, Gpu, PlanJob
from makespan.planner.sleepers import SET_POINT_NEED_WEIGHT, choose_level, forecast_weight, may_sleep, sleepers_kept

Group = tuple[str, ...]


_NOTHING: frozenset[str] = frozenset()
_LAYOUTS: dict[int, tuple[list[Gpu], tuple[list[str], dict[str, int], dict[str, str]]]] = {}
_LAYOUTS_MAX = 8


def _layout(gpus: list[Gpu]) -> tuple[list[str], dict[str, int], dict[str, str]]:
    """(uuids in fleet order, GPU -> memory MiB, GPU -> host) of a fleet's GPU list,
    read-only; cached for the last :data:`_LAYOUTS_MAX` lists by identity (as
    :meth:`FleetState.groups`: a new list, not one edited in place, is a new fleet; the
    entry holds the list, so its id is not reused while cached)."""
    hit = _LAYOUTS.get(id(gpus))
    if hit is not None and hit[0] is gpus and len(hit[1][0]) == len(gpus):
        return hit[1]
    out = ([g.uuid for g in gpus], {g.uuid: g.memory_mib for g in gpus}, {g.uuid: g.host for g in gpus})
    if len(_LAYOUTS) >= _LAYOUTS_MAX:
        del _LAYOUTS[next(iter(_LAYOUTS))]
    _LAYOUTS[id(gpus)] = (gpus, out)
    return out


class Replay:
    """Mutable copy of a :class:`FleetState` that jobs are placed into, in start order."""

    __slots__ = ("state", "endpoints", "free_at", "resident", "asleep", "end_of", "count", "_groups", "_group_at",
                 "_whole", "ram_used", "_costed", "_mem", "_host", "level", "_job_groups")

    def __init__(self, state: FleetState):
        self.state = state
        self.endpoints = state.endpoints
        now = state.now_s
        uuids, self._mem, self._host = _layout(state.gpus)
        # GPU -> max(state's free time, now), resident (None: nothing), asleep; built from
        # defaults and the state's entries (fleet order, as a comprehension over the GPUs)
        self.free_at = dict.fromkeys(uuids, now)
        for u, f in state.free_at.items():
            if f > now and u in self.free_at:
                self.free_at[u] = f
        self.resident: dict[str, str | None] = dict.fromkeys(uuids)
        for u, r in state.resident.items():
            if u in self.resident:
                self.resident[u] = r
        self.asleep: dict[str, frozenset[str]] = dict.fromkeys(uuids, _NOTHING)
        for u, names in state.asleep.items():
            if u in self.asleep:
                self.asleep[u] = frozenset(names)
        # completion times placed here, over the state's (not copied: O(1) per replay even
        # when the simulator's history holds 100k jobs)
        self.end_of: ChainMap[str, float] = ChainMap({}, state.end_of)
        self.count: dict[str, int] = {}
        for e in self.resident.values():
            if e is not None:
                self.count[e] = self.count.get(e, 0) + 1
        self._groups: dict[tuple[int, int], list[Group]] = {}
        self._group_at: dict[tuple[int, int], dict[str, Group]] = {}
        # (endpoint, helpers, hosts) -> its groups where the helpers fit too, on those hosts (job_groups)
        self._job_groups: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[Group]] = {}
        self._whole: dict[str, int] = {}  # whole_gpus of TP > 1 endpoints; entries dropped by _load
        # what sleepers hold (makespan.planner.sleepers): modelled only where something is held
        self._costed = bool(state.host_ram_mib) or any(
            e.asleep_gpu_mib or e.asleep_ram_mib for e in state.endpoints.values())
        self.ram_used: dict[str, float] = {}  # host -> RAM its sleepers hold, MiB
        # (GPU, endpoint) -> sleep level of sleepers of endpoints with sleep_options
        self.level: dict[tuple[str, str], int] = dict(state.asleep_level)
        if self._costed:
            for u, names in self.asleep.items():
                for e in names:
                    self.ram_used[self._host[u]] = self.ram_used.get(self._host[u], 0.0) + self._ram_share(e, u)

    def copy(self) -> Replay:
        r = Replay.__new__(Replay)
        r.state, r.endpoints = self.state, self.endpoints
        r.free_at, r.resident, r.asleep = dict(self.free_at), dict(self.resident), dict(self.asleep)
        r.end_of, r.count, r._groups = ChainMap(dict(self.end_of.maps[0]), *self.end_of.maps[1:]), dict(self.count), self._groups
        r._group_at, r._whole, r._job_groups = self._group_at, dict(self._whole), self._job_groups
        r.ram_used, r._costed, r._mem, r._host = dict(self.ram_used), self._costed, self._mem, self._host
        r.level = dict(self.level)
        return r

    def _option(self, u: str, ep: EndpointModel) -> tuple[int, float, int]:
        """The ``sleep_options`` entry of ``ep`` sleeping on GPU ``u`` (its level's)."""
        level = self.level.get((u, ep.name))
        for option in ep.sleep_options:
            if option[0] == level:
                return option
        return ep.sleep_options[0]

    def _ram_share(self, endpoint: str, u: str | None = None) -> float:
        """Host RAM one GPU's part of a sleeping ``endpoint`` instance (on GPU ``u``) holds, MiB."""
        ep = self.endpoints.get(endpoint)
        if ep is None:
            return 0.0
        if ep.sleep_options and u is not None:
            return self._option(u, ep)[2] / ep.tp
        return ep.asleep_ram_mib / ep.tp

    def _wake_s(self, u: str, ep: EndpointModel) -> float:
        """Wake time of ``ep`` sleeping on GPU ``u``, s (its level's with ``sleep_options``)."""
        if ep.sleep_options:
            return self._option(u, ep)[1]
        return ep.wake_s  # type: ignore[return-value]

    def group_wake_s(self, group: Group, ep: EndpointModel) -> float:
        """Wake time of ``ep`` asleep on every GPU of ``group``, s: with ``sleep_options``
        the wake of the level it sleeps at (the slowest GPU's), else its ``wake_s``."""
        return max(self._wake_s(u, ep) for u in group) if ep.sleep_options else ep.wake_s  # type: ignore[return-value]

    def _drop_asleep(self, u: str, endpoint: str) -> None:
        """``endpoint`` no longer sleeps on GPU ``u`` (woken, stopped or abandoned)."""
        if endpoint in self.asleep[u]:
            self.asleep[u] = self.asleep[u] - {endpoint}
            if self._costed:
                h = self._host[u]
                self.ram_used[h] = self.ram_used.get(h, 0.0) - self._ram_share(endpoint, u)
            self.level.pop((u, endpoint), None)

    def _choose(self, oep: EndpointModel, at_s: float | None, fits: Callable[[int, float], bool],
                gpus: Sequence[str] = ()) -> int:
        """The level (0: stop) the displaced ``oep`` goes to at ``at_s``: the transition
        choice (module doc); ``fits(level, ram_mib)``: what it holds fits there; ``gpus``:
        the GPUs it leaves (where it is their set point, its restore is certain need:
        :data:`makespan.planner.sleepers.SET_POINT_NEED_WEIGHT`)."""
        st = self.state
        if st.transition_rule == "stop":
            return 0
        now = st.now_s
        need = forecast_weight(oep.name, now if at_s is None else at_s, now, st.demand, st.upcoming)
        if any(st.set_point.get(u) == oep.name for u in gpus):
            need += SET_POINT_NEED_WEIGHT
        return choose_level(oep.sleep_options, oep.cold_start_s, oep.asleep_gpu_mib * oep.tp, need, fits)

    def groups(self, ep: EndpointModel) -> list[Group]:
        key = (ep.tp, ep.memory_mib)
        if key not in self._groups:
            self._groups[key] = self.state.groups(ep.tp, ep.memory_mib)
        return self._groups[key]

    def job_groups(self, job: PlanJob) -> list[Group]:
        """The groups ``job`` may take: its endpoint's (:meth:`groups`), less those where its
        helpers do not fit beside it (:func:`makespan.planner.helpers.group_fits`) and, when
        it names ``hosts``, those on other hosts; the same list object as :meth:`groups` for
        a job without either. Read-only."""
        ep = self.endpoints[job.endpoint]
        if not job.narrowed:
            return self.groups(ep)
        key = (job.endpoint, job.helpers, job.hosts)
        hit = self._job_groups.get(key)
        if hit is None:
            groups = self.groups(ep)
            if job.hosts:
                groups = [g for g in groups if self._host[g[0]] in job.hosts]
            if job.helpers:
                groups = fitting_groups(groups, ep, job.helpers, self.endpoints, self._mem)
            hit = self._job_groups[key] = groups
        return hit

    def ready(self, job: PlanJob) -> float:
        """Earliest start allowed by release, planning time and dependencies."""
        now = self.state.now_s
        t = max(job.release_s, now)
        if job.deps:
            for d in job.deps:
                t = max(t, self.end_of.get(d, now))
        return t

    def group_free(self, group: Group) -> float:
        if len(group) == 1:
            return self.free_at[group[0]]
        return max(self.free_at[u] for u in group)

    def transition_s(self, group: Group, ep: EndpointModel) -> float:
        """Transition time only (fast path of :meth:`transition` for single GPUs)."""
        if len(group) == 1:
            u = group[0]
            r = self.resident[u]
            if r == ep.name:
                return 0.0
            ev = self.endpoints[r].evict_s if r is not None and r in self.endpoints else 0.0
            if ep.wake_s is not None and ep.name in self.asleep[u]:
                return ev + (self._wake_s(u, ep) if ep.sleep_options else ep.wake_s)
            return ev + ep.cold_start_s
        return self.transition(group, ep)[0]

    def transition(self, group: Group, ep: EndpointModel) -> tuple[float, tuple[str, ...], str, float]:
        """(transition_s, evicted endpoints, load kind, evict part in s) of ``ep`` on ``group``."""
        res = self.resident
        name = ep.name
        first = res[group[0]]
        if len(group) == 1:  # the same rule without the sets (a hot path)
            if first == name:
                return 0.0, (), "warm", 0.0
            ev = self.endpoints[first].evict_s if first is not None and first in self.endpoints else 0.0
            gone: tuple[str, ...] = () if first is None else (first,)
            if ep.wake_s is not None and name in self.asleep[group[0]]:
                return ev + (self._wake_s(group[0], ep) if ep.sleep_options else ep.wake_s), gone, "wake", ev
            return ev + ep.cold_start_s, gone, "cold_start", ev
        if first == name and all(res[u] == name for u in group):
            return 0.0, (), "warm", 0.0
        evicted = {res[u] for u in group} - {None}
        evict_s = max((self.endpoints[e].evict_s for e in evicted if e in self.endpoints), default=0.0)
        if ep.wake_s is not None and all(name in self.asleep[u] for u in group):
            return evict_s + self.group_wake_s(group, ep), tuple(sorted(evicted)), "wake", evict_s  # type: ignore[arg-type]
        return evict_s + ep.cold_start_s, tuple(sorted(evicted)), "cold_start", evict_s  # type: ignore[arg-type]

    def place(self, job: PlanJob, group: Group, start_s: float | None = None) -> Assignment:
        """Place ``job`` on ``group`` at ``start_s`` (default: earliest feasible) and update
        the state. The caller checks feasibility of an explicit ``start_s``."""
        ep = self.endpoints[job.endpoint]
        if start_s is None:
            start_s = max(self.ready(job), self.group_free(group))
        levels: tuple[tuple[str, int], ...] = ()
        evicted: tuple[str, ...]
        if len(group) == 1 and self.resident[group[0]] == ep.name:  # warm single GPU: the common case
            t_s, evicted, load = 0.0, (), "warm"
        else:
            t_s, evicted, load, _ = self.transition(group, ep)
            if load != "warm":
                levels = self._load(group, ep.name, start_s, self._helper_need(job, ep))
        if job.helpers:  # started after the main endpoint, in every placement
            t_s += helpers_start_s(job.helpers, self.endpoints)
            if load == "warm" and self._costed:  # sleepers that do not fit beside main + helpers stop
                self._fit_sleepers(group, need_mib(ep, job.helpers, self.endpoints))
        svc = start_s + t_s
        end = svc + job.service_s
        a = Assignment(job.id, group, start_s, svc, end, evicted, load, levels) if levels else \
            Assignment(job.id, group, start_s, svc, end, evicted, load)
        fa = self.free_at
        for u in group:
            fa[u] = end
        self.end_of.maps[0][job.id] = end  # what ChainMap.__setitem__ does, without its call
        return a

    def _helper_need(self, job: PlanJob, ep: EndpointModel) -> tuple[int, ...] | None:
        """MiB per GPU of ``job``'s group while it runs with its helpers (group order), or
        None without helpers (the main endpoint's memory on each)."""
        return need_mib(ep, job.helpers, self.endpoints) if job.helpers else None

    def _load(self, group: Group, name: str | None, at_s: float | None = None,
              need: Sequence[int] | None = None) -> tuple[tuple[str, int], ...]:
        """``name`` becomes resident on ``group`` (None: nothing) at ``at_s`` (None: now);
        the evicted endpoints with a sleep mode go to sleep there (where what sleepers
        hold is modelled: if they fit, and sleepers that no longer fit beside ``name`` —
        and beside the job's helpers, ``need``: MiB per GPU in group order, from
        :func:`makespan.planner.helpers.need_mib` — are stopped; with ``sleep_options``: at
        the level chosen, or stopped). Returns the choice for the evicted endpoints with
        ``sleep_options``: sorted (endpoint, level, 0 = stopped)."""
        if self._costed:
            return self._load_costed(group, name, at_s, need)
        chosen: dict[str, int] = {}
        for u in group:
            old = self.resident[u]
            if old == name:
                continue
            wh = self._whole
            if wh:
                wh.pop(old, None)  # type: ignore[arg-type]
                wh.pop(name, None)  # type: ignore[arg-type]
            if old is not None:
                self.count[old] -= 1
                oep = self.endpoints.get(old)
                if oep is not None and oep.wake_s is not None:
                    if not oep.sleep_options:
                        self.asleep[u] = self.asleep[u] | {old}
                    else:
                        if old not in chosen:
                            chosen[old] = self._choose(oep, at_s, lambda level, ram_mib: True, (u,))
                        if chosen[old]:
                            self.asleep[u] = self.asleep[u] | {old}
                            self.level[(u, old)] = chosen[old]
            self.resident[u] = name
            if name is not None:
                self.count[name] = self.count.get(name, 0) + 1
                if name in self.asleep[u]:
                    self.asleep[u] = self.asleep[u] - {name}
                    self.level.pop((u, name), None)
        return tuple(sorted(chosen.items())) if chosen else ()

    def _load_costed(self, group: Group, name: str | None, at_s: float | None,
                     need: Sequence[int] | None = None) -> tuple[tuple[str, int], ...]:
        """:meth:`_load` with the memory sleepers hold (:mod:`makespan.planner.sleepers`)."""
        eps = self.endpoints
        going: dict[str, list[str]] = {}  # displaced endpoints with a sleep mode -> GPUs they left
        for u in group:
            old = self.resident[u]
            if old == name:
                continue
            wh = self._whole
            if wh:
                wh.pop(old, None)  # type: ignore[arg-type]
                wh.pop(name, None)  # type: ignore[arg-type]
            if old is not None:
                self.count[old] -= 1
                oep = eps.get(old)
                if oep is not None and oep.wake_s is not None:
                    going.setdefault(old, []).append(u)
            self.resident[u] = name
            if name is not None:
                self.count[name] = self.count.get(name, 0) + 1
                self._drop_asleep(u, name)
        main = eps[name].memory_mib if name is not None and name in eps else 0
        room = self._fit_sleepers(group, need if need is not None else [main] * len(group))
        budgets = self.state.host_ram_mib
        chosen: dict[str, int] = {}
        for old in sorted(going):
            us, oep = going[old], eps[old]
            host = self._host[us[0]]
            if oep.sleep_options:
                used, budget, gpu_room = self.ram_used.get(host, 0.0), budgets.get(host), min(room[u] for u in us)

                def fits(_level: int, ram_mib: float, used: float = used, budget: int | None = budget,
                         oep: EndpointModel = oep, width: int = len(us), gpu_room: float = gpu_room) -> bool:
                    return may_sleep(used, budget, ram_mib / oep.tp * width, gpu_room, oep.asleep_gpu_mib)
                level = chosen[old] = self._choose(oep, at_s, fits, us)
                if level:
                    for u in us:
                        self.asleep[u] = self.asleep[u] | {old}
                        self.level[(u, old)] = level
                        room[u] -= oep.asleep_gpu_mib
                    self.ram_used[host] = used + self._ram_share(old, us[0]) * len(us)
                continue
            share = self._ram_share(old)
            if may_sleep(self.ram_used.get(host, 0.0), budgets.get(host), share * len(us),
                         min(room[u] for u in us), oep.asleep_gpu_mib):
                for u in us:
                    self.asleep[u] = self.asleep[u] | {old}
                    room[u] -= oep.asleep_gpu_mib
                self.ram_used[host] = self.ram_used.get(host, 0.0) + share * len(us)
        return tuple(sorted(chosen.items())) if chosen else ()

    def _fit_sleepers(self, group: Group, need: Sequence[int]) -> dict[str, float]:
        """Stop the sleepers of ``group`` that no longer fit beside ``need`` (MiB per GPU,
        group order; :func:`makespan.planner.sleepers.sleepers_kept`); returns the MiB each
        GPU has left for more sleepers."""
        eps = self.endpoints
        room: dict[str, float] = {}
        for u, mib in zip(group, need):
            held = {e: eps[e].asleep_gpu_mib for e in self.asleep[u] if e in eps}
            kept = sleepers_kept(self._mem[u] - mib, held)
            for e in set(held) - kept:
                self._drop_asleep(u, e)
            room[u] = self._mem[u] - mib - sum(held[e] for e in kept)
        return room

    def restore(self, group: Group, endpoint: str, start_s: float) -> Assignment:
        """Set-point restore of ``endpoint`` on ``group`` from ``start_s``: the transition
        rule above with no service (evict what is resident, then cold start or wake).
        Returns it as an :class:`Assignment` with ``job_id`` ``"restore:<endpoint>:<gpu>"``
        and ``end_s`` = ``service_start_s``; the GPUs are busy until then."""
        t_s, evicted, load, _ = self.transition(group, self.endpoints[endpoint])
        levels = self._load(group, endpoint, start_s) if load != "warm" else ()
        a = Assignment(f"restore:{endpoint}:{group[0]}", group, start_s, start_s + t_s, start_s + t_s, evicted, load,
                       levels)
        for u in group:
            self.free_at[u] = a.end_s
        return a

    def unplace(self, a: Assignment, at_s: float) -> None:
        """Cut the placed ``a`` short at ``at_s`` (preemption): its GPUs free at ``at_s``
        and its completion is forgotten. Cut during its transition, the group holds
        nothing afterwards (what it evicted is gone, its load was abandoned); cut in
        service, its endpoint stays resident. The caller ensures ``a`` is the last
        placement on its GPUs and ``a.start_s <= at_s < a.end_s``. The abandoned endpoint
        does not go to sleep there either (it never finished loading; the live preempt
        script forgets what is resident), as :func:`makespan.planner.preemption_plan.apply` assumes."""
        if at_s < a.service_start_s and a.load != "warm":
            abandoned = {u: self.resident[u] for u in a.gpus}
            self._load(a.gpus, None, at_s)
            for u, e in abandoned.items():
                if e is not None:
                    self._drop_asleep(u, e)
        for u in a.gpus:
            self.free_at[u] = at_s
        self.end_of.pop(a.job_id, None)

    def instances(self, endpoint: str) -> int:
        """GPUs currently holding ``endpoint`` (divide by its TP for whole instances)."""
        return self.count.get(endpoint, 0)

    def whole_gpus(self, endpoint: str) -> int:
        """GPUs in whole instances of ``endpoint``: aligned TP groups whose every GPU holds
        it (the rest of a TP > 1 instance that lost a GPU serves nothing)."""
        ep = self.endpoints.get(endpoint)
        if ep is None or ep.tp == 1:
            return self.count.get(endpoint, 0)
        n = self._whole.get(endpoint)
        if n is None:
            res = self.resident
            n = self._whole[endpoint] = ep.tp * sum(1 for g in self.groups(ep) if all(res[u] == endpoint for u in g))
        return n

    def whole_lost(self, group: Group, endpoint: str) -> int:
        """GPUs of whole ``endpoint`` instances that taking ``group`` for another endpoint breaks."""
        ep = self.endpoints.get(endpoint)
        res = self.resident
        if ep is None or ep.tp == 1:
            return sum(1 for u in group if res[u] == endpoint)
        key = (ep.tp, ep.memory_mib)
        at = self._group_at.get(key)
        if at is None:
            at = self._group_at[key] = {u: g for g in self.groups(ep) for u in g}
        if len(group) == 1:  # the same count for one GPU, without the set
            g = at.get(group[0])
            return ep.tp if g is not None and all(res[u] == endpoint for u in g) else 0
        hit = {at[u] for u in group if u in at}
        return ep.tp * sum(1 for g in hit if all(res[u] == endpoint for u in g))


def weighted_completion(assignments: Sequence[Assignment], jobs: dict[str, PlanJob]) -> float:
    """Σ w_j (C_j − r_j) over ``assignments``, weight·s."""
    return sum(jobs[a.job_id].weight * (a.end_s - jobs[a.job_id].release_s) for a in assignments)


def state_after(state: FleetState, jobs: dict[str, PlanJob], assignments: Sequence[Assignment],
                started: Collection[str], **changes: Any) -> FleetState:
    """``state`` after the assignments of ``started`` (job ids) are placed in start order
    (:meth:`Replay.place` at their ``start_s``): GPUs busy until their planned end, their
    endpoints resident, evicted endpoints asleep where they have a sleep mode, their
    completions in ``end_of``. ``changes``: other fields to set (``dataclasses.replace``).
    The live planner worker hands this state to its improver and to scored preemption."""
    rep = Replay(state)
    for a in sorted(assignments, key=lambda a: a.start_s):
        if a.job_id in started:
            rep.place(jobs[a.job_id], tuple(a.gpus), a.start_s)
    if rep.level:
        changes = {"asleep_level": dict(rep.level), **changes}
    return replace(state, free_at=dict(rep.free_at), resident=dict(rep.resident), end_of=dict(rep.end_of),
                   asleep=dict(rep.asleep), **changes)


def placeable_hosts(batch: list[PlanJob], state: FleetState) -> list[PlanJob]:
    """``batch`` with the ``hosts`` of each job dropped whose hosts hold none of its groups
    (its workload function's GPU workers run on hosts where its endpoint does not fit): such
    a job is planned as any other, and the GPU worker it reaches says why it cannot run it,
    rather than no plan at all. ``batch`` itself when no job names hosts."""
    if not any(job.hosts for job in batch):
        return batch
    rep = Replay(state)
    return [replace(job, hosts=()) if job.hosts and not rep.job_groups(job) else job for job in batch]

