"""The dashboard shows an incident's latest recovery record, as ``makespan incidents``
does: an incident the observer gave up ("not restarted: its GPUs are leased") is later
closed by a second record, ``recovered``; the dashboard showed the first (an upgrading
operator's report)."""

from __future__ import annotations

from makespan.dashboard.state import _incidents


def test_the_latest_recovery_record_is_shown(r, keys):
    incident = r.xadd(keys.incidents, {"kind": "incident", "endpoint": "renderer", "host": "host-a",
                                       "gpus": '["GPU-host-a-3"]', "failure_mode": "process_exited",
                                       "detected_at": "1000.0", "effect": "job failed"})
    r.xadd(keys.incidents, {"kind": "recovery", "incident_id": incident,
                            "outcome": "not restarted: its GPUs are leased", "recovery_s": ""})
    r.xadd(keys.incidents, {"kind": "recovery", "incident_id": incident, "outcome": "recovered", "recovery_s": "9.2"})
    other = r.xadd(keys.incidents, {"kind": "incident", "endpoint": "chat", "host": "host-b", "gpus": "[]",
                                    "failure_mode": "health_check_failed", "detected_at": "1001.0"})
    shown = {row["incident_id"]: row for row in _incidents(r, keys)}
    assert shown[incident]["recovery"] == {"outcome": "recovered", "recovery_s": 9.2}
    assert shown[other]["recovery"] is None
