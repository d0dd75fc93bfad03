"""Writing each waiting job's reason and ETA (:mod:`makespan.wait_reasons`) for the planner
worker: one fenced script per planning tick (:data:`_WRITE`), only for the jobs that
tick read (its batch, the queued jobs its scan left out, the unready steps).

:meth:`WaitReasonMixin._write_wait_reasons` derives each not-started batch job's reason
from the tick's plan: ``reserved`` / ``behind_reservation`` (the tick's reservations,
:mod:`makespan.planner.reservation`), ``preempted_requeued`` (its record says it was
preempted and it has not started since), ``host_down`` (planned on a host without a live
GPU worker: :mod:`makespan.workers.host_liveness`), ``waiting_for_memory`` (a group of its size is
free now but none with its memory is), else ``waiting_for_gpus`` naming the GPUs of its
planned group and what holds them (a lease's job, or the jobs planned there before it).
The ETA is the plan's start converted to the Redis server's clock
(``(start − now) × time_scale`` + the server clock the delayed-job promote measured).
The same script replaces ``P:planner:reasons`` (:attr:`makespan.keys.Keys.wait_reason_counts`)
with the count of jobs per reason it wrote, which Prometheus exports as
``makespan_queued_jobs_by_reason{reason}`` (:class:`makespan.metrics.RedisStateCollector`);
a tick that forms an empty batch clears it (:meth:`WaitReasonMixin._clear_reason_counts`).

Mixed into :class:`makespan.workers.planner_worker.PlannerWorker`.
"""

from __future__ import annotations

import time

from makespan.models import Priority
from makespan.planner.model import FleetState, Plan, PlanJob
from makespan.workers.lease_scripts import SERVER_NOW_MS

# KEYS: planner_fence, reason counts hash ; ARGV: planner token ('' = unchecked), prefix, then
# (job id, reason, detail, eta) × n. Writes only records still 'queued'; the counts hash is replaced by
# the reasons written (a job written twice counts once, with its last reason). Returns how many were
# written (-1: fenced off).
_WRITE = SERVER_NOW_MS + """
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local at = string.format('%.3f', server_now_ms / 1000.0)
local n = 0
local last = {}
for i = 3, #ARGV, 4 do
  local jk = ARGV[2] .. ':job:' .. ARGV[i]
  if redis.call('HGET', jk, 'state') == 'queued' then
    redis.call('HSET', jk, 'wait_reason', ARGV[i + 1], 'wait_detail', ARGV[i + 2], 'wait_eta', ARGV[i + 3],
               'wait_at', at)
    last[ARGV[i]] = ARGV[i + 1]
    n = n + 1
  end
end
local counts = {}
for _, reason in pairs(last) do counts[reason] = (counts[reason] or 0) + 1 end
redis.call('DEL', KEYS[2])
for reason, c in pairs(counts) do redis.call('HSET', KEYS[2], reason, c) end
return n
"""


