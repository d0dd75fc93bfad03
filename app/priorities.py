"""Priority levels, part of the core every layer may import (the planner included).

:class:`Priority` lived in :mod:`makespan.models` and is still importable from there.
"""

from __future__ import annotations

import enum

from makespan.errors import ValidationError


class Priority(enum.IntEnum):
    """Priority levels; the value is the level index (0 is the most urgent)."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3

    @property
    def weight(self) -> int:
        """Weight w_j in the objective Σ w_j (C_j − r_j): 8, 4, 2, 1."""
        return {0: 8, 1: 4, 2: 2, 3: 1}[int(self)]

    def may_preempt(self, other: Priority) -> bool:
        """Design notes: CRITICAL preempts HIGH/NORMAL/LOW, HIGH preempts NORMAL/LOW."""
        return self <= Priority.HIGH and other > self

    @classmethod
    def parse(cls, value: Priority | str | int, field: str = "priority") -> Priority:
        """``value`` as a level: a :class:`Priority`, a level name (any case) or index 0–3
        (an int, or its digit as text: ``--priority 0`` on the command line).

        Raises:
            makespan.errors.ValidationError: anything else (``field`` names it).
        """
        if isinstance(value, Priority):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        if isinstance(value, str) and value in ("0", "1", "2", "3"):
            return cls(int(value))
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 3:
            return cls(value)
        raise ValidationError(field, value, "unknown priority level; use CRITICAL, HIGH, NORMAL or LOW (or 0–3)")
