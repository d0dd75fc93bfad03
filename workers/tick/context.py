"""What the planner tick's steps read and write, declared.

* :class:`Snapshot`: what a tick reads in one round trip (frozen);
* :class:`FormedBatch`: the batch and what forming it learned about the queues;
* :class:`TickEnv`: the worker's fixed parts (Redis, settings, fleet, stores, clock);
* :class:`CrossTickState`: the only state that lives from one tick to the next;
* :class:`TickContext`: one tick's data, passed explicitly to every step's ``run``.

Times: ``*_s`` fields on :class:`makespan.planner.model.FleetState` and plans are workload
seconds (wall seconds ÷ ``time_scale``); :meth:`TickEnv.now_s` is the workload clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING
from collections.abc import Callable, Mapping

import redis

from makespan.keys import Keys
from makespan.models import FleetSpec, Priority
from makespan.planner.model import EndpointModel, FleetState, Gpu, Plan, PlanJob
from makespan.settings import Settings
from makespan.workers.tick.claims import JobClaims
from makespan.workers.tick.clock import Clock

if TYPE_CHECKING:  # pragma: no cover - types only
    from celery import Celery

    from makespan.planner.reservation import Reservation
    from makespan.workers.agenda import AgendaTracker
    from makespan.workers.delayed import DelayedJobs
    from makespan.workers.host_liveness import Cordon
    from makespan.workers.improver import BackgroundImprover
    from makespan.workers.leases import LeaseStore
    from makespan.workers.phases import PhaseContext
    from makespan.workers.retention import Retention

Dispatch = Callable[["PhaseContext", str], None]  # (phase chain, host queue name): sends it


@dataclass(frozen=True)
class Snapshot:
    """What every tick reads, in one round trip (:func:`makespan.workers.fleet_view.read_snapshot`).

    ``gpu_holders`` and ``residents`` are in fleet order (:attr:`TickEnv.gpus`): a GPU
    key's ``lease id:token`` or None, a resident key's instance value or None."""

    expired_leases: tuple[str, ...]  # ids of leases expired on the Redis server's clock
    agenda_entries: int  # open agenda entries
    gpu_holders: tuple[str | None, ...]
    residents: tuple[str | None, ...]
    workloads_active: int  # active workloads (a workload pass may change the queues)
    queue_heads: Mapping[Priority, tuple[str, ...]]  # first batch_size ids of each queue, CRITICAL first
    down_hosts: frozenset[str] = frozenset()  # hosts without a live GPU worker (makespan.workers.host_liveness)
    gated_gpus: frozenset[str] = frozenset()  # UUIDs of the GPUs of down_hosts and cordoned_hosts
    # cordoned host -> its cordon (makespan.workers.host_liveness.Cordon): no new lease there
    cordoned_hosts: Mapping[str, Cordon] = field(default_factory=lambda: MappingProxyType({}))

    def held_gpus(self, gpus: tuple[Gpu, ...]) -> set[str]:
        """UUIDs of the GPUs a lease holds (``gpus``: the fleet order of the snapshot)."""
        return {gpu.uuid for gpu, holder in zip(gpus, self.gpu_holders) if holder}

    def unavailable_gpus(self, gpus: tuple[Gpu, ...]) -> set[str]:
        """The GPUs no new lease may take: those a lease holds and those of a host without a
        live GPU worker or cordoned (the host gate, :mod:`makespan.workers.host_liveness`)."""
        return self.held_gpus(gpus) | self.gated_gpus


@dataclass
class FormedBatch:
    """A batch (:func:`makespan.workers.batch.form_batch`) and what its scan learned.
    Written once by that function; read-only for the steps after it."""

    jobs: list[PlanJob] = field(default_factory=list)
    # job -> (traceparent, submitted unix s, waiting since unix s: its due time when it was delayed)
    meta: dict[str, tuple[str, float, float]] = field(default_factory=dict)
    own_level: dict[str, Priority] = field(default_factory=dict)  # job -> its submitted level (queue, lease)
    awaited: set[str] = field(default_factory=set)  # deps of the unready steps read (never victims)
    unready_level: dict[str, int] = field(default_factory=dict)  # dep -> highest level of a step waiting on it
    unready: dict[str, tuple[str, ...]] = field(default_factory=dict)  # unready step -> its deps
    left_out: dict[str, tuple[Priority, int]] = field(default_factory=dict)  # read, not taken -> (level, position)
    requeued: set[str] = field(default_factory=set)  # taken jobs whose record says they were preempted
    # read, not taken: no live GPU worker registers its function -> (function, the hosts that had it last)
    function_waits: dict[str, tuple[str, tuple[str, ...]]] = field(default_factory=dict)
    # read, not taken: no live GPU worker whose fleet file can run it -> the hosts whose workers cannot
    # (makespan.workers.worker_fleets; reason host_fleet_differs)
    fleet_waits: dict[str, str] = field(default_factory=dict)

    def read_waiting(self) -> bool:
        """Whether the scan read jobs it did not take whose wait reasons are written anyway
        (unready steps, jobs left out, jobs waiting for their function's worker or for a
        worker whose fleet file can run them)."""
        return bool(self.unready or self.left_out or self.function_waits or self.fleet_waits)


@dataclass(frozen=True)
class TickEnv:
    """The planner worker's fixed parts, shared by every tick (built once by the worker)."""

    r: redis.Redis
    settings: Settings
    fleet: FleetSpec
    keys: Keys
    leases: LeaseStore
    delayed: DelayedJobs
    retention: Retention
    agenda: AgendaTracker | None
    gpus: tuple[Gpu, ...]  # fleet order
    set_points: tuple[tuple[str, tuple[str, ...]], ...]  # (endpoint, GPU UUIDs) of each set-point instance
    clock: Clock
    dispatch: Dispatch | None = None  # None: makespan.workers.publish.dispatch through ``celery``
    whole_fleet: FleetSpec | None = None  # a pool's planner: the whole fleet file (fleet: its pool's part)

    @cached_property
    def celery(self) -> Celery:
        """The Celery app this planner publishes its phase chains through: the one of its own
        ``settings`` (:func:`makespan.workers.publish.publisher`: their Redis and key prefix,
        never the environment's), looked up on first use, then held (nothing per message)."""
        from makespan.workers.publish import publisher

        return publisher(self.settings)

    def now_s(self) -> float:
        """The workload clock, s: the clock's unix time ÷ ``time_scale``."""
        return self.clock.now() / self.settings.time_scale