class WaitReasonMixin:
    _requeued: set[str] = set()  # batch jobs whose record says they were preempted (form_batch)
    _unready: dict[str, tuple[str, ...]] = {}  # unready steps read -> their deps (form_batch)
    _left_out: dict[str, tuple[Priority, int]] = {}  # queued, read, not in the batch -> (level, position)
    _lease_job: dict[str, str] = {}  # GPU -> job id of the lease holding it (fleet_state)
    _down_hosts: set[str] = set()  # hosts without a live GPU worker (fleet_state)
    reservations: dict = {}  # job id -> makespan.planner.reservation.Reservation (this tick's)
    _reason_counts_written = True  # P:planner:reasons may hold counts (cleared by the next write without rows)

    def _server_eta(self, start_s: float, now_s: float) -> str:
        """A plan time (workload s) as unix s on the Redis server's clock."""
        return f"{time.time() + self.delayed.server_offset_s + (start_s - now_s) * self.settings.time_scale:.3f}"

    def _write_wait_reasons(self, batch: list[PlanJob], state: FleetState, p: Plan, dispatched: set[str]) -> None:
        """Write the reason and ETA of every job this tick read and did not start (module doc)."""
        now = state.now_s
        by_job = p.by_job()
        rows: list[str] = []
        for j in batch:
            if j.id in dispatched:
                continue
            a = by_job.get(j.id)
            reason, detail = self._batch_reason(j, state, p, a)
            rows += [j.id, reason, detail, self._server_eta(a.start_s, now) if a is not None else ""]
        planned_end = {a.job_id: a.end_s for a in p.assignments}
        running_end = {jid: state.free_at.get(u, now) for u, jid in self._lease_job.items()}
        for jid, deps in self._unready.items():
            ends = [planned_end.get(d, running_end.get(d)) for d in deps]
            eta = self._server_eta(max(ends), now) if ends and None not in ends else ""
            rows += [jid, "waiting_for_dependency", "waits on " + ", ".join(deps), eta]
        for jid in getattr(self, "victims_now", []):  # preempted this tick, back in their queue
            rows += [jid, "preempted_requeued", "preempted this tick; queued again, restarts from zero", ""]
        for jid, (lvl, pos) in self._left_out.items():
            rows += [jid, "behind_batch", f"position {pos + 1} in the {lvl.name} queue; the batch holds "
                                          f"{self.settings.batch_size} jobs", ""]
        if rows or self._reason_counts_written:
            self._reason_counts_written = bool(rows)
            self.r.eval(_WRITE, 2, self.keys.planner_fence, self.keys.wait_reason_counts, self.token,
                        self.keys.prefix, *rows)

    def _clear_reason_counts(self) -> None:
        """Nothing queued was read: the reason counts go to zero (once, not every idle tick)."""
        if self._reason_counts_written:
            self._reason_counts_written = False
            self.r.eval(_WRITE, 2, self.keys.planner_fence, self.keys.wait_reason_counts, self.token,
                        self.keys.prefix)

    def _batch_reason(self, j: PlanJob, state: FleetState, p: Plan, a) -> tuple[str, str]:
        now = state.now_s
        res = self.reservations.get(j.id)
        if res is not None:
            return "reserved", f"GPUs {','.join(res.gpus)} reserved for it from the ETA (waited past the aging bound)"
        blocking = [r for r in self.reservations.values() if j.id in r.deferred]
        if j.id in self._requeued:
            return "preempted_requeued", "preempted; queued again, restarts from zero"
        if blocking:
            r = blocking[0]
            return "behind_reservation", f"GPUs {','.join(r.gpus)} are reserved for job {r.job_id}"
        if a is not None and self._down_hosts and self.fleet.host_of(a.gpus[0]) in self._down_hosts:
            return "host_down", (f"planned on host {self.fleet.host_of(a.gpus[0])}, which no GPU worker consumes "
                                 f"now; nothing is leased there until one is back")
        ep = state.endpoints.get(j.endpoint)
        if ep is not None:
            fits = state.groups(ep.tp, ep.memory_mib)
            free = lambda g: all(state.free_at.get(u, now) <= now + 1e-6 for u in g)  # noqa: E731
            if not any(free(g) for g in fits) and any(free(g) for g in state.groups(ep.tp, 0) if g not in fits):
                return "waiting_for_memory", (f"a group of {ep.tp} GPU(s) is free, but none with "
                                              f"{ep.memory_mib} MiB per GPU")
        if a is None:
            return "waiting_for_gpus", "not placed by this plan"
        holders = []
        for u in a.gpus:
            if state.free_at.get(u, now) > now + 1e-6 and u in self._lease_job:
                holders.append(f"job {self._lease_job[u]}")
        before = [b for b in p.assignments if b.job_id != j.id and set(b.gpus) & set(a.gpus)
                  and b.end_s <= a.start_s + 1e-6]
        if before:
            holders.append(f"job {max(before, key=lambda b: b.end_s).job_id} (planned)")
        held = f", held by {', '.join(dict.fromkeys(holders))}" if holders else ""
        return "waiting_for_gpus", f"planned on GPUs {','.join(a.gpus)}{held}"
