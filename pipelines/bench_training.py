"""`tkp bench-input`: is training bound by its input pipeline or by the model?

Trains the default model on the newest Transform output of the local pipeline (`tkp run`
first) in two ways, alternately, in one process: fed from the gzip TFRecords through the
Trainer's own tf.data pipeline (components/model.py `_dataset`), and fed from the same batches
already decoded in memory. The ratio of the two throughputs (examples/second) says how much
the input costs: 1.0 means the model alone bounds the speed. Each figure is the median of
`repeats` timed passes after a warm-up pass (tracing and the cache fill are not timed).
"""

from __future__ import annotations

import json
import os
import statistics
import time
import types
from pathlib import Path

from pipelines.config import WORK_DIR, PipelineConfig
from pipelines.errors import ActionableError

RESULTS_PATH = WORK_DIR / "bench" / "input.json"


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


def run(
    examples_dir: str, transform_graph_dir: str, config: PipelineConfig, steps: int = 200,
    repeats: int = 3, say=print, results_path: Path = RESULTS_PATH,
) -> dict:  # fmt: skip
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf
    import tensorflow_transform as tft
    from tfx.components.trainer import fn_args_utils
    from tfx.components.util import tfxio_utils
    from tfx.types import artifact_utils, standard_artifacts

    from components import model

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
    from_records = model._dataset(files, fn_args, graph, batch, training=True)
    in_memory = from_records.take(steps).cache().repeat()
    keras_model = model.build_model(list(config.hidden_units), config.learning_rate)

    def examples_per_second(dataset) -> float:
        began = time.perf_counter()
        keras_model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)
        return steps * batch / (time.perf_counter() - began)

    say(f"Warm-up: tracing, and {steps} batches decoded into memory ...")
    examples_per_second(from_records)
    examples_per_second(in_memory)  # fills the cache
    rates: dict[str, list[float]] = {"tfrecords": [], "in_memory": []}
    for index in range(repeats):  # alternated, so that machine noise hits both alike
        rates["tfrecords"].append(examples_per_second(from_records))
        rates["in_memory"].append(examples_per_second(in_memory))
        say(f"  pass {index + 1}/{repeats}: TFRecords {rates['tfrecords'][-1]:,.0f}, "
            f"in memory {rates['in_memory'][-1]:,.0f} examples/s")  # fmt: skip
    medians = {name: statistics.median(values) for name, values in rates.items()}
    results = {
        "steps": steps,
        "batch_size": batch,
        "repeats": repeats,
        "threads": tf.config.threading.get_inter_op_parallelism_threads(),
        "cpus": os.cpu_count(),
        "examples_per_second": medians,
        "passes": rates,
        "ratio": medians["tfrecords"] / medians["in_memory"],
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    results["written_to"] = str(results_path)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(results, indent=2))
    return results


def table(results: dict) -> str:
    rates = results["examples_per_second"]
    return "\n".join([
        f"Training input benchmark: {results['steps']} steps of {results['batch_size']} examples, "
        f"median of {results['repeats']} passes ({results['cpus']} CPUs)",
        f"  from the TFRecords (tf.data)  {rates['tfrecords']:>10,.0f} examples/s",
        f"  from memory (decoded)         {rates['in_memory']:>10,.0f} examples/s",
        f"  ratio                          {results['ratio']:>10.2f}  (1.0: the model bounds the "
        "speed, not the input)",
        f"Written to {results['written_to']}",
    ])  # fmt: skip
