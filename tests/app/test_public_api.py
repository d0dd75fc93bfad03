"""The top-level API type-checks in a user's code under ``mypy --strict`` (a service
developer found the README's own ``makespan.connect()`` refused: "Module "makespan" does
not explicitly export attribute "connect"", as ``__all__`` was not a literal)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import makespan

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import package_layout  # noqa: E402

USER_APP = '''
import makespan


@makespan.workload(endpoint="judge")
def judge(ctx: makespan.WorkloadContext, prompt: str) -> str:
    return prompt


def main() -> None:
    client: makespan.Client = makespan.connect()
    job: makespan.Job = client.submit("judge", "Is 7 prime?", priority=makespan.Priority.HIGH)
    try:
        print(job.result(timeout_s=600))
    except makespan.WorkloadError as error:
        print(error.error_type, error.job_id, error.attempt)
    except (makespan.ResultTimeout, makespan.ResultExpired, makespan.JobFailed, makespan.JobCancelled):
        pass
    except (makespan.RedisUnreachable, makespan.RedisAuthFailed, makespan.SubmitOutcomeUnknown):
        pass
    except (makespan.ValidationError, makespan.NotFoundError, makespan.StoreError, makespan.MakespanError):
        pass
    print(makespan.WorkloadDef)
'''


def test_all_lists_every_export():
    assert makespan.__all__ == sorted(makespan._EXPORTS)
    for name in makespan.__all__:
        assert getattr(makespan, name) is not None


def test_a_users_module_passes_mypy_strict(tmp_path):
    layout = tmp_path / "layout"
    package_layout.assemble(REPO, layout)  # the installed package's tree (the repository's folders map into it)
    app = tmp_path / "user_app.py"
    app.write_text(USER_APP)
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--cache-dir", str(tmp_path / "cache"), str(app)],
                          env=dict(os.environ, MYPYPATH=str(layout)), cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