@dataclass
class KeptPlan:
    """A full tick's plan kept for following: :class:`makespan.workers.follow.KeepPlan`
    writes it, :class:`makespan.workers.follow.FollowKeptPlan` reads it and marks ``done``."""

    plan: Plan
    jobs: dict[str, PlanJob]  # the batch, by id
    formed: FormedBatch  # the batch's traceparents, submission times and submitted levels
    planned_at: float  # clock.monotonic() when it was planned
    done: set[str] = field(default_factory=set)  # jobs started since (or passed over: gone from the queue)
    # queued jobs it did not read, read once: id -> (endpoint, service_s, level) (follow)
    alike: dict[str, tuple[str, float, Priority]] = field(default_factory=dict)
    # workload s: when the first kept job that had not aged when planned reaches the aging
    # bound (Settings.reservation_after_s; a full tick must then give it its reservation)
    ages_at_s: float = float("inf")
    reserved: frozenset[str] = frozenset()  # the jobs holding the plan's reservation (a full tick after they start)
    gated: frozenset[str] = frozenset()  # the snapshot's gated GPUs (down or cordoned hosts) when it was planned


@dataclass
class CrossTickState:
    """Everything a tick leaves for the next ones (one owner each, named per field)."""

    endpoints: dict[str, EndpointModel]  # the learned endpoint models (fleet_view.refresh_learned)
    improver: BackgroundImprover | None = None  # the solver policies' background improver (plan step)
    learned_at_s: float = float("-inf")  # clock.monotonic() of the last learned-models read (fleet_view)
    solve_stats: list[str] = field(default_factory=list)  # "solve s:batch size" not yet written (fleet_view)
    recent_jobs: dict[str, PlanJob] = field(default_factory=dict)  # arrivals behind the demand (fleet_view)
    idle_checked: bool = False  # the drain was checked in this idle period (drain)
    lane_leases: int = 0  # jobs the critical lane leased so far (critical_lane; read by drain)
    lane_leases_at_check: int = 0  # lane_leases when the drain was last checked (drain)
    reason_counts_written: bool = True  # P:planner:reasons may hold counts (wait_reasons)
    last_traceparent: dict[str, str] = field(default_factory=dict)  # GPU -> last job's traceparent (starts)
    # (clock.monotonic(), GPUs without a lease) at the last snapshot: idle GPU-seconds (fleet_view)
    idle_gpus_at: tuple[float, int] | None = None
    claims: JobClaims = field(default_factory=JobClaims)  # jobs Preempt or the critical lane decides for now
    starting_gpus: frozenset[str] = frozenset()  # GPUs the last plan starts a job on now (PlanBatch; critical lane)
    heads_read: frozenset[str] = frozenset()  # queue heads at the last tick that formed a batch (batch), less the jobs it leased (wait_reasons)
    heads_read_at: float = float("-inf")  # clock.monotonic() of that tick (batch)
    followed: KeptPlan | None = None  # a full tick's plan the next ticks may follow (follow)
    rehomed_at_s: float = float("-inf")  # clock.monotonic() of the last look for jobs to move (pool_rehome)
    # (pool, '' = the implicit one; level) -> offset of the next read of that queue (pool_rehome)
    rehome_cursor: dict[tuple[str, Priority], int] = field(default_factory=dict)
    reasons_stale: bool = False  # a tick followed the kept plan since the last batch was formed (follow; batch clears)
    # the workload functions jobs of the last batch's scan waited for (no live worker registered them: batch)
    waiting_functions: frozenset[str] = frozenset()
    # the last batch's scan left jobs waiting for a GPU worker whose fleet file can run them: re-read at
    # most every REASON_REFRESH_S even with every GPU held, so their reason follows a worker's restart
    fleet_waiting: bool = False
    victims_without_eta: bool = False  # the rule's preemption requeued jobs with no ETA (preemption; batch clears)
    lane_victims: int = 0  # victims the critical lane's preemptions requeued so far, no ETA (critical_lane)
    # host -> clock.monotonic() of its last preemption: its victims may hold its GPU worker's slots for
    # Settings.cancel_grace_s more (starts.note_preemption; starts._lease_request reads it)
    preempted_at: dict[str, float] = field(default_factory=dict)
    next_aging_s: float = float("inf")  # workload s: when the first job the last plan left waits past the aging bound (steps.PlanBatch)
    next_eta_s: float = float("inf")  # workload s: the earliest ETA the last wait-reason write gave a batch job (wait_reasons; batch re-plans once it passes)
    lane_victims_planned: int = 0  # lane_victims before the snapshot of the last tick that formed a batch (batch)


