"""The installed distribution: one top-level package, ``makespan``, beside a user project
that has its own ``app/``, ``workers/`` and ``planner/``; the README's example runs there.

The wheel is built from this checkout and installed without dependencies into a fresh
virtual environment; the dependencies come from the test's own environment through a
``.pth`` line (installing them again would take minutes and prove nothing about makespan).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import sysconfig
import uuid
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
USER_PACKAGES = ("app", "workers", "planner")


def readme_examples() -> dict[str, str]:
    """The README's example files: each fenced block after a ``<!-- readme-example: NAME -->`` line."""
    text = (ROOT / "README.md").read_text()
    return {m.group(1): m.group(2) for m in
            re.finditer(r"<!-- readme-example: (\S+) -->\n```\w*\n(.*?)```", text, re.S)}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    return next(out.glob("makespan-*.whl"))


def test_the_wheel_has_one_top_level_package_and_ships_py_typed(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"makespan"}
    assert "makespan/py.typed" in names and "makespan/planner/api.py" in names
    assert "makespan/workers/tasks.py" in names and "makespan/examples/render_cards.py" in names
    # the example files the docs name (docs/workloads.md: examples/synth.yaml, examples/render-pipeline.toml)
    assert {"makespan/examples/synth.yaml", "makespan/examples/render-pipeline.toml"} <= set(names)
    # the store's Lua scripts travel as package data: every one in the checkout is in the wheel
    lua = sorted(p.name for p in (ROOT / "app" / "store" / "lua").glob("*.lua"))
    assert lua and all(f"makespan/store/lua/{name}" in names for name in lua)
    # the built-in endpoint drivers are declared in the makespan.drivers entry-point group
    [points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(points).decode()
    assert "[makespan.drivers]" in text and "simulated = makespan.workers.drivers.simulated:SimulatedDriver" in text


@pytest.fixture(scope="module")
def user_venv(wheel, tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # the test environment's dependencies (not its makespan: that one is an editable finder
    # loaded by a .pth file, which a plain path line does not process)
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    inst = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert inst.returncode == 0, inst.stderr
    (venv / "bin" / "makespan").write_text(f"#!{venv / 'bin' / 'python'}\nfrom makespan.cli import main\nmain()\n")
    (venv / "bin" / "makespan").chmod(0o755)
    return venv


@pytest.fixture
def user_project(tmp_path) -> Path:
    proj = tmp_path / "webapp"
    for pkg in USER_PACKAGES:
        (proj / pkg).mkdir(parents=True)
        (proj / pkg / "__init__.py").write_text(f"OWNER = 'user {pkg}'\n")
    for name, body in readme_examples().items():
        (proj / name).write_text(body)
    return proj


def test_readme_example_runs_beside_a_users_own_app_workers_and_planner(user_venv, user_project, redis_url):
    assert set(readme_examples()) >= {"fleet.toml", "gpu_jobs.py", "submit.py", "run.sh"}
    py = str(user_venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKESPAN_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(MAKESPAN_REDIS_URL=redis_url, MAKESPAN_KEY_PREFIX=f"mst-wheel-{uuid.uuid4().hex[:8]}",
               MAKESPAN_TIME_SCALE="0.01", PATH=f"{user_venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    # the user's packages win in the user's project; makespan is the installed one
    probe = subprocess.run([py, "-c", "import app, workers, planner, makespan, makespan.planner.api, "
                                      "makespan.workers.tasks; print(app.OWNER, workers.OWNER, planner.OWNER); "
                                      "print(makespan.__file__)"],
                           cwd=user_project, env=env, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    owners, location = probe.stdout.strip().splitlines()
    assert owners == "user app user workers user planner"
    assert str(user_venv) in location and str(ROOT) not in location
    procs = []
    try:  # run.sh, as a user runs it (its two background processes, `makespan ready`, then submit.py)
        for line in readme_examples()["run.sh"].splitlines():
            cmd = line.split("#")[0].strip()
            if not cmd:
                continue
            if cmd.endswith("&"):
                procs.append(subprocess.Popen(cmd.rstrip("&").split(), cwd=user_project, env=env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                              start_new_session=True))
                continue
            # run.sh's `makespan ready` waits for the planner and the worker: submit.py must pass first time
            out = subprocess.run(cmd.split(), cwd=user_project, env=env, capture_output=True, text=True, timeout=120)
            for p in procs:
                assert p.poll() is None, p.stderr.read()
            assert out.returncode == 0, out.stderr
        assert "'text': 'HELLO'" in out.stdout and "'attempt': 1" in out.stdout
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        from makespan.keys import Keys
        from makespan.live import delete_prefix
        from makespan.redis_conn import connect

        r = connect(redis_url)
        delete_prefix(r, Keys(env["MAKESPAN_KEY_PREFIX"]))
        r.close()
