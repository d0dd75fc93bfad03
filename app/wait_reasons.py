"""Why a job waits, and until when: the fixed set of reason codes (docs/concepts.md,
"Why is my job waiting?").

The live planner writes, at every tick that plans, onto the record of each job of its
batch that it did not start (and of the queued jobs its scan read but left out of the
batch, and of the unready steps it read), in one script (:mod:`makespan.workers.wait_reasons`):

* ``wait_reason``: one code of :data:`REASONS`;
* ``wait_detail``: one line saying what it waits for (GPUs and their holders, the
  dependency, the reservation, the queue position ...);
* ``wait_eta``: the planned start in the current plan, unix s on the Redis server's clock
  ('' when the plan has none, e.g. a step whose dependency has no planned end);
* ``wait_at``: when it was written, unix s on the Redis server's clock;
* ``planned_priority``: only while it is planned at a higher level than its own (it inherits
  the level of a job waiting on it, docs/concepts.md); deleted at a write without one.

Only a job still ``queued`` is written. A delayed job's reason needs no planner: it is
read from its record (``not_before``; ``attempts`` > 0: a retry backoff). A queued job
with no fresh entry while no planner leads is ``no_planner``; one the planner has not read
yet is ``behind_batch`` (:func:`reason_of`, used by ``makespan why`` / ``makespan jobs``).
"""

from __future__ import annotations

from typing import Any

# code -> what it means (docs/concepts.md lists the same)
REASONS: dict[str, str] = {
    "waiting_for_gpus": "every group its endpoint can use is busy (or planned for other jobs) until the ETA; "
                        "the detail names the GPUs and what holds them",
    "waiting_for_dependency": "a job it depends on (depends_on or a workload step) has not completed",
    "reserved": "it waited past the aging bound: its earliest feasible group is reserved for it from the ETA "
                "(only jobs that end before then may use those GPUs)",
    "behind_reservation": "the GPUs it could use now are reserved for a job that has waited longer",
    "waiting_for_memory": "GPUs of its group size are free, but none with the memory its endpoint needs",
    "delayed_until": "submitted with delay_s: queued at the ETA (not_before)",
    "preempted_requeued": "it was preempted and is queued again (it restarts from zero), until it starts again; the "
                          "detail says what it waits for now",
    "retry_backoff": "its function raised and is retried, its lease was reclaimed (worker lost) or its endpoint "
                     "failed to start; it waits out "
                     "the retry backoff until the ETA",
    "host_down": "the hosts it could run on have no live GPU worker (stopped or dead): nothing is leased there "
                 "until one is back; the detail names them",
    "host_cordoned": "the hosts it could run on are cordoned by an operator (`makespan cordon`): nothing new is "
                     "leased there until `makespan uncordon`; the detail names the host, since when and why",
    "waiting_for_function": "no live GPU worker registers its workload function (the workers that had it "
                            "stopped, or restarted without it): it stays queued, unplanned, until one does; the "
                            "detail names the function and the hosts that had it last",
    "host_fleet_differs": "the live GPU workers of the hosts it could run on were started with another fleet file "
                          "than the planner's, one without its endpoint (or a helper, or with another "
                          "tensor_parallel, or with other GPUs for the host): it stays queued, unplanned, until one restarts with the planner's file; "
                          "the detail names the hosts and their fleet versions",
    "no_planner": "no planner leads: nothing is planned (nor a delayed job past its ETA queued) until one does",
    "behind_batch": "queued behind the planner's batch (batch_size jobs by priority, FIFO): the detail gives "
                    "its queue position",
}
FIELDS = ("wait_reason", "wait_detail", "wait_eta", "wait_at", "planned_priority")
DELAYED_REASONS = ("delayed_until", "retry_backoff")  # a delayed job's codes (read from its record)
# a queued job's codes: makespan_queued_jobs_by_reason's labels (delayed jobs: makespan_delayed_jobs)
QUEUED_REASONS = tuple(code for code in REASONS if code not in DELAYED_REASONS)


def planned_priority(rec: dict[str, Any]) -> str | None:
    """The level a queued job's record says it inherits (``planned_priority``), only while its
    wait detail still says so ("planned at LEVEL"): a planner of an older version, leading
    after a rollback, rewrites the detail but not that field (an upgrade tester saw a stale
    level); None when it plans the job at its own level."""
    level = rec.get("planned_priority")
    return str(level) if level and f"planned at {level}," in str(rec.get("wait_detail") or "") else None


