"""The process driver: an endpoint instance is a real child process.

``start`` takes a free loopback port (:func:`makespan.redis_conn.free_port`), substitutes placeholders in the fleet file's
``launch.command`` (``{port}``, ``{model}``, ``{tp}``, ``{python}``, ``{load_time_s}``,
``{sleep_s}``, ``{wake_s}``, ``{wake_level2_s}``: wall seconds, the fleet file's
``evict_s``/``wake_s``/``wake_level2_s`` × time scale; ``wake_level2_s`` unset: ``wake_s``),
sets ``CUDA_VISIBLE_DEVICES`` to the comma-joined GPU UUIDs (CUDA accepts UUIDs, so
the process sees exactly the leased physical GPUs, whatever their indices), starts
it in its own session with stdout/stderr appended to a kept log file, and polls
``GET url+health_path`` with exponential backoff (``backoff_initial_s`` doubling up
to ``backoff_max_s``) until 200 or ``launch.health_timeout_s``. An empty command runs
:mod:`makespan.workers.endpoint_server` with ``--load-time-s = cold_start_s × time_scale``
(and ``--sleep-s`` from ``evict_s`` × time_scale; for an endpoint with a ``wake_s``, its sleep
mode, ``--wake-s``/``--wake-level2-s`` from ``wake_s``/``wake_level2_s`` × time_scale).

**A port taken before the server binds it.** A free port is free only when it is chosen:
the kernel hands the same ephemeral range to outgoing connections and to other servers, and
a model server binds its port seconds after it is spawned (its imports). A process that
exits before its health check passes, having written an address-in-use error
(:data:`ADDRESS_IN_USE`; only that try's own output counts, not an earlier try's nor the
argv header), is spawned again on a new free port as the same instance (its id, its log
file, and its registry record: ``on_spawn`` is called again with the new pid and port), up
to :data:`PORT_TRIES` ports in all, each try with the full health timeout; then the start
fails with :class:`PortTaken` (a :class:`PhaseError`). Any other exit fails the start at once.

Sleep mode (``sleep``/``wake``/``is_sleeping``): vLLM's HTTP routes ``POST /sleep?level=N``,
``POST /wake_up`` and ``GET /is_sleeping`` (vLLM docs, "Sleep Mode"; served by ``vllm
serve --enable-sleep-mode`` with ``VLLM_SERVER_DEV_MODE=1``, and by the bundled endpoint
server).

``stop`` sends SIGTERM to the instance's whole process group (and session: children
that moved to a process group of their own within it are found too), waits up to
``grace_s`` for every member to end, then SIGKILLs each one still alive (a model
server's engine or tensor-parallel workers that ignore SIGTERM and would keep their
GPU memory), checks the group is empty, and returns a :class:`StopReport` of what it
had to kill (logged as a warning). While its process shuts down (SIGTERM:
:func:`makespan.shutdown.time_left_s`) the grace is at most the time left before the
shutdown's watchdog, less :data:`SHUTDOWN_RESERVE_S`, so the SIGKILL comes before the
watchdog ends the process mid-stop (``MAKESPAN_SHUTDOWN_GRACE_S`` may be below
``grace_s``: 4 s in the Procfile). Launch commands come only from the fleet file (never from a job payload) and are
run without a shell.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from collections.abc import Callable

import httpx

from makespan import shutdown, telemetry
from makespan.errors import PhaseError
from makespan.models import EndpointSpec
from makespan.redis_conn import free_port
from makespan.workers.drivers.base import (DriverCapabilities, DriverContext, Instance, NoLaunchOptions, StopReport,
                                          machine_name)
from makespan.workers.drivers.pids import (INSTANCE_ENV, group_members, instance_members, is_instance_process,
                                           of_another_user, process_alive)

log = logging.getLogger(__name__)
_WARNED_OTHER_USER: set[str] = set()  # instance ids already warned about (once each per process)


def _warn_other_user(instance: Instance) -> None:
    """Say once per instance that its process belongs to another Unix user."""
    if instance.id in _WARNED_OTHER_USER:
        return
    _WARNED_OTHER_USER.add(instance.id)
    log.warning("endpoint %s (instance %s): pid %s belongs to another Unix user, so this process cannot tell it is "
                "the instance's own nor stop it; it is taken as running. Run the GPU worker and the observer of a "
                "host as the user that started its endpoint processes (docs/operations.md \"Running under a "
                "supervisor\")", instance.endpoint, instance.id, instance.pid)

DEFAULT_GRACE_S = 5.0
KILL_WAIT_S = 5.0  # longest stop() waits for SIGKILLed members to disappear
SHUTDOWN_RESERVE_S = 1.0  # at shutdown, kept after the grace for the SIGKILL, its wait and the unregister
GROUP_POLL_S = 0.05
PROBE_TIMEOUT_S = 1.0
SLEEP_TIMEOUT_S = 600.0  # longest a sleep or wake request may take (a large model's level-2 wake)
ANSWER_POLL_S = 0.05  # a sleep or wake request's answer is awaited in pauses this long (when the context gives one)
PROCESS_START_FLOOR_S = 5.0  # least wall time a transition of a real endpoint process is given
PORT_TRIES = 3  # ports start() tries when the process exits on a taken port before its health check passes
ADDRESS_IN_USE = ("address already in use", "eaddrinuse")  # in the output of a try, lower case
RETRY_PAUSE_S = 0.05  # the context's pause before a try on another port (the phase runner's checks a cancel there)
ADDRESS_IN_USE_TAIL_BYTES = 8192  # how much of the log's end is searched for them (a traceback comes after)


class PortTaken(PhaseError):
    """The endpoint process exited before its health check passed, and its log says its
    port was in use: another process bound the port between its choice and the bind."""


def default_log_dir() -> Path:
    """``MAKESPAN_LOG_DIR``, or ``$TMPDIR/makespan-logs-{uid}`` (created).

    The default is per user and created mode 0700 (endpoint logs can hold prompts and
    tokens; ``$TMPDIR`` is shared on most hosts); this user's own one with a wider mode is
    set back to 0700. Raises PermissionError when the default exists and belongs to
    another user, or is not a directory (someone created it first: its logs would not be
    private)."""
    configured = os.environ.get("MAKESPAN_LOG_DIR")
    if configured:  # one it creates is private too (an existing one keeps the mode its owner gave it)
        d = Path(configured)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        return d
    d = Path(tempfile.gettempdir()) / f"makespan-logs-{os.getuid()}"
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:  # something else than a directory: refused below
        pass
    info = d.lstat()
    if info.st_uid != os.getuid() or not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"the endpoint log directory {d} is not a private directory of this user (owner uid "
                              f"{info.st_uid}, mode {stat.filemode(info.st_mode)}); remove it or set "
                              f"MAKESPAN_LOG_DIR to a directory of your own")
    if info.st_mode & 0o077:  # ours, but open to other users (an older makespan, a umask): closed again
        d.chmod(0o700)
    return d


pid_alive = _alive = process_alive  # earlier names of process_alive, kept for existing callers


def _cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def _tail(path: str | None, n_bytes: int = 600, start: int = 0) -> str:
    """The last ``n_bytes`` of the file at ``path``, none before offset ``start``; "" if unreadable."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(start, f.tell() - n_bytes))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""


