"""Example workload functions (installed as ``makespan.examples``): copy one to start yours.

* :mod:`makespan.examples.render_cards`: the render-cards pipeline of the design notes.
* :mod:`makespan.examples.batch_judge`: N prompts through a judge endpoint.
* :mod:`makespan.examples.trace_jobs`: the stand-in for a trace job (the demo's load).
"""

from pathlib import Path

FLEET = Path(__file__).with_name("render-pipeline.toml")  # the render-pipeline fleet (8 simulated GPUs)
