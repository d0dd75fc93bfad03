"""The vLLM preset: builds ``vllm serve`` and runs it with the process driver.

Command: ``vllm serve MODEL --tensor-parallel-size TP --port PORT
--gpu-memory-utilization U`` plus ``--enable-sleep-mode`` when ``launch.sleep_mode``
(vLLM only exposes ``/sleep`` and ``/wake_up`` with ``VLLM_SERVER_DEV_MODE=1``, which
is set then). A non-empty ``launch.command`` replaces the ``vllm`` executable (e.g.
``["/opt/vllm/bin/vllm"]``). Health: ``GET /health``. A wake (``POST /wake_up``) is the
cheap transition the planner prices with ``wake_s`` instead of ``cold_start_s``.
Source: vLLM docs, "OpenAI-compatible server" and "Sleep mode".
"""

from __future__ import annotations

from makespan.errors import PhaseError
from makespan.models import EndpointSpec
from makespan.workers.drivers.base import Instance
from makespan.workers.drivers.process import ProcessDriver


class VllmDriver(ProcessDriver):
    name = "vllm"

    def command(self, endpoint: EndpointSpec, port: int, time_scale: float) -> list[str]:
        exe = list(endpoint.launch.command) or ["vllm"]
        argv = [*exe, "serve", endpoint.model, "--tensor-parallel-size", str(endpoint.tensor_parallel),
                "--port", str(port), "--host", "127.0.0.1",
                "--gpu-memory-utilization", repr(endpoint.launch.gpu_memory_utilization)]
        if endpoint.launch.sleep_mode:
            argv.append("--enable-sleep-mode")
        return argv

    def extra_env(self, endpoint: EndpointSpec) -> dict[str, str]:
        return {"VLLM_SERVER_DEV_MODE": "1"} if endpoint.launch.sleep_mode else {}

    def sleep(self, instance: Instance, level: int = 1) -> None:
        if level not in (1, 2):
            raise PhaseError(f"endpoint {instance.endpoint!r}: vLLM sleep level must be 1 or 2, got {level}")
        super().sleep(instance, level)