def stale_after_s(lease_ttl_s: float) -> float:
    """How old (s) a planner's entry may be while no planner leads before it is not trusted
    (:func:`reason_of`'s ``stale_after_s``): half the lease TTL, at least 1 s (a planner
    that lost its lock is replaced within the lock's TTL, ``lease_ttl_s`` / 2)."""
    return max(lease_ttl_s / 2, 1.0)


def reason_of(rec: dict[str, Any], *, planner_leads: bool, server_now_s: float, queue_position: int | None,
              stale_after_s: float, written_at_s: float | None = None) -> tuple[str, str, float | None]:
    """(reason, detail, ETA unix s or None) of a queued or delayed job record ``rec``
    (as :meth:`makespan.producer.Producer.status` returns it, or raw strings).

    ``planner_leads``: the planner's leader lock is held; ``server_now_s``: the Redis
    server's clock; ``queue_position``: its 0-based rank in its queue (None: unknown);
    ``stale_after_s``: a planner entry older than this while no planner leads is not
    trusted (``no_planner``). ``written_at_s``: when the planner's last reason write was
    made (``P:planner:reasons:at``, server clock; None: unknown); a job's entry older than
    it was not in that write: the tick did not read the job (higher levels filled the
    batch), so it is ``behind_batch``, not its old reason and ETA.

    Raises:
        ValueError: the job is neither queued nor delayed."""
    state = rec.get("state")
    if state == "delayed":
        due = float(rec.get("not_before") or 0.0) or None
        if not planner_leads and due is not None and due <= server_now_s:  # due, and nothing queues it
            what = "retry" if int(rec.get("tries") or 0) > 0 or int(rec.get("attempts") or 0) > 0 else "delay"
            return "no_planner", (f"its {what} ended {server_now_s - due:.0f} s ago, but no planner holds the leader "
                                  "lock to queue it (start one with `makespan planner --fleet FLEET`; a standby "
                                  "takes over within its lock's TTL)"), due
        # the leading planner queues a due delayed job: without one it stays delayed past its ETA
        idle = "" if planner_leads else "; no planner holds the leader lock now: it is queued once one does"
        tries = int(rec.get("tries") or 0)  # runs of its function that raised and were retried
        if tries > 0:
            return "retry_backoff", str(rec.get("reason") or f"attempt {int(rec.get('attempts') or 0) + tries + 1} "
                                                              "after its function raised") + idle, due
        if int(rec.get("attempts") or 0) > 0:
            written = str(rec.get("reason") or "")
            if "failed to start" in written:  # reclaim.lua's start_failed requeue: it names the start's error
                return "retry_backoff", written + idle, due
            return "retry_backoff", f"attempt {int(rec['attempts']) + 1} after a reclaimed lease" + idle, due
        submitted = float(rec.get("submitted_at") or 0.0)
        asked = f" of {round(due - submitted):g} s" if due and submitted and due >= submitted else ""
        return "delayed_until", f"submitted with a delay{asked} (delay_s): queued at the ETA" + idle, due
    if state != "queued":
        raise ValueError(f"job is {state}, not waiting")
    at = float(rec.get("wait_at") or 0.0)
    fresh = bool(at) and server_now_s - at <= stale_after_s
    if not planner_leads and not fresh:
        if rec.get("pool"):  # a pool's job: only that pool's planner plans it (makespan.pools)
            return "no_planner", (f"no planner of pool {rec['pool']} holds its leader lock (start one with "
                                  f"`makespan planner --fleet FLEET --pool {rec['pool']}`; if another pool serves "
                                  "its endpoint, that pool's leading planner moves it there)"), None
        return "no_planner", ("no planner holds the leader lock (start one with `makespan planner --fleet FLEET`; "
                              "a standby takes over within its lock's TTL)"), None
    if not rec.get("wait_reason") or (planner_leads and written_at_s is not None and at < written_at_s - 5e-4):
        pos = "" if queue_position is None else f"position {queue_position + 1} in the {rec.get('priority', '?')} queue"
        return "behind_batch", pos or "not read by the planner yet", None
    eta = rec.get("wait_eta")
    return str(rec["wait_reason"]), str(rec.get("wait_detail") or ""), float(eta) if eta not in (None, "") else None
