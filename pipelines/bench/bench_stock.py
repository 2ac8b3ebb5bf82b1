"""Stock TFX doing our pipeline's work, for a benchmark against `create_pipeline` (pipeline.py).

The stock DAG is wired as TFX's taxi template wires it (tfx/experimental/templates/taxi/pipeline/
pipeline.py): CsvExampleGen (a local CSV folder, split train:eval 4:1 by hash as ours) ->
StatisticsGen -> ImportSchemaGen (the use case's curated schema) -> ExampleValidator -> Transform
(the use case's preprocessing_fn) -> Trainer (our run_fn, same train/eval args and custom_config)
-> Resolver (LatestBlessedModelStrategy) -> Evaluator (our EvalConfig,
components/steps/evaluation.py) -> Pusher (filesystem, `<serving_dir>/<timestamp>/`). No cache, so
every step runs.

What remains different from ours: no SelectSpans (ours picks complete spans in object storage,
fingerprints them and skips the run when nothing is new) and stock CsvExampleGen reads one local
folder, not spans through Beam's file systems with upload checks (SpanExampleGen); a stock
ExampleValidator only records anomalies (ours stops the run, and checks drift against the
previous span) and does not gate Transform; the stock Trainer has run parameters frozen in,
trains in one process (no local workers or cluster job) and keeps its backup in its model_run folder
(ours: keyed by content under the pipeline root); the baseline is the latest blessed model in ML
Metadata (ours: the served version) and the Evaluator has no quality-slide check; the stock
Pusher writes a timestamped folder (ours: a numbered version, TF Serving's model config, the
version registry and pruning).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Transform and TFMA need tf_keras, not Keras 3

from tfx import v1 as tfx  # noqa: E402

from components.base.config import PipelineConfig  # noqa: E402
from components.base.use_case import load as load_use_case  # noqa: E402
from components.steps.evaluation import eval_config  # noqa: E402
from pipelines.bench.suite import TRAINING_RECORD  # noqa: E402
from pipelines.pipeline import RUN_FN, trainer_config  # noqa: E402

# Read only by our TunableTrainer's executor (the backup's place and age), never by run_fn.
_EXECUTOR_ONLY_KEYS = ("checkpoint_root", "checkpoint_max_age_hours", "cluster_job")


def stock_trainer_config(config: PipelineConfig) -> dict[str, Any]:
    """run_fn's custom_config as our Trainer hands it over: trainer_config plus the run
    parameters TunableTrainer folds in (epochs, max_train_minutes), given statically."""
    custom = {k: v for k, v in trainer_config(config).items() if k not in _EXECUTOR_ONLY_KEYS}
    custom["epochs"] = config.epochs
    custom["max_train_minutes"] = float(config.max_train_minutes)
    return custom


def create_stock_pipeline(
    csv_dir: str,
    pipeline_root: str,
    metadata_path: str,
    serving_dir: str,
    config: PipelineConfig,
) -> tfx.dsl.Pipeline:
    """Our DAG from stock TFX components only; `csv_dir` holds CSV files and nothing else."""
    if config.num_workers > 1:
        raise ValueError("the stock Trainer trains in one process: use num_workers=1")
    use_case = load_use_case(config.use_case)
    # Ours: components/steps/example_gen.py SpanExampleGen's split (train 4 : eval 1 hash
    # buckets).
    output_config = tfx.proto.Output(
        split_config=tfx.proto.SplitConfig(
            splits=[
                tfx.proto.SplitConfig.Split(name="train", hash_buckets=4),
                tfx.proto.SplitConfig.Split(name="eval", hash_buckets=1),
            ]
        )
    )
    example_gen = tfx.components.CsvExampleGen(input_base=csv_dir, output_config=output_config)
    statistics_gen = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema_gen = tfx.components.ImportSchemaGen(schema_file=str(use_case.schema_path))
    example_validator = tfx.components.ExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_gen.outputs["schema"]
    )
    # User code by import path (preprocessing_fn=, run_fn=), as in pipelines/pipeline.py: both
    # stock components take it, so nothing is packaged as a wheel.
    transform = tfx.components.Transform(
        examples=example_gen.outputs["examples"],
        schema=schema_gen.outputs["schema"],
        preprocessing_fn=use_case.preprocessing_fn,
    )
    trainer = tfx.components.Trainer(
        run_fn=RUN_FN,
        examples=transform.outputs["transformed_examples"],
        schema=schema_gen.outputs["schema"],
        transform_graph=transform.outputs["transform_graph"],
        train_args=tfx.proto.TrainArgs(num_steps=config.train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=config.eval_steps),
        custom_config=stock_trainer_config(config),
    )
    model_resolver = tfx.dsl.Resolver(
        strategy_class=tfx.dsl.experimental.LatestBlessedModelStrategy,
        model=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Model),
        model_blessing=tfx.dsl.Channel(type=tfx.types.standard_artifacts.ModelBlessing),
    ).with_id("latest_blessed_model_resolver")
    # With no blessed model yet the stock executor drops the change threshold (first run).
    evaluator = tfx.components.Evaluator(
        examples=example_gen.outputs["examples"],
        model=trainer.outputs["model"],
        baseline_model=model_resolver.outputs["model"],
        eval_config=eval_config(
            config.min_auc,
            config.min_accuracy,
            config.max_auc_drop,
            use_case.label_key,
            use_case.slice_keys,
        ),  # fmt: skip
    )
    pusher = tfx.components.Pusher(
        model=trainer.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=serving_dir)
        ),
    )
    return tfx.dsl.Pipeline(
        pipeline_name=f"{config.pipeline_name}-stock",
        pipeline_root=pipeline_root,
        components=[
            example_gen,
            statistics_gen,
            schema_gen,
            example_validator,
            transform,
            trainer,
            model_resolver,
            evaluator,
            pusher,
        ],
        enable_cache=False,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            metadata_path
        ),
        beam_pipeline_args=list(config.beam_args),
    )


def run_stock(
    rows_csv_dir: str, work_dir: str, config: PipelineConfig, say: Callable[..., Any] = print
) -> dict[str, Any]:
    """Runs the stock pipeline once on `rows_csv_dir` (artifacts, ML Metadata, served models and
    the log all under `work_dir`); returns each step's seconds and peak memory (step_progress),
    the wall time and the pushed model's folder (False when the Evaluator did not bless it). A
    fresh `work_dir` means no baseline, as in our first run; a reused one evaluates against its
    latest blessed model."""
    from pipelines.local.local_runner import logs_to_file, step_progress

    work = Path(work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    metadata_path = str(work / "metadata.sqlite")
    serving_dir = str(work / "serving")
    pipeline = create_stock_pipeline(
        rows_csv_dir, str(work / "pipeline_root"), metadata_path, serving_dir, config
    )
    log_path = work / "stock-run.log"
    say(f"Stock TFX: {len(pipeline.components)} steps on {rows_csv_dir}; log: {log_path}")
    started_ms = int(time.time() * 1000)
    started = time.monotonic()
    with logs_to_file(log_path), step_progress(total=len(pipeline.components)) as steps:
        tfx.orchestration.LocalDagRunner().run(pipeline)
    total = time.monotonic() - started
    pushed = _pushed_destination(metadata_path, since_ms=started_ms)
    say(f"Stock TFX: {total:.1f} s in all; pushed: {pushed or 'no (not blessed)'}")
    # The same run_fn logs its record here as in ours: the steps it trained, for equal work.
    found = TRAINING_RECORD.search(log_path.read_text()) if log_path.exists() else None
    training_steps = json.loads(found.group(1))["steps"] if found else None
    return {"steps": dict(steps), "total_seconds": total, "pushed": pushed,
            "training_steps": training_steps}  # fmt: skip


def _pushed_destination(metadata_path: str, since_ms: int) -> str | bool:
    """The folder this run's Pusher wrote (its PushedModel artifact), or False."""
    from ml_metadata.metadata_store import metadata_store

    store = metadata_store.MetadataStore(
        tfx.orchestration.metadata.sqlite_metadata_connection_config(metadata_path)
    )
    mine = [
        a
        for a in store.get_artifacts_by_type("PushedModel")
        if a.create_time_since_epoch >= since_ms
    ]
    for artifact in sorted(mine, key=lambda a: a.id, reverse=True):
        if artifact.custom_properties["pushed"].int_value == 1:
            return artifact.custom_properties["pushed_destination"].string_value
    return False


def main(argv: list[str]) -> int:
    """`python -m pipelines.bench.bench_stock CSV_DIR WORK_DIR RESULT_JSON [field=value ...]`: one
    stock run in a process of its own (tkp bench), the libraries' output in WORK_DIR's log."""
    from components.base import console
    from components.base.config import parse_assignments

    csv_dir, work_dir, result_path = argv[:3]
    config = PipelineConfig.load(parse_assignments(argv[3:]))
    Path(work_dir).mkdir(parents=True, exist_ok=True)
    with console.output_to_log(Path(work_dir) / "stock-output.log"):
        result = run_stock(csv_dir, work_dir, config, say=console.say)
    Path(result_path).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
