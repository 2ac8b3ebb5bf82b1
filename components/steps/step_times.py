"""Each step's seconds, handed down the DAG so that the last step can report them all.

A step's output artifacts carry `step_times`, a JSON object {step: [start, seconds]} (start: Unix
time when its executor began; seconds: how long it took), holding the step's own entry and those
its input artifacts carry. A step served from a cache hands on the entry of the run that made
its outputs; its start gives it away. Both runners call `timed` around every executor (stock
ones too): pipelines/local/local_runner.py through TFX's executor operator,
pipelines/kubeflow/tfx_v2_executor.py
on Kubeflow, where no step can read another's execution from ML Metadata. On Kubeflow the times
leave out each pod's start-up.
"""

from __future__ import annotations

import json
import time

STEP_TIMES_KEY = "step_times"


def carried(input_dict: dict[str, list]) -> dict[str, tuple[float, float]]:
    """The step times the input artifacts carry, merged, in the order the steps started."""
    times: dict[str, tuple[float, float]] = {}
    for artifacts in input_dict.values():
        for artifact in artifacts:
            for step, entry in read(artifact).items():
                # A cached input may carry an older run's entry for a step: the newest wins.
                if step not in times or entry[0] > times[step][0]:
                    times[step] = entry
    return dict(sorted(times.items(), key=lambda item: item[1][0]))


def read(artifact) -> dict[str, tuple[float, float]]:
    """An artifact's step times ({} without them). On Kubeflow a custom property comes back as
    a struct-wrapped value (kubeflow_v2_entrypoint_utils), which the typed getter unwraps."""
    if not artifact.has_custom_property(STEP_TIMES_KEY):
        return {}
    try:
        times = json.loads(artifact.get_string_custom_property(STEP_TIMES_KEY))
        return {str(k): (float(v[0]), float(v[1])) for k, v in times.items()}
    except (TypeError, ValueError, IndexError):
        return {}


def timed(executor, step: str):
    """Wraps `executor.Do`: after it returns, every output artifact carries the step times. An
    executor that returns its own ExecutorOutput (none in this pipeline) publishes that instead,
    without them."""
    do = executor.Do

    def timed_do(input_dict, output_dict, exec_properties):
        started, clock = time.time(), time.monotonic()
        result = do(input_dict, output_dict, exec_properties)
        own = (round(started, 2), round(time.monotonic() - clock, 2))
        value = json.dumps({**carried(input_dict), step: own})
        for artifacts in output_dict.values():
            for artifact in artifacts:
                if not artifact.TYPE_NAME.startswith("system."):  # the UI's own types stay clean
                    artifact.set_string_custom_property(STEP_TIMES_KEY, value)
        return result

    executor.Do = timed_do
    return executor
