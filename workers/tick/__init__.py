"""The planner tick as steps (issue 17, point 2).

:class:`makespan.workers.planner_worker.PlannerWorker` keeps leadership and the loop;
each tick it builds one :class:`~makespan.workers.tick.context.TickContext` and runs
the steps of :data:`makespan.workers.tick.steps.TICK_STEPS` over it, in that order.

* :mod:`makespan.workers.tick.clock`: the injected :class:`Clock` (``SystemClock``, and
  ``ManualClock`` for tests);
* :mod:`makespan.workers.tick.context`: the frozen :class:`Snapshot`, the per-tick
  :class:`TickContext`, the worker's fixed parts (:class:`TickEnv`) and the one object
  that lives across ticks (:class:`CrossTickState`);
* :mod:`makespan.workers.tick.steps`: the small steps and :data:`TICK_STEPS`, the one
  place that lists the tick's order. The larger steps live beside their helpers:
  :mod:`makespan.workers.batch`, :mod:`makespan.workers.fleet_view`,
  :mod:`makespan.workers.starts`, :mod:`makespan.workers.preemption`,
  :mod:`makespan.workers.drain`, :mod:`makespan.workers.wait_reasons`.

This package's ``__init__`` imports nothing, so the step modules may import
``context`` and ``clock`` without a cycle.
"""
