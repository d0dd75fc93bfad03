"""advance_workloads vs a cancel that lands between its read and its write."""

from makespan.models import load_fleet
from makespan.workloads import Workload, advance_workloads, cancel_workload, submit_workload, workload_status
from tests.conftest import FLEET_TOML


class _CancelAfterRead:
    """The planner's client, with a user's ``cancel_workload`` landing right after the
    planner read the workload's state (the race seen once as a failed live test)."""

    def __init__(self, r, keys, wid):
        self._r, self._keys, self._wid, self.cancelled = r, keys, wid, None

    def hmget(self, *a, **k):
        out = self._r.hmget(*a, **k)
        if self.cancelled is None:
            self.cancelled = cancel_workload(self._r, self._keys, self._wid)
        return out

    def __getattr__(self, name):
        return getattr(self._r, name)


def test_a_cancel_between_read_and_write_stays_a_cancel(r, keys, settings):
    fleet = load_fleet(FLEET_TOML)
    wl = Workload("wl")
    a = wl.step("a", "embed", service_s=1)
    wl.step("b", "embed", service_s=1, after=[a])
    wid = submit_workload(r, keys, fleet, wl, settings)
    racy = _CancelAfterRead(r, keys, wid)
    out = advance_workloads(racy, keys)
    assert racy.cancelled == {"cancelled": 2, "cancel_requested": 0}
    assert out["failed"] == 0
    assert workload_status(r, keys, wid)["state"] == "cancelled"
    assert advance_workloads(r, keys)["finished"] == 1  # closed as it is: cancelled
    st = workload_status(r, keys, wid)
    assert st["state"] == "cancelled"
    assert not [e for e in r.xrange(keys.events) if "workload_failed" in str(e)]  # no failure was recorded
