"""Every public makespan error pickles and copies with its attributes (a service developer
found six of the eleven exported ones could not: ``job.result()`` in a ProcessPoolExecutor
whose function had raised gave ``BrokenProcessPool`` instead of the WorkloadError)."""

from __future__ import annotations

import copy
import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from makespan import errors

CASES = [
    errors.ValidationError("priority", "URGENT", "must be one of CRITICAL, HIGH, NORMAL, LOW", source="job"),
    errors.WorkloadError("j1", "mymod.QuotaExceeded", "over quota", "Traceback ...", attempt=2),
    errors.JobFailed("j2", "failed", "start_endpoint: health check timed out"),
    errors.SubmitOutcomeUnknown("j3", "sent, no reply"),
    errors.RedisUnreachable("redis://127.0.0.1:1/0", "Connection refused"),
    errors.RedisAuthFailed("redis://127.0.0.1:6379/0", "WRONGPASS"),
    errors.RedisConfigError("ssl_cert_reqs", "maybe", "unknown"),
    errors.JobCancelled("j4", "dependency j3 did not complete", "j3"),
    errors.ResultTimeout("job j5 not finished", "j5", "running"),
    errors.ResultExpired("job j6 completed, but its result is gone"),
    errors.NotFoundError("no job 'j7'"),
    errors.StoreError("job j8: Connection reset"),
]


@pytest.mark.parametrize("error", CASES, ids=lambda e: type(e).__name__)
def test_pickle_and_copy_keep_type_message_and_attributes(error):
    for twin in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
        assert type(twin) is type(error)
        assert str(twin) == str(error) and twin.args == error.args
        assert twin.__dict__ == error.__dict__


def _raise_workload_error() -> None:
    raise errors.WorkloadError("j1", "ValueError", "bad prompt", "Traceback ...", attempt=3)


def test_a_workload_error_crosses_a_process_pool():
    with ProcessPoolExecutor(max_workers=1) as pool:
        with pytest.raises(errors.WorkloadError) as caught:
            pool.submit(_raise_workload_error).result(timeout=60)
    assert (caught.value.job_id, caught.value.error_type, caught.value.attempt) == ("j1", "ValueError", 3)
