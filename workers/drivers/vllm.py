"""The vLLM preset: builds ``vllm serve`` and runs it with the process driver.

Command: ``vllm serve MODEL --tensor-parallel-size TP --port PORT
--gpu-memory-utilization U`` plus ``--enable-sleep-mode`` when the endpoint has a sleep
mode (``launch.sleep_mode`` or a ``wake_s``): vLLM only exposes its sleep routes with
``VLLM_SERVER_DEV_MODE=1``, which is set then. A non-empty ``launch.command`` replaces
the ``vllm`` executable (e.g. ``["/opt/vllm/bin/vllm"]``). Health: ``GET /health``.

Sleep mode, as vLLM documents it (docs.vllm.ai, "Sleep Mode"; the routes of
``vllm/entrypoints/serve/sleep/api_router.py``):

* ``POST /sleep?level=1``: weights offloaded to CPU RAM, KV cache discarded (fast
  wake; needs host RAM for the weights); ``level=2``: weights and KV cache discarded
  (slower wake, no RAM). The GPU memory is released either way.
* ``POST /wake_up``: back to serving (the cheap transition the planner prices with
  ``wake_s`` instead of ``cold_start_s``).
* ``GET /is_sleeping``: ``{"is_sleeping": true|false}``.

The GPU worker sleeps an evicted instance at the endpoint's ``sleep_level`` and wakes it
when a job or restore needs it on the same GPUs (:mod:`makespan.workers.phases`).
"""

from __future__ import annotations

from makespan.models import EndpointSpec
from makespan.workers.drivers.process import ProcessDriver


class VllmDriver(ProcessDriver):
    name = "vllm"

    def command(self, endpoint: EndpointSpec, port: int, time_scale: float) -> list[str]:
        exe = list(endpoint.launch.command) or ["vllm"]
        argv = [*exe, "serve", endpoint.model, "--tensor-parallel-size", str(endpoint.tensor_parallel),
                "--port", str(port), "--host", "127.0.0.1",
                "--gpu-memory-utilization", repr(endpoint.launch.gpu_memory_utilization)]
        if sleep_capable(endpoint):
            argv.append("--enable-sleep-mode")
        return argv

    def extra_env(self, endpoint: EndpointSpec) -> dict[str, str]:
        return {"VLLM_SERVER_DEV_MODE": "1"} if sleep_capable(endpoint) else {}


def sleep_capable(endpoint: EndpointSpec) -> bool:
    """True when ``endpoint`` runs with vLLM's sleep mode: ``launch.sleep_mode`` or a ``wake_s``."""
    return endpoint.launch.sleep_mode or endpoint.wake_s is not None
