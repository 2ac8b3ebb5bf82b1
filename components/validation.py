"""ExampleValidator that stops the run when the data break the curated schema.

Stock ExampleValidator only records anomalies; a pipeline that goes on would train and maybe push
a model on broken data. This executor fails the step instead, naming each column and problem.
"""

from __future__ import annotations

from tfx.components import ExampleValidator
from tfx.components.example_validator import executor as validator_executor
from tfx.dsl.components.base import executor_spec

from pipelines.errors import ActionableError


class DataValidationError(ActionableError, ValueError):
    """The examples do not match the schema."""


class Executor(validator_executor.Executor):
    def _Validate(self, inputs, outputs):
        anomalies = super()._Validate(inputs, outputs)
        self._anomalies.append((outputs, anomalies))
        return anomalies

    def Do(self, input_dict, output_dict, exec_properties) -> None:
        self._anomalies = []
        super().Do(input_dict, output_dict, exec_properties)
        problems = []
        for outputs, anomalies in self._anomalies:
            split_dir = next(iter(outputs.values()))
            for column, info in sorted(anomalies.anomaly_info.items()):
                problems.append(
                    f"  column '{column}': {info.short_description}: {info.description}"
                )
            if anomalies.HasField("dataset_anomaly_info"):
                info = anomalies.dataset_anomaly_info
                problems.append(f"  whole data set: {info.short_description}: {info.description}")
            if problems:
                problems.insert(0, f"in {split_dir}:")
                break  # one split's list is enough to act on; the others are on disk
        if problems:
            raise DataValidationError(
                "the data do not match the schema in schemas/; fix the input span or, if the "
                "change is intended, update the schema:\n" + "\n".join(problems)
            )


class StrictExampleValidator(ExampleValidator):
    """ExampleValidator whose step fails on any anomaly."""

    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(Executor)
