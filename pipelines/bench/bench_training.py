"""`tkp bench-input`: is training bound by its input pipeline or by the model?

For an image use case the input pipeline reads, decodes, resizes and augments (its
`prepare_batch`); memory then holds the decoded batches.

Trains the default model on the newest Transform output of the local pipeline (`tkp run`
first) in two ways, alternately, in one process: fed from the gzip TFRecords through the
Trainer's own tf.data pipeline (components/training/loop.py `_dataset`), and fed from the same
batches already decoded in memory. The ratio of the two throughputs (examples/second) says how much
the input costs: 1.0 means the model alone bounds the speed. Each figure is the median of `repeats`
passes after a warm-up pass (tracing and the cache fill are not timed).

A pass is one `fit` of `WARM_UP_STEPS + steps` steps, timed from its batch WARM_UP_STEPS to its
end: the steady state a long training runs in. What a pass pays before that (a new iterator:
for the TFRecords, filling the 10,000-example shuffle buffer) is paid once per training, not per
step, so it is reported on its own as the start-up, not mixed into the throughput: in a pass of
a few hundred steps it would weigh as much as the steps themselves.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import types
from pathlib import Path

from components.base.config import WORK_DIR, PipelineConfig
from components.base.errors import ActionableError

RESULTS_PATH = WORK_DIR / "bench" / "input.json"
WARM_UP_STEPS = 20


class NoTransformOutput(ActionableError, FileNotFoundError):
    """There is no Transform output to train from."""


def transform_outputs(config: PipelineConfig) -> tuple[str, str]:
    """(transformed examples folder, transform graph folder) of the newest local Transform."""
    from pipelines.run_summary import latest_step_outputs

    outputs = latest_step_outputs(config, "Transform")
    if "transformed_examples" not in outputs or "transform_graph" not in outputs:
        raise NoTransformOutput(
            f"no Transform output in {config.metadata_path}: run the pipeline first (make run)"
        )
    return outputs["transformed_examples"].uri, outputs["transform_graph"].uri


def data_classes(config: PipelineConfig) -> list[str] | None:
    """The classes ExampleGen found in the newest local run's data (image use cases)."""
    from components.steps.example_gen import CLASS_NAMES_KEY
    from pipelines.run_summary import latest_step_outputs

    examples = latest_step_outputs(config, "ExampleGen").get("examples")
    value = examples.custom_properties.get(CLASS_NAMES_KEY) if examples is not None else None
    return json.loads(value.string_value) if value is not None else None


def run(
    examples_dir: str, transform_graph_dir: str, config: PipelineConfig, steps: int = 400,
    repeats: int = 7, say=print, results_path: Path = RESULTS_PATH,
) -> dict:  # fmt: skip
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    import tensorflow_transform as tft
    from tfx.components.trainer import fn_args_utils
    from tfx.components.util import tfxio_utils
    from tfx.types import artifact_utils, standard_artifacts

    from components.base.use_case import load as load_use_case
    from components.training import loop

    examples = standard_artifacts.Examples()
    examples.uri = examples_dir
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    factory = tfxio_utils.get_tf_dataset_factory_from_artifact([examples], [])
    fn_args = types.SimpleNamespace(
        data_accessor=fn_args_utils.DataAccessor(factory, None, None)
    )  # fmt: skip
    graph = tft.TFTransformOutput(transform_graph_dir)
    files = [f"{examples_dir}/Split-train/*"]
    batch = config.batch_size
    use_case = load_use_case(config.use_case)
    hyperparameters = use_case.resolved_hyperparameters(json.loads(config.hyperparameters))
    # An image use case decodes (and augments) in the input pipeline: the in-memory batches are
    # the decoded ones, so the ratio prices reading, decoding and augmenting together.
    prepare = loop.model_inputs(use_case, hyperparameters)
    from_records = loop._dataset(files, fn_args, graph, use_case.label_key, batch, training=True,
                                 prepare=prepare)  # fmt: skip
    in_memory = from_records.take(WARM_UP_STEPS + steps).cache().repeat()
    context = loop.model_context(use_case, {"class_names": data_classes(config)})
    keras_model = use_case.function("build_model")(hyperparameters, config.learning_rate, **context)

    class Clock(tf.keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.began = time.perf_counter()

        def on_train_batch_begin(self, batch_index, logs=None):
            if batch_index == WARM_UP_STEPS:
                self.steady = time.perf_counter()

        def on_train_batch_end(self, batch_index, logs=None):
            if batch_index == 0:  # the first batch waits for the shuffle buffer to fill
                self.first_batch = time.perf_counter()

        def on_train_end(self, logs=None):
            self.ended = time.perf_counter()

    def one_pass(dataset) -> tuple[float, float]:
        """(examples/s in the steady state, seconds from `fit` to its first batch's end)."""
        clock = Clock()
        keras_model.fit(dataset, steps_per_epoch=WARM_UP_STEPS + steps, epochs=1, verbose=0,
                        callbacks=[clock])  # fmt: skip
        return steps * batch / (clock.ended - clock.steady), clock.first_batch - clock.began

    say(f"Warm-up: tracing, and {WARM_UP_STEPS + steps} batches decoded into memory ...")
    one_pass(from_records)
    one_pass(in_memory)  # fills the cache
    rates: dict[str, list[float]] = {"tfrecords": [], "in_memory": []}
    start_ups: dict[str, list[float]] = {"tfrecords": [], "in_memory": []}
    for index in range(repeats):  # alternated, so that machine noise hits both alike
        for name, dataset in (("tfrecords", from_records), ("in_memory", in_memory)):
            rate, start_up = one_pass(dataset)
            rates[name].append(rate)
            start_ups[name].append(start_up)
        say(f"  pass {index + 1}/{repeats}: TFRecords {rates['tfrecords'][-1]:,.0f}, "
            f"in memory {rates['in_memory'][-1]:,.0f} examples/s")  # fmt: skip
    medians = {name: statistics.median(values) for name, values in rates.items()}
    results = {
        "steps": steps,
        "warm_up_steps": WARM_UP_STEPS,
        "batch_size": batch,
        "repeats": repeats,
        "threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "cpus": os.cpu_count(),
        "examples_per_second": medians,
        "passes": rates,
        "ratio": medians["tfrecords"] / medians["in_memory"],
        "start_up_seconds": {name: statistics.median(v) for name, v in start_ups.items()},
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    results["written_to"] = str(results_path)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2))
    return results


def table(results: dict) -> str:
    rates = results["examples_per_second"]
    start_up = results["start_up_seconds"]
    return "\n".join([
        f"Training input benchmark: {results['steps']} steps of {results['batch_size']} examples "
        f"after {results['warm_up_steps']}, median of {results['repeats']} passes "
        f"({results['cpus']} CPUs)",
        f"  from the TFRecords (tf.data)  {rates['tfrecords']:>10,.0f} examples/s",
        f"  from memory (decoded)         {rates['in_memory']:>10,.0f} examples/s",
        f"  ratio                          {results['ratio']:>10.2f}  (1.0: the model bounds the "
        "speed, not the input)",
        f"  start-up, once per training   {start_up['tfrecords']:>10.2f} s from the TFRecords "
        f"(shuffle buffer), {start_up['in_memory']:.2f} s from memory",
        f"Written to {results['written_to']}",
    ])  # fmt: skip