@dataclass
class TickContext:
    """One tick's data, passed to each step's ``run`` in :data:`makespan.workers.tick.steps.TICK_STEPS`
    order. Each field names the step that writes it; later steps only read it (except
    the GPU sets ``taken``, ``started``, ``dispatched``, which every starting step extends)."""

    env: TickEnv
    kept: CrossTickState
    token: str  # the planner's fencing token for this tick ('' = unchecked, tests)
    snapshot: Snapshot | None = None  # ReadSnapshot (again by ReclaimExpired when it reclaimed)
    lane_victims_seen: int = 0  # ReadSnapshot: kept.lane_victims before the snapshot was read
    reclaimed: int = 0  # ReclaimExpired: expired leases reclaimed this tick
    followed: bool = False  # FollowKeptPlan: this tick followed the kept plan (only steps marked when_followed run on)
    held_gpus: set[str] = field(default_factory=set)  # FormBatch: GPUs a lease held at the snapshot
    batch_formed: bool = False  # FormBatch: a batch was formed (a GPU free, or CRITICAL/HIGH queued)
    formed: FormedBatch = field(default_factory=FormedBatch)  # FormBatch
    fleet_state: FleetState | None = None  # ReadFleet (demand filled by NoteDemand)
    lease_job: dict[str, str] = field(default_factory=dict)  # ReadFleet: GPU -> job of the lease holding it
    # ReadFleet: lease id -> its planned end, workload s on this tick's clock (the free times' source)
    lease_end: dict[str, float] = field(default_factory=dict)
    # ReadFleet: held GPU -> workload s its lease is past its planned end (overrunning ones only)
    lease_overrun: dict[str, float] = field(default_factory=dict)
    plan: Plan | None = None  # PlanBatch: the plan after the reservation and the fast lane
    reservations: dict[str, Reservation] = field(default_factory=dict)  # PlanBatch: job -> its reservation
    taken: set[str] = field(default_factory=set)  # GPUs held or leased this tick (StartPlanned on)
    started: set[str] = field(default_factory=set)  # StartPlanned: jobs of the plan leased this tick
    dispatched: set[str] = field(default_factory=set)  # jobs leased this tick (starts and preemptions)
    waiting: list[PlanJob] = field(default_factory=list)  # Preempt: CRITICAL/HIGH batch jobs not started
    requeued_now: int = 0  # Preempt: victims put back in their queue
    victims: list[str] = field(default_factory=list)  # Preempt: job ids of those victims
    victim_starts: dict[str, float] = field(default_factory=dict)  # Preempt (scored): victim -> planned start, s
    # Preempt: running job -> why it may not be preempted (its budget spent, under the minimum runtime)
    unpreemptible: dict[str, tuple[int, str]] = field(default_factory=dict)  # job -> (its level, why)
    # Preempt: running job under the minimum runtime only -> when it becomes preemptible (workload s, tick clock)
    preemptible_at: dict[str, float] = field(default_factory=dict)

    @property
    def batch(self) -> list[PlanJob]:
        """This tick's batch (empty when none was formed)."""
        return self.formed.jobs

    def tick_again(self) -> bool:
        """Whether another tick may start more at once: it dispatched, and a GPU is still
        free or a CRITICAL/HIGH job still waits (else the loop sleeps until woken)."""
        return bool(self.dispatched) and (len(self.taken) < len(self.env.gpus) or bool(self.waiting))
