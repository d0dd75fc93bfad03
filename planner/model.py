"""Planning data types. Pure dataclasses, no I/O, no Redis.

Time is in workload seconds on one clock (``FleetState.now_s``); the live system and
the simulator both translate to and from it.

A job holds its GPU group exclusively from the start of its transitions (evict of
whatever else is resident on those GPUs, then cold start or wake of its endpoint)
until its service ends; the endpoint then stays resident ("warm") on the group until
something else evicts it. ``EndpointModel.slots`` is the request concurrency of one
instance (request leases inside the execute phase), not a count of co-located jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from makespan.errors import PlannerError


@dataclass(frozen=True)
class EndpointModel:
    """What the planner needs to know about an endpoint.

    Attributes:
        name: endpoint name.
        tp: tensor-parallel size = GPUs per instance (a gang).
        memory_mib: memory needed on each GPU of the group, MiB.
        cold_start_s: time to load the model on a group, s.
        evict_s: time to stop an instance and free its GPUs, s.
        wake_s: time to wake a sleeping instance (vLLM sleep mode), s; None if no sleep mode.
        slots: request concurrency of one instance.
        asleep_gpu_mib: GPU memory a sleeping instance still holds on each of its GPUs,
            MiB (small but not zero: CUDA context, buffers); 0: not modelled.
        asleep_ram_mib: host RAM a sleeping instance holds (level 1 keeps its weights
            there; level 2: 0), MiB, against its host's budget (``FleetState.host_ram_mib``).
        sleep_options: the sleep levels the plan may choose among for a displaced
            instance (issue 20 point 3), each ``(level, wake_s, host RAM MiB held)``, level
            1 or 2, wake in s; the first is the level a sleeper of unknown level is assumed
            at. Empty (the default): no choice, the fixed rule (every displaced instance
            that fits sleeps at the endpoint's one level, ``wake_s``/``asleep_ram_mib``).
            Chosen by :func:`makespan.planner.sleepers.choose_level`.
    """

    name: str
    tp: int
    memory_mib: int
    cold_start_s: float
    evict_s: float
    wake_s: float | None = None
    slots: int = 1
    asleep_gpu_mib: int = 0
    asleep_ram_mib: int = 0
    sleep_options: tuple[tuple[int, float, int], ...] = ()


@dataclass(frozen=True)
class PlanJob:
    """A job as the planner sees it.

    Attributes:
        id: job id.
        endpoint: endpoint name.
        weight: priority weight w_j (8, 4, 2, 1).
        release_s: submission time r_j, s.
        service_s: estimated service time p_j, s (transitions excluded).
        priority: level index 0..3 (0 = CRITICAL).
        deps: ids of jobs that must complete before this one starts (workload DAG).
        deadline_s: absolute due time, s, or None.
        seq: submission sequence number (FIFO tie-break).
        helpers: endpoints the job needs beside ``endpoint``, started on its GPUs after it
            and stopped after execute (a workload function's ``helpers``): each placement
            pays their cold starts and their memory must fit beside ``endpoint``
            (:mod:`makespan.planner.helpers`); empty: none.
        hosts: the hosts the job may run on (a workload function's: those whose live GPU
            worker registers it); empty: any host.
    """

    id: str
    endpoint: str
    weight: float
    release_s: float
    service_s: float
    priority: int = 2
    deps: tuple[str, ...] = ()
    deadline_s: float | None = None
    seq: int = 0
    helpers: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()

    @property
    def narrowed(self) -> bool:
        """Whether its groups are fewer than its endpoint's (helpers to fit, or hosts named):
        :meth:`makespan.planner.replay.Replay.job_groups` then filters them."""
        return bool(self.helpers or self.hosts)


@dataclass(frozen=True)
class Gpu:
    uuid: str
    host: str
    index: int
    memory_mib: int


@dataclass(frozen=True)
class RunningJob:
    """A job holding GPUs at planning time (a preemption candidate's holder).

    Attributes:
        job: the job as submitted (id, endpoint, weight, release_s, service_s, priority,
            seq, deadline_s); a preempted job goes back to the batch as this job, restarting
            from zero.
        gpus: the GPU group it holds.
        start_s: when it took the group (transitions began), s.
        service_start_s: when its service starts / started (``start_s`` + transition), s.
        end_s: its (estimated) completion, s.
        preemptable: False for anything that must not be cut short (a job that only has
            to clear, one other jobs depend on, one not started yet, ...).
    """

    job: PlanJob
    gpus: tuple[str, ...]
    start_s: float
    service_start_s: float
    end_s: float
    preemptable: bool = True

    @property
    def id(self) -> str:
        return self.job.id

    @property
    def priority(self) -> int:
        return self.job.priority

    @property
    def weight(self) -> float:
        return self.job.weight


@dataclass
class FleetState:
    """The fleet as the planner sees it at ``now_s``.

    Attributes:
        now_s: planning time, s.
        gpus: every GPU of the fleet, in host then index order.
        endpoints: endpoint name -> model.
        free_at: GPU uuid -> time it becomes free (<= now_s when free now).
        resident: GPU uuid -> endpoint loaded on it (None or absent: nothing).
        set_point: GPU uuid -> endpoint resident at the set point.
        done: ids of jobs already completed (for precedence).
        end_of: job id -> completion time of jobs running or planned earlier (precedence).
        asleep: GPU uuid -> endpoints sleeping there (sleep mode: reloading them is a
            wake, ``wake_s``, instead of a cold start).
        demand: endpoint -> weight of its recent arrivals per planning window (the
            future-cost term: evicting the last instance of an endpoint in demand costs
            about that weight × its cold start).
        demand_share: endpoint -> share of the GPU-seconds of recent arrivals (sums to 1;
            empty: unknown). When given, the future-cost term charges every endpoint's
            shortfall of resident GPUs against its share of the fleet (module
            :mod:`makespan.planner.evaluator`), not only the loss of its last instance.
        running: GPU uuid -> the job running (or in its transition) there now, for
            preemption decided inside the plan (:mod:`makespan.planner.preemption_plan`); empty:
            unknown, no plan-level preemption. A GPU absent from it holds nothing that
            may be preempted (free, a restore, ...). ``free_at``/``resident`` already
            describe these jobs; ``running`` only says who they are.
        host_ram_mib: host name -> host RAM sleepers may hold there, MiB (the fleet file's
            ``host_memory_mib``); a host absent from it: no budget. An instance that would
            go to sleep beyond the budget is stopped instead (:mod:`makespan.planner.replay`).
        set_point_weight: score per GPU-second a set-point instance is absent within the
            plan's horizon (weight·s per GPU-s, ≥ 0; 0, the default: not weighed, every plan
            as before). Absence of an instance: from when it stops being resident (``now_s``
            if it is absent already, else the start of the first transition that evicts
            it) to the end of its restore as :func:`makespan.planner.restore.plan_restores` places
            it with ``at="group"``; an instance never displaced counts 0
            (:func:`makespan.planner.restore.planned_absence`, :mod:`makespan.planner.evaluator`).
            Raises PlannerError when negative or not finite.
        asleep_level: (GPU uuid, endpoint) -> the sleep level (1 or 2) of that sleeper; absent:
            the first of the endpoint's ``sleep_options`` (only read for endpoints with options).
        upcoming: endpoint -> ``(release_s, weight)`` of the batch's jobs of that endpoint,
            the forecast of needing it again that the transition choice reads
            (:func:`makespan.planner.sleepers.with_upcoming` fills it from the batch;
            empty: the recent ``demand`` only).
        transition_rule: ``"score"`` (the default): the plan chooses sleep level 1, level 2
            or stop for each displaced instance of an endpoint with ``sleep_options``
            (:func:`makespan.planner.sleepers.choose_level`); ``"stop"``: such instances are
            stopped (the fixed baselines ``fifo`` and ``min-evict``, set by
            :func:`makespan.planner.api.plan`). Endpoints without options keep the fixed rule.
    """

    now_s: float
    gpus: list[Gpu]
    endpoints: dict[str, EndpointModel]
    free_at: dict[str, float] = field(default_factory=dict)
    resident: dict[str, str | None] = field(default_factory=dict)
    set_point: dict[str, str] = field(default_factory=dict)
    done: frozenset[str] = frozenset()
    end_of: dict[str, float] = field(default_factory=dict)
    asleep: dict[str, frozenset[str]] = field(default_factory=dict)
    demand: dict[str, float] = field(default_factory=dict)
    demand_share: dict[str, float] = field(default_factory=dict)
    running: dict[str, RunningJob] = field(default_factory=dict)
    set_point_weight: float = 0.0
    host_ram_mib: dict[str, int] = field(default_factory=dict)
    asleep_level: dict[tuple[str, str], int] = field(default_factory=dict)
    upcoming: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    transition_rule: str = "score"
    _groups_cache: dict[tuple[int, int, int, int], list[tuple[str, ...]]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        w = self.set_point_weight
        if not (0.0 <= w < math.inf):  # NaN fails too
            raise PlannerError(f"set_point_weight must be a finite number >= 0 (score per absent "
                               f"set-point GPU-second), got {w!r}")

    def __getstate__(self) -> dict:
        """Pickled (to the live improver's child process) without ``_groups_cache``: its
        keys hold ``id(self.gpus)``, which means nothing in another process."""
        state = self.__dict__.copy()
        state["_groups_cache"] = {}
        return state

    def hosts(self) -> dict[str, list[Gpu]]:
        out: dict[str, list[Gpu]] = {}
        for g in self.gpus:
            out.setdefault(g.host, []).append(g)
        for gs in out.values():
            gs.sort(key=lambda g: g.index)
        return out

    def groups(self, tp: int, memory_mib: int = 0) -> list[tuple[str, ...]]:
        """Aligned GPU groups of size ``tp`` within one host ({0,1},{2,3} for TP 2 ...),
        each GPU with at least ``memory_mib``. Hosts whose GPU count is not a multiple of
        ``tp`` contribute their aligned groups only. Cached per (tp, memory) for this GPU
        list (a new list, not one edited in place, is a new fleet); returns a new list."""
        key = (tp, memory_mib, id(self.gpus), len(self.gpus))
        hit = self._groups_cache.get(key)
        if hit is None:
            hit = self._groups_cache[key] = self._aligned_groups(tp, memory_mib)
        return list(hit)

    def _aligned_groups(self, tp: int, memory_mib: int) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        for _host, gs in self.hosts().items():
            for start in range(0, len(gs) - tp + 1, tp):
                grp = gs[start:start + tp]
                if all(g.memory_mib >= memory_mib for g in grp):
                    out.append(tuple(g.uuid for g in grp))
        return out


@dataclass(frozen=True)
class Assignment:
    """One job placed on one GPU group.

    ``start_s`` is when the group is taken (transitions begin); ``service_start_s`` =
    ``start_s + transition_s``; ``end_s`` = ``service_start_s + service_s`` = C_j.
    ``evicts`` lists the endpoints evicted from the group first; ``load`` is
    ``"cold_start"``, ``"wake"`` or ``"warm"`` (already resident). ``sleep_levels``: for
    evicted endpoints with ``sleep_options``, ``(endpoint, level)`` with the level the plan
    chose (0: stopped), sorted; empty for the fixed rule (the worker then uses the fleet
    file's ``sleep_level``)."""

    job_id: str
    gpus: tuple[str, ...]
    start_s: float
    service_start_s: float
    end_s: float
    evicts: tuple[str, ...] = ()
    load: str = "warm"
    sleep_levels: tuple[tuple[str, int], ...] = field(default=(), repr=False, compare=False)

    @property
    def transition_s(self) -> float:
        return self.service_start_s - self.start_s


@dataclass(frozen=True)
class PlannedPreemption:
    """One preemption decided by a plan: at ``at_s`` the running ``victims`` (job ids,
    sorted) are cut and requeued, and ``job_id`` takes ``gpus`` at once (committed there,
    so no victim is placed on those GPUs before it starts). ``gain`` = how much the plan
    score dropped by taking it (objective units, weight·s), > 0; ``rule``: taken by the fast
    lane as strict priority's preemption rule would (:func:`makespan.planner.fast_lane.rule_preemptions`),
    not by score (``gain`` 0)."""

    job_id: str
    victims: tuple[str, ...]
    gpus: tuple[str, ...]
    at_s: float
    gain: float = 0.0
    rule: bool = False


@dataclass
class Plan:
    """A complete plan for a batch: one assignment per job, in start order.

    ``objective`` is Σ w_j (C_j − r_j) in weight·seconds as scored by the evaluator.
    ``restores``: set-point restores planned after the last job on their GPUs
    (:mod:`makespan.planner.restore`; ``job_id`` ``"restore:<endpoint>:<gpu>"``); empty unless
    asked for (:func:`makespan.planner.api.plan` ``restore_at``).

    ``preemptions`` (plan-level preemption, :mod:`makespan.planner.preemption_plan`): the
    preemptions the plan decided, in the order they apply at ``now_s``. Each preemptor's
    assignment (start ``now_s`` on the cleared group) and each victim's new assignment are
    in ``assignments``; such a plan is evaluated on the transformed state
    (:func:`makespan.planner.preemption_plan.evaluate_preemptive`)."""

    policy: str
    assignments: list[Assignment]
    objective: float = 0.0
    stats: dict[str, float] = field(default_factory=dict)
    restores: list[Assignment] = field(default_factory=list)
    preemptions: list[PlannedPreemption] = field(default_factory=list)

    def by_job(self) -> dict[str, Assignment]:
        return {a.job_id: a for a in self.assignments}
