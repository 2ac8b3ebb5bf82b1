"""Step times handed down the DAG (components/steps/step_times.py): what the run report lists."""

from __future__ import annotations

import json

from tfx.types import standard_artifacts

from components.steps import kfp_artifacts, step_times


def _carrying(times: dict) -> standard_artifacts.Examples:
    artifact = standard_artifacts.Examples()
    artifact.set_string_custom_property(step_times.STEP_TIMES_KEY, json.dumps(times))
    return artifact


def test_inputs_merge_in_the_order_steps_ran_and_the_newest_entry_wins():
    # A cached input (the schema) carries an older run's SelectSpans; this run's wins.
    statistics = _carrying({"SelectSpans": [100.0, 0.1], "StatisticsGen": [105.0, 3.0]})
    schema = _carrying({"SelectSpans": [10.0, 0.2], "CuratedSchema": [11.0, 0.0]})
    merged = step_times.carried({"statistics": [statistics], "schema": [schema]})
    assert merged == {"CuratedSchema": (11.0, 0.0), "SelectSpans": (100.0, 0.1),
                      "StatisticsGen": (105.0, 3.0)}  # fmt: skip
    assert list(merged) == ["CuratedSchema", "SelectSpans", "StatisticsGen"]


def test_a_timed_executor_adds_its_own_entry_to_its_outputs_but_not_to_the_uis_types():
    class Executor:
        def Do(self, input_dict, output_dict, exec_properties):
            return None

    upstream = _carrying({"ExampleGen": [50.0, 2.0]})
    model, metrics = standard_artifacts.Model(), kfp_artifacts.Metrics()
    executor = step_times.timed(Executor(), "Trainer")
    executor.Do({"examples": [upstream]}, {"model": [model], "metrics": [metrics]}, {})
    carried = step_times.read(model)
    assert list(carried) == ["ExampleGen", "Trainer"] and carried["Trainer"][1] >= 0
    assert not metrics.has_custom_property(step_times.STEP_TIMES_KEY)


def test_a_value_that_is_not_step_times_is_ignored():
    artifact = standard_artifacts.Examples()
    artifact.set_string_custom_property(step_times.STEP_TIMES_KEY, "not json")
    assert step_times.read(artifact) == {}
