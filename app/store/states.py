"""Job states and the transitions the store's scripts may make between them.

Re-exported from the core module :mod:`makespan.job_states` (their home, so that the
infrastructure layer can use them without importing the store).
"""

from __future__ import annotations

from makespan.job_states import FINAL_STATES, TRANSITIONS, JobState, allowed

__all__ = ["FINAL_STATES", "TRANSITIONS", "JobState", "allowed"]
