"""The default policy's CP-SAT improver, off the live planner's tick path.

The live planner must answer within a tick (tens of milliseconds: a GPU that frees is
leased again at once), while the CP-SAT improver of the ``default`` policy needs up to
``solve_time_limit_s`` (1 s) per batch. So the planner worker splits the policy:

* every tick plans with the greedy ``portfolio`` (the default policy's floor) and adopts
  the improver's latest plan instead when, adapted to the current batch and fleet state
  (:func:`adapt`) and replayed by the evaluator, it scores better;
* after a tick whose batch differs from the last one sent, it hands that batch, the fleet
  state and the tick's plan to one background thread, which runs the ``default`` policy
  (portfolio + exact search / whole-batch CP-SAT / descent and windowed LNS) within the
  time limit, starting from its own last plan when that, repaired to the batch, is better.

So the live worker runs the same planner as the simulator's ``default`` policy, one tick
late. A tick does not wait for the solve, but it shares the planner process's GIL with
it: CP-SAT's search releases the GIL, the Python parts (portfolio, repair, descent,
decoding windows) hold it, so ticks planned while a solve runs take longer (a reviewer
measured the portfolio on 256 jobs and 32 GPUs at 35 ms median alone, 72 ms beside a
solve); a process instead of a thread would remove that and is not done. An improved
plan can only be adopted when it is better on the state of the tick that uses it: it is
never worse than the greedy floor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from app import metrics
from planner.api import POLICY_OBJECTIVE, plan as run_policy
from planner.evaluator import score
from planner.model import FleetState, Plan, PlanJob
from planner.previous import repair

log = logging.getLogger("makespan.planner")
HORIZON_FACTOR = 10.0  # solve only when the tick's plan spans at least this many time limits


def adapt(previous: Plan, batch: Sequence[PlanJob], state: FleetState,
          objective: str = "weighted_completion") -> Plan | None:
    """``previous`` repaired to ``batch`` on ``state`` (:func:`planner.previous.repair`: its
    jobs still in the batch keep their start order and GPU group and start as early as the
    replay allows; the others follow in WSPT order, each on the group completing it
    earliest). Returns the plan evaluated for ``objective`` (policy ``"improved"``), or
    None when no job of the batch is in ``previous``."""
    ids = {j.id for j in batch}
    if not any(a.job_id in ids for a in previous.assignments):
        return None
    return repair(previous, batch, state, policy="improved", objective=objective)


class BackgroundImprover:
    """One daemon thread running ``policy`` (``default``/``cpsat``/``tardiness``) on the
    batches it is offered, at most one at a time; the newest result is kept for
    :meth:`best`, which compares plans by the policy's objective
    (:data:`planner.api.POLICY_OBJECTIVE`; the floor must be scored for it too).

    Args:
        policy: the solver policy name.
        time_limit_s: its time limit per batch, s.
        num_workers: CP-SAT search workers.

    ``stats``: ``offered`` (batches solved), ``adopted`` (ticks that used the improved
    plan), ``busy_skips`` (batches not offered because a solve was running),
    ``short_skips`` (batches whose plan ended too soon to be worth a solve).
    """

    def __init__(self, policy: str, time_limit_s: float, num_workers: int | None = None):
        self.policy, self.time_limit_s, self.num_workers = policy, time_limit_s, num_workers
        self.objective = POLICY_OBJECTIVE.get(policy, "weighted_completion")
        self._lock = threading.Lock()
        self._busy = False
        self._result: Plan | None = None
        self._last_ids: tuple[str, ...] = ()
        self.stats = {"offered": 0, "adopted": 0, "busy_skips": 0, "short_skips": 0}

    def worth_solving(self, horizon_s: float) -> bool:
        """Whether a plan ending ``horizon_s`` wall seconds from now is worth a solve: at
        least ``HORIZON_FACTOR × time_limit_s`` (a plan whose decisions all fall within a
        few solve times gains nothing from a solve that a later tick can only adopt after
        them, e.g. a stream of sub-second jobs). Counts ``short_skips``."""
        if horizon_s < HORIZON_FACTOR * self.time_limit_s:
            self.stats["short_skips"] += 1
            return False
        return True

    def offer(self, batch: Sequence[PlanJob], state: FleetState) -> bool:
        """Start improving ``batch`` on ``state`` unless a solve is running or this batch
        (the same job ids) was the last one offered. Returns whether a solve started."""
        ids = tuple(sorted(j.id for j in batch))
        with self._lock:
            if ids == self._last_ids:
                return False
            if self._busy:
                self.stats["busy_skips"] += 1
                return False
            self._busy, self._last_ids = True, ids
            self.stats["offered"] += 1
        threading.Thread(target=self._solve, args=(list(batch), state), name="makespan-improver",
                         daemon=True).start()
        return True

    def _solve(self, batch: list[PlanJob], state: FleetState) -> None:
        try:
            t0 = time.perf_counter()
            with self._lock:
                prev = self._result  # the last improved plan: a start when better (plan stability)
            out = run_policy(batch, state, self.policy, time_limit_s=self.time_limit_s,
                             num_workers=self.num_workers, previous=prev)
            metrics.improver("solved", time.perf_counter() - t0)
            with self._lock:
                self._result = out
        except Exception:  # noqa: BLE001 - the tick's greedy plan stands; say why
            log.exception("background improver failed; the greedy plan is used")
            with self._lock:
                self._last_ids = ()  # the same batch may be offered again
        finally:
            with self._lock:
                self._busy = False

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until no solve runs (tests, shutdown). Returns whether it is idle."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self._lock:
                if not self._busy:
                    return True
            time.sleep(0.005)
        return False

    def best(self, floor: Plan, batch: Sequence[PlanJob], state: FleetState) -> Plan:
        """``floor`` (the tick's greedy plan), or the latest improved plan adapted to this
        batch and state when it scores strictly better."""
        with self._lock:
            prev = self._result
        if prev is None:
            return floor
        cand = adapt(prev, batch, state, self.objective)
        if cand is None or score(cand) >= score(floor) - 1e-6 * max(1.0, abs(score(floor))):
            return floor
        self.stats["adopted"] += 1
        metrics.improver("adopted")
        cand.stats["greedy_score"] = score(floor)
        return cand