def endpoint_environment() -> dict[str, str]:
    """The environment an endpoint process starts from: this process's, less makespan's own
    settings (``MAKESPAN_*``: an endpoint is not a makespan process, and
    ``MAKESPAN_REDIS_URL`` carries the Redis password, which a model server running model
    code must not read). The driver adds ``CUDA_VISIBLE_DEVICES``, :data:`INSTANCE_ENV` and
    its own (:meth:`ProcessDriver.extra_env`)."""
    return {name: value for name, value in os.environ.items() if not name.startswith("MAKESPAN_")}


class ProcessDriver:
    """Spawn, probe and stop endpoint processes (see module doc).

    Args:
        grace_s: seconds between SIGTERM and SIGKILL.
        log_dir: where ``{endpoint}-{instance id}.log`` files are kept.
        health_timeout_s: overrides ``launch.health_timeout_s`` when given.
        backoff_initial_s / backoff_max_s: health-probe backoff bounds.
        probe_timeout_s: how long one health probe waits for the answer (default
            :data:`PROBE_TIMEOUT_S`; the observer passes its ``--probe-timeout-s``).
        context: the registry's :class:`DriverContext`: its ``pause`` spends the waits
            between health probes (a cancel, a lost lease or the GPU worker's shutdown
            raised there abandons the start: the process group is stopped) and the wait
            for a wake's answer (raised there: the wake is abandoned, the caller stops the
            instance); its modelled ``wait`` is unused (a real process takes the time it
            takes).
    """

    name = "process"
    capabilities = DriverCapabilities(spawns_process=True, sleep_levels=(1, 2), reports_alive=True,
                                      min_transition_wall_s=PROCESS_START_FLOOR_S)
    options_model = NoLaunchOptions

    def __init__(self, grace_s: float = DEFAULT_GRACE_S, log_dir: str | Path | None = None,
                 health_timeout_s: float | None = None, backoff_initial_s: float = 0.05,
                 backoff_max_s: float = 1.0, context: DriverContext | None = None,
                 probe_timeout_s: float = PROBE_TIMEOUT_S):
        self.grace_s = grace_s
        self.probe_timeout_s = probe_timeout_s
        self.log_dir = Path(log_dir) if log_dir else None
        self.health_timeout_s = health_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._pause = (context.pause if context is not None else None) or time.sleep
        self._pause_given = context is not None and context.pause is not None

    # -- command ---------------------------------------------------------------------
    def command(self, endpoint: EndpointSpec, port: int, time_scale: float) -> list[str]:
        """The argv for ``endpoint`` on ``port`` (placeholders substituted)."""
        cmd = list(endpoint.launch.command) or [
            "{python}", "-m", "makespan.workers.endpoint_server", "--port", "{port}", "--model", "{model}",
            "--load-time-s", "{load_time_s}", "--sleep-s", "{sleep_s}"]
        if not endpoint.launch.command and endpoint.wake_s is not None:  # no sleep mode: no wake flags to read in ps
            cmd += ["--wake-s", "{wake_s}", "--wake-level2-s", "{wake_level2_s}"]
        wake_s = endpoint.wake_s if endpoint.wake_s is not None else endpoint.cold_start_s
        wake_level2_s = endpoint.wake_level2_s if endpoint.wake_level2_s is not None else wake_s
        subs = {"{port}": str(port), "{model}": endpoint.model, "{tp}": str(endpoint.tensor_parallel),
                "{python}": sys.executable, "{load_time_s}": repr(endpoint.cold_start_s * time_scale),
                "{sleep_s}": repr(endpoint.evict_s * time_scale), "{wake_s}": repr(wake_s * time_scale),
                "{wake_level2_s}": repr(wake_level2_s * time_scale)}
        out = []
        for arg in cmd:
            for k, v in subs.items():
                arg = arg.replace(k, v)
            out.append(arg)
        return out

    def extra_env(self, endpoint: EndpointSpec) -> dict[str, str]:
        """Environment variables added for ``endpoint`` (none here)."""
        return {}

    # -- lifecycle -------------------------------------------------------------------
    def start(self, endpoint: EndpointSpec, gpus: list[str], time_scale: float = 1.0,
              host: str = "", on_spawn: Callable[[Instance], None] | None = None) -> Instance:
        """Spawn and wait for health. ``on_spawn(instance)`` is called right after the
        process is spawned, before its health check (the GPU worker registers it as
        ``starting`` there, so it is tracked from its first moment), and again with the
        same instance (its new pid and port) when the start moves to another port (see
        the module doc); the instance's ``owner_pid`` is this process. Raises
        :class:`PhaseError` (timeout, early exit, command not found, ``on_spawn`` failed;
        :class:`PortTaken` when every one of :data:`PORT_TRIES` ports was taken); the
        process group is stopped before the error is raised."""
        if len(gpus) != endpoint.tensor_parallel:
            raise PhaseError(f"endpoint {endpoint.name!r}: needs {endpoint.tensor_parallel} GPUs, got {len(gpus)}")
        timeout_s = self.health_timeout_s if self.health_timeout_s is not None else endpoint.launch.health_timeout_s
        inst: Instance | None = None
        for attempt in range(1, PORT_TRIES + 1):
            inst, output_from = self._spawn(endpoint, gpus, time_scale, host, free_port(), inst)
            if on_spawn is not None:
                try:
                    on_spawn(inst)
                except Exception as e:  # noqa: BLE001 - an untracked process must not run on
                    self.stop(inst)
                    raise PhaseError(f"endpoint {endpoint.name!r}: spawned process {inst.pid} could not be recorded "
                                     f"({type(e).__name__}: {e}); stopped it") from e
            try:
                with telemetry.child_span("health_check", {"url": inst.url, "timeout_s": timeout_s}):
                    self._wait_healthy(endpoint, inst, timeout_s, output_from)
            except PortTaken as e:
                left = self.stop(inst).left  # what is left of its group
                if left:  # members outlived SIGKILL: nothing is started beside them (as _clear_for_start)
                    raise PhaseError(f"{e}; processes {', '.join(map(str, left))} of that try outlived SIGKILL: "
                                     "not starting it again beside them") from e
                if attempt == PORT_TRIES:
                    raise
                log.warning("%s; starting it again on another port (try %d of %d)", e, attempt + 1, PORT_TRIES)
                if self._pause_given:  # a cancel, a lost lease or a shutdown meanwhile ends the start here
                    self._pause(RETRY_PAUSE_S)
                continue
            except BaseException:
                self.stop(inst)  # early exit or timeout: no member of its group may stay behind
                raise
            inst.started_at = time.time()
            return inst
        raise AssertionError("unreachable: the last try returned or raised")

    def _spawn(self, endpoint: EndpointSpec, gpus: list[str], time_scale: float, host: str, port: int,
               inst: Instance | None) -> tuple[Instance, int]:
        """Spawn ``endpoint``'s process on ``port``: a new instance, or ``inst`` again (a
        start retried on another port keeps its id and log file). Returns the instance and
        the log offset where this process's output begins (after the header line this
        spawn writes). Raises PhaseError (log directory, command not found)."""
        argv = self.command(endpoint, port, time_scale)
        if inst is None:
            inst = Instance(endpoint.name, list(gpus), self.name, host=host, time_scale=time_scale,
                            health_path=endpoint.launch.health_path)
            try:
                log_dir = self.log_dir or default_log_dir()
            except OSError as e:
                raise PhaseError(f"endpoint {endpoint.name!r}: no log directory: {e}") from e
            inst.log_path = str(log_dir / f"{endpoint.name}-{inst.id}.log")
        inst.url, inst.port = f"http://127.0.0.1:{port}", port
        inst.pid = inst.proc = None  # an earlier try's process is stopped and reaped: never signalled again
        inst.stopped = True  # until this try's process exists (a failed spawn leaves nothing to stop)
        try:
            Path(inst.log_path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PhaseError(f"endpoint {endpoint.name!r}: cannot create log directory for {inst.log_path}: {e}") from e
        env = {**endpoint_environment(), **self.extra_env(endpoint), "CUDA_VISIBLE_DEVICES": ",".join(gpus),
               "PYTHONUNBUFFERED": "1", INSTANCE_ENV: inst.id}
        try:
            with open(inst.log_path, "ab") as log_file, telemetry.child_span("process_spawn", {"argv0": argv[0], "port": port}):
                log_file.write(f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} argv={argv} gpus={gpus}\n".encode())
                log_file.flush()
                output_from = log_file.tell()
                inst.proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             env=env, start_new_session=True, cwd=os.getcwd())
        except OSError as e:
            raise PhaseError(f"endpoint {endpoint.name!r}: cannot run {argv[0]!r}: {e}") from e
        inst.pid, inst.stopped = inst.proc.pid, False
        inst.owner_pid = os.getpid()
        inst.machine = machine_name()
        return inst, output_from

    def _wait_healthy(self, endpoint: EndpointSpec, inst: Instance, timeout_s: float, output_from: int = 0) -> None:
        """Probe until healthy. Raises :class:`PortTaken` when the process exited and
        what it wrote (the log from ``output_from``: not an earlier try's output, not the
        header with its argv) says its address was in use; PhaseError for any other exit
        or the timeout."""
        deadline = time.monotonic() + timeout_s
        delay_s, probes, last = self.backoff_initial_s, 0, "no answer"
        while True:
            if inst.proc is not None and inst.proc.poll() is not None:
                code = inst.proc.returncode
                excerpt = _tail(inst.log_path, start=output_from) or "(it wrote nothing: check its launch command)"
                what = (f"endpoint {endpoint.name!r}: process exited with code {code} before its health check "
                        f"passed; log {inst.log_path}: {excerpt}")
                tail = _tail(inst.log_path, ADDRESS_IN_USE_TAIL_BYTES, output_from).lower()
                if any(sign in tail for sign in ADDRESS_IN_USE):
                    raise PortTaken(f"{what} (its output reports an address in use; it was given port {inst.port}, "
                                    "which another process may have taken)")
                raise PhaseError(what)
            probes += 1
            ok, last = self._probe(inst)
            if ok:
                return
            now = time.monotonic()
            if now >= deadline:
                self.stop(inst)
                raise PhaseError(f"endpoint {endpoint.name!r}: health check {inst.url}{inst.health_path} did not "
                                 f"pass within {timeout_s} s after {probes} probes (last: {last}); "
                                 f"log {inst.log_path}")
            self._pause(min(delay_s, max(deadline - now, 0.0)))  # may raise: start() stops the process
            delay_s = min(delay_s * 2, self.backoff_max_s)

    def _probe(self, inst: Instance) -> tuple[bool, str]:
        try:
            resp = httpx.get(f"{inst.url}{inst.health_path}", timeout=self.probe_timeout_s)
            return resp.status_code == 200, f"HTTP {resp.status_code}"
        except httpx.HTTPError as e:
            return False, type(e).__name__

    def health(self, instance: Instance) -> bool:
        """True if the process runs and its health route answers 200."""
        if instance.stopped:
            return False
        if instance.proc is not None and instance.proc.poll() is not None:
            return False
        if instance.proc is None and not self.is_alive(instance):
            return False
        return self._probe(instance)[0]

    def is_alive(self, instance: Instance) -> bool:
        """False once the instance's process has ended (True while it runs, or when no
        pid is recorded: nothing known to have ended); a pid that now runs another program
        (:func:`makespan.workers.drivers.pids.is_instance_process`) is ended."""
        if instance.pid is None:
            return True
        if not process_alive(instance.pid):
            return False
        if instance.proc is not None or self._ours(instance):
            return True
        if of_another_user(instance.pid):  # cannot tell: not ended (a restart would start a second copy)
            _warn_other_user(instance)
            return True
        return False

    @staticmethod
    def _ours(instance: Instance) -> bool:
        return instance.pid is not None and is_instance_process(instance.pid, instance.id, instance.gpus)

    @staticmethod
    def _members(instance: Instance) -> list[int]:
        """The live members of the instance's group or session: all of them for a process
        spawned here, else those that carry its id (:func:`makespan.workers.drivers.pids.instance_members`)."""
        assert instance.pid is not None
        if instance.proc is not None:
            return group_members(instance.pid)
        return instance_members(instance.pid, instance.id, instance.gpus)

    def stop(self, instance: Instance) -> StopReport:
        """Stop the instance's whole process group: SIGTERM to every member, up to
        ``grace_s`` for all of them to end, then SIGKILL to each one left, and a check
        that the group is empty; idempotent (a second call reports nothing). The log is
        kept. While the process shuts down the grace is bounded by the time left (see the
        module doc). Returns what it had to kill (see :class:`StopReport`); anything killed
        is logged as a warning, anything left after SIGKILL as an error."""
        pid = instance.pid
        if pid is None or instance.stopped:
            instance.stopped = True
            return StopReport(pid)
        # read from the registry, not spawned here: only the processes that carry the
        # instance's id are signalled (module pids): a pid reused by another program after a
        # reboot, or a record naming any pid, or the dead leader of another program's session
        leader_ours = True
        if instance.proc is None:
            ours = self._members(instance)
            leader_ours = pid in ours or not process_alive(pid)
            if not leader_ours or not ours:
                if not leader_ours:
                    log.warning("endpoint %s (instance %s): pid %d runs another program (%s), not its endpoint "
                                "process: not signalled; the instance's own process is gone", instance.endpoint,
                                instance.id, pid, _cmdline(pid)[:120] or "unreadable")
                instance.stopped = True
                return StopReport(pid)
        grace_s = self.stop_grace_s()
        before = set(self._members(instance)) | ({pid} if process_alive(pid) else set())
        whole_group = instance.proc is not None or pid in before  # a live leader of ours: its group is ours
        if whole_group:
            self._signal(pid, signal.SIGTERM)
        for m in before - {pid}:
            self._signal_one(m, signal.SIGTERM)  # members in another group of the session
        remaining = self._wait_group(instance, time.monotonic() + grace_s)
        killed = tuple((m, _cmdline(m)) for m in remaining)
        if remaining:
            if whole_group:
                self._signal(pid, signal.SIGKILL)
            for m in remaining:
                self._signal_one(m, signal.SIGKILL)
            remaining = self._wait_group(instance, time.monotonic() + KILL_WAIT_S)
        instance.stopped = True
        report = StopReport(pid, tuple(sorted(before - {m for m, _ in killed} - set(remaining))), killed,
                            tuple(remaining))
        if killed:
            log.warning("endpoint %s (pid %d): %d process(es) of its group outlived SIGTERM by %.1f s and were "
                        "SIGKILLed: %s", instance.endpoint, pid, len(killed), grace_s,
                        "; ".join(f"{m} {c[:120]}" for m, c in killed))
        if remaining:
            log.error("endpoint %s (pid %d): processes %s still alive after SIGKILL", instance.endpoint, pid,
                      list(remaining))
        return report

    def stop_grace_s(self) -> float:
        """Seconds a stop waits between SIGTERM and SIGKILL now: ``grace_s``, or while this
        process shuts down at most :func:`makespan.shutdown.time_left_s` less
        :data:`SHUTDOWN_RESERVE_S` (0: SIGKILL at once)."""
        left_s = shutdown.time_left_s()
        if left_s is None:
            return self.grace_s
        return max(0.0, min(self.grace_s, left_s - SHUTDOWN_RESERVE_S))

    def _wait_group(self, instance: Instance, deadline: float) -> list[int]:
        """Poll until no member of the instance's group runs or ``deadline`` (monotonic
        s) passes, reaping the leader when it is our child; the members still alive."""
        while True:
            if instance.proc is not None:
                instance.proc.poll()  # reap the leader: a zombie is not a member
            members = self._members(instance)  # (a process spawned elsewhere: instance_members adds a lone leader)
            if not members and instance.proc is not None:
                try:  # it may have ended between poll() and the scan (a zombie is no member): reap it now
                    instance.proc.wait(timeout=max(0.0, deadline - time.monotonic()) + GROUP_POLL_S)
                except subprocess.TimeoutExpired:
                    members = [instance.pid]
            if not members or time.monotonic() >= deadline:
                return members
            time.sleep(GROUP_POLL_S)

    @staticmethod
    def _signal_one(pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    # -- vLLM sleep mode ---------------------------------------------------------------
    def sleep(self, instance: Instance, level: int = 1) -> None:
        """vLLM's ``POST /sleep?level=N`` (level 1: weights offloaded to host RAM, KV cache
        dropped; level 2: both dropped). Returns once the server answered. Raises
        PhaseError: level not 1 or 2, no answer, or a non-200 answer (no sleep mode)."""
        if level not in (1, 2):
            raise PhaseError(f"endpoint {instance.endpoint!r}: sleep level must be 1 or 2, got {level}")
        self._post(instance, f"/sleep?level={int(level)}")

    def wake(self, instance: Instance) -> None:
        """vLLM's ``POST /wake_up``, its answer awaited through the context's ``pause``
        when given (:meth:`_post`: a pause that raises abandons the wake). Raises
        PhaseError on no answer or a non-200 answer."""
        self._post(instance, "/wake_up")

    def is_sleeping(self, instance: Instance) -> bool:
        """vLLM's ``GET /is_sleeping`` (``{"is_sleeping": bool}``). Raises PhaseError on no
        answer, a non-200 answer or a body without that field."""
        path = "/is_sleeping"
        try:
            resp = httpx.get(f"{instance.url}{path}", timeout=PROBE_TIMEOUT_S * 5)
            value = resp.json().get("is_sleeping") if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            raise PhaseError(f"endpoint {instance.endpoint!r}: GET {path} failed: {e}") from e
        if not isinstance(value, bool):
            raise PhaseError(f"endpoint {instance.endpoint!r}: GET {path} answered HTTP {resp.status_code} "
                             f"without a boolean is_sleeping")
        return value

    def _post(self, instance: Instance, path: str) -> None:
        """POST ``path`` and wait up to :data:`SLEEP_TIMEOUT_S` for its answer. With the
        context's ``pause`` (the phase runner's wake), the wait is spent through it in
        slices of :data:`ANSWER_POLL_S`: a pause that raises (a lost lease, the GPU worker's
        shutdown) abandons the request (it runs on in a daemon thread until the server
        answers or the caller stops the instance) and the error goes on. Raises PhaseError
        on no answer or a non-200 answer."""
        url = f"{instance.url}{path}"
        if not self._pause_given:
            answer: httpx.Response | httpx.HTTPError = self._send_post(url)
        else:
            box: list[httpx.Response | httpx.HTTPError] = []
            sender = threading.Thread(target=lambda: box.append(self._send_post(url)), daemon=True,
                                      name=f"endpoint-post-{instance.id}")
            sender.start()
            while sender.is_alive():
                self._pause(ANSWER_POLL_S)  # may raise: the request is abandoned
            if not box:  # the sender raised something other than an HTTP error (logged by threading)
                raise PhaseError(f"endpoint {instance.endpoint!r}: POST {path} failed without an answer")
            answer = box[0]
        if isinstance(answer, httpx.HTTPError):
            raise PhaseError(f"endpoint {instance.endpoint!r}: POST {path} failed: {answer}") from answer
        resp = answer
        if resp.status_code != 200:
            raise PhaseError(f"endpoint {instance.endpoint!r}: POST {path} answered HTTP {resp.status_code}")

    @staticmethod
    def _send_post(url: str) -> httpx.Response | httpx.HTTPError:
        """One POST of ``url`` (:data:`SLEEP_TIMEOUT_S`): its answer, or the error it raised."""
        try:
            return httpx.post(url, timeout=SLEEP_TIMEOUT_S)
        except httpx.HTTPError as e:
            return e
