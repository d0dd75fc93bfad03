"""Workload builder: build a workload's DAG in Python, as Celery canvas ``chain``/``group``.

:class:`Workload` collects steps (``.step(name, endpoint, **work)`` returns a
:class:`StepRef`); :func:`chain` and :func:`group` add the dependencies
(``chain(a, group(b, c), d)`` is the diamond a -> {b, c} -> d). ``Workload.to_dict()`` is
the mapping :func:`makespan.workload_spec.parse_workload` validates, ``Workload.spec(fleet)``
the validated :class:`makespan.workload_spec.WorkloadSpec`; :func:`makespan.workloads.submit_workload`
takes a ``Workload`` as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from makespan.errors import ValidationError
from makespan.models import FleetSpec, Priority
from makespan.workload_spec import WorkloadSpec, parse_workload


class StepRef:
    """A step of a :class:`Workload` under construction (returned by ``Workload.step``)."""

    def __init__(self, wl: Workload, name: str):
        self.wl, self.name = wl, name

    def heads(self) -> list[StepRef]:
        return [self]

    def tails(self) -> list[StepRef]:
        return [self]

    def after(self, *others: StepRef | Group) -> StepRef:
        """Make this step depend on ``others`` (every tail of a group or chain). Returns self."""
        for o in others:
            for t in o.tails():
                self.wl._deps[self.name].append(t.name)
        return self

    def __repr__(self) -> str:
        return f"StepRef({self.name!r})"


class Group:
    """Steps (or chains) that run in parallel, as Celery canvas ``group``."""

    def __init__(self, *members: StepRef | Group):
        self.members = members

    def heads(self) -> list[StepRef]:
        return [h for m in self.members for h in m.heads()]

    def tails(self) -> list[StepRef]:
        return [t for m in self.members for t in m.tails()]


class Chain(Group):
    """A sequence, as Celery canvas ``chain``: its heads are the first item's, its tails the last's."""

    def heads(self) -> list[StepRef]:
        return self.members[0].heads() if self.members else []

    def tails(self) -> list[StepRef]:
        return self.members[-1].tails() if self.members else []


def group(*members: StepRef | Group) -> Group:
    """Parallel steps: ``chain(a, group(b, c), d)`` is the diamond a → {b, c} → d."""
    return Group(*members)


def chain(*items: StepRef | Group) -> Chain:
    """Sequence: every head of item k+1 depends on every tail of item k."""
    for prev, nxt in zip(items, items[1:]):
        for h in nxt.heads():
            h.after(prev)
    return Chain(*items)


class Workload:
    """Builder: ``Workload(name, priority, retry_budget)``, ``.step(...)``, ``.spec(fleet)``."""

    def __init__(self, name: str = "workload", priority: Priority | str = Priority.NORMAL, retry_budget: int = 0):
        self.name, self.priority, self.retry_budget = name, priority, retry_budget
        self._steps: dict[str, dict[str, Any]] = {}
        self._deps: dict[str, list[str]] = {}

    def step(self, name: str, endpoint: str, *, after: Iterable[StepRef | Group] = (), **work: Any) -> StepRef:
        """Add a step (``requests=``, ``prompt=``, ``service_s=`` ... as :class:`StepSpec`)."""
        if name in self._steps:
            raise ValidationError("workload.steps.name", name, "duplicate step name")
        self._steps[name] = {"name": name, "endpoint": endpoint, **work}
        self._deps[name] = []
        ref = StepRef(self, name)
        ref.after(*after)
        return ref

    def to_dict(self) -> dict[str, Any]:
        steps = [{**s, "depends_on": list(dict.fromkeys(self._deps[n]))} for n, s in self._steps.items()]
        return {"name": self.name, "priority": Priority.parse(self.priority).name,
                "retry_budget": self.retry_budget, "steps": steps}

    def spec(self, fleet: FleetSpec) -> WorkloadSpec:
        return parse_workload(self.to_dict(), fleet)
