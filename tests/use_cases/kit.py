"""What the tests need of any use case, derived from what it declares (components/base/use_case.py)
and its test settings: its raw data as tf.Transform, ExampleGen and a serving request see it (from
its curated schema), its generator, and ONE model trained by run_fn on a tiny, really transformed
data set per use case per test session.

The generic tests take `use_case_model`, which runs them once per shipped use case; a use case's
own tests take the fixtures of tests/use_cases/<name>/fixtures.py, which hold only what is
specific to it (its `SETTINGS`, and fixtures only its tests use) and get their data and model
from here, so both share the same training. tests/conftest.py loads this module and every shipped
use case's fixtures module as pytest plugins.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from tensorflow_metadata.proto.v0 import schema_pb2
from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io, schema_utils
from tfx.components.trainer import fn_args_utils
from tfx.components.util import tfxio_utils
from tfx.types import artifact_utils, standard_artifacts
from tfx.utils import io_utils

from components.base import use_case as use_cases
from components.base.config import REPO_ROOT, PipelineConfig
from components.base.use_case import IMAGE_FOLDERS
from components.steps import image_input
from components.training import loop
from pipelines.pipeline import schema_path, trainer_config

SERVING_ENVIRONMENT = "SERVING"


# --------------------------------------------------------------------------------------------
# What a use case's tests train and run with: its fixtures module's SETTINGS
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TestSettings:
    """A use case's choices for its tests; tests/use_cases/<name>/fixtures.py defines
    `SETTINGS = kit.TestSettings(...)` and says there why each value is what it is."""

    __test__ = False  # not a test class, whatever its name

    # The session's model: rows generated for its train and eval splits (span 0, seeds 0 and 7),
    # and run_fn's settings.
    train_rows: int
    eval_rows: int
    epochs: int
    learning_rate: float
    train_steps: int
    eval_steps: int
    # Trainer settings on top of the config's defaults (trainer_settings).
    trainer: Mapping[str, Any]
    # Runs of the compiled pipeline (KFP 2.5 harness, containers): the rows of each span, bars
    # far below what such a run's model reaches (so only a broken step fails them), an AUC bar
    # no model of this data reaches, and the least `Kit.separation` of such a model (how much
    # more probable it finds a row's own class than other rows find it).
    span_rows: int
    run_bars: Mapping[str, float]
    unreachable_auc: float
    separation: float


def fixtures_module(name: str) -> str:
    """Where a shipped use case's test fixtures live."""
    return f"tests.use_cases.{name}.fixtures"


# --------------------------------------------------------------------------------------------
# A use case's data as the tests feed it to tf.Transform, ExampleGen and serving
# --------------------------------------------------------------------------------------------


def in_environment(feature: schema_pb2.Feature, schema: schema_pb2.Schema, env: str) -> bool:
    """schema.proto's rule: `env` in in_environment or default_environment, not excluded."""
    listed = env in feature.in_environment or env in schema.default_environment
    return listed and env not in feature.not_in_environment


def _is_missing(value) -> bool:
    return pd.api.types.is_scalar(value) and pd.isna(value)


def _typed(key: str, value, dtype: tf.dtypes.DType):
    """`value` as the schema type of `key`, whatever pandas made of the column."""
    if dtype == tf.string:
        return value if isinstance(value, bytes) else str(value).encode()
    if dtype == tf.int64:
        if float(value) != int(value):
            raise ValueError(f"{key}: {value!r} is not an integer, but the schema says INT")
        return int(value)
    return float(value)


class Kit:
    """One use case's data helpers. Use `of(name)`: one per use case, built once."""

    def __init__(self, name: str):
        self.name = name
        self.use_case = use_cases.load(name)
        # The curated schema the pipeline imports: CuratedSchemaExecutor copies
        # REPO_ROOT / exec_properties["schema_path"], and the pipeline gives it the use case's
        # path, so the path is read from the pipeline's step rather than written down again.
        self.schema_path: Path = REPO_ROOT / schema_path(self.use_case)
        # Transform's raw spec, derived as TFX 1.16's Transform derives it (tfx/components/
        # transform/executor.py): TransformProcessor._GetSchema reads the schema with
        # io_utils.SchemaReader, _ReadMetadata wraps it in a DatasetMetadata (also the raw
        # metadata Transform writes to transform_graph/metadata), and the spec is
        # schema_utils.schema_as_feature_spec(metadata.schema).feature_spec, as in
        # _RunInPlaceImpl and TFTransformOutput.raw_feature_spec. Features without a shape are
        # VarLen; `shape { dim { size: 1 } }` gives FixedLenFeature([1]); the dtypes are the
        # schema's, never pandas'.
        self.raw_metadata = dataset_metadata.DatasetMetadata(
            io_utils.SchemaReader().read(str(self.schema_path))
        )
        schema = self.raw_metadata.schema
        self.raw_feature_spec: dict = schema_utils.schema_as_feature_spec(schema).feature_spec
        # What a serving request carries: the SERVING environment's features (not the label).
        self.serving_feature_spec: dict = {
            feature.name: self.raw_feature_spec[feature.name]
            for feature in schema.feature
            if in_environment(feature, schema, SERVING_ENVIRONMENT)
        }
        assert self.use_case.label_key not in self.serving_feature_spec, name
        self.images = self.use_case.input_format == IMAGE_FOLDERS

    def generate_span(self, num_rows: int, span: int, seed: int = 42, **options) -> pd.DataFrame:
        """The use case's generated rows as a frame of raw columns: its generator's DataFrame, or
        for images the features ExampleGen writes for each generated file (its path relative to
        the data root, the classes in sorted folder order)."""
        generate = self.use_case.function("generate_span")
        if not self.images:
            return generate(num_rows, span, seed=seed, **options)
        files = generate(num_rows, span, seed=seed, **options)
        classes = self.class_names
        bounds = image_input.image_options(self.use_case.input_options)
        records = []
        for path, data in files:
            info, why = image_input.inspect_image(data, bounds)
            assert info is not None, f"{path}: {why}"
            folder = path.split("/")[0]
            records.append({
                image_input.IMAGE_KEY: data, image_input.LABEL_KEY: classes.index(folder),
                image_input.LABEL_NAME_KEY: folder, image_input.HEIGHT_KEY: info["height"],
                image_input.WIDTH_KEY: info["width"], image_input.CHANNELS_KEY: info["channels"],
                image_input.PATH_KEY: f"span-{span}/{path}",
            })  # fmt: skip
        return pd.DataFrame(records)

    @functools.cached_property
    def class_names(self) -> list[str]:
        """The classes a model of this use case predicts: the use case's own, or for images the
        class folders of a generated span (ExampleGen's vocabulary: sorted folder names)."""
        if not self.images:
            return list(self.use_case.class_names)
        generate = self.use_case.function("generate_span")
        return sorted({path.split("/")[0] for path, _ in generate(200, 0)})

    @functools.cached_property
    def settings(self) -> TestSettings:
        """The SETTINGS of tests/use_cases/<name>/fixtures.py."""
        module = importlib.import_module(fixtures_module(self.name))
        settings = getattr(module, "SETTINGS", None)
        if not isinstance(settings, TestSettings):
            raise AssertionError(f"{module.__name__} must define SETTINGS = kit.TestSettings(...)")
        return settings

    def config(self, **values) -> PipelineConfig:
        """The config a user of this use case gets (its defaults), with `values` set."""
        return PipelineConfig.load({"use_case": self.name, **values}, environ={})

    # -- a pushed model's answers on a written span ---------------------------------------------

    def served_scores(self, model_dir: str, data_root: str, span: int, limit: int):
        """(scores [rows, classes], true label index per row) of a pushed model on the first
        `limit` rows of a written span, sent as a client sends them: a CSV file's rows as
        tf.Examples, or for images the files' bytes to the raw_features signature."""
        from components.base import spans, storage
        from pipelines.serving import samples

        span_dir = f"{data_root}/{spans.SPAN_PREFIX}{span}/"
        if not self.images:
            rows = samples.read_rows(storage.list_files(span_dir + "*.csv")[0], limit)
            p = np.array(samples.predict(model_dir, rows, self.use_case))
            labels = np.array([int(r[self.use_case.label_key]) for r in rows])
            return np.stack([1 - p, p], axis=1), labels
        by_class = samples.images_by_class(span_dir)
        each = max(1, limit // len(by_class))  # every class, not the first folders' alone
        chosen = [(folder, path) for folder, paths in by_class.items() for path in paths[:each]]
        scores = samples.image_scores(model_dir, [path for _, path in chosen])["scores"].numpy()
        folders = [folder for folder, _ in chosen]
        return scores, np.array([self.class_names.index(f) for f in folders])

    def separation(self, model_dir: str, data_root: str, span: int, limit: int) -> float:
        """How much more probable a pushed model finds each row's own class than other rows find
        it, averaged over the classes present (the binary case: P(positive) on positive rows
        minus P(positive) on negative ones); an untrained model's is about 0."""
        scores, labels = self.served_scores(model_dir, data_root, span, limit)
        gaps = [scores[labels == c, c].mean() - scores[labels != c, c].mean()
                for c in np.unique(labels) if (labels != c).any()]  # fmt: skip
        return float(np.mean(gaps))

    # -- raw rows -----------------------------------------------------------------------------

    def _spec_values(self, key: str, value) -> list:
        """The 0 or 1 schema-typed values of one CSV cell; a missing one only for VarLen."""
        spec = self.raw_feature_spec[key]
        if _is_missing(value):
            if isinstance(spec, tf.io.FixedLenFeature):
                raise ValueError(f"{key} is missing, but the schema requires it (FixedLenFeature)")
            return []
        return [_typed(key, value, spec.dtype)]

    def frame_to_instances(self, frame: pd.DataFrame) -> list[dict]:
        """tf.Transform instance dicts for the raw spec: lists of 0 or 1 values for VarLen
        features, an array of the feature's shape for FixedLen ones."""
        instances = []
        for row in frame[list(self.raw_feature_spec)].to_dict("records"):
            instance = {}
            for key, value in row.items():
                spec, values = self.raw_feature_spec[key], self._spec_values(key, value)
                if isinstance(spec, tf.io.FixedLenFeature):
                    instance[key] = np.array(values, spec.dtype.as_numpy_dtype).reshape(spec.shape)
                else:
                    instance[key] = values
            instances.append(instance)
        return instances

    def frame_to_examples(self, frame: pd.DataFrame, with_label: bool = True) -> list[bytes]:
        """Serialized raw tf.Examples as CsvExampleGen writes them: a missing value is no feature.

        Value lists follow the schema type (a FLOAT column is a float_list even when pandas holds
        ints). Without the label: only the SERVING environment's features, as a request has.
        """
        spec = self.raw_feature_spec if with_label else self.serving_feature_spec
        serialized = []
        for row in frame[list(spec)].to_dict("records"):
            feature = {}
            for key, value in row.items():
                if _is_missing(value):
                    continue
                values = self._spec_values(key, value)
                if spec[key].dtype == tf.string:
                    feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
                elif spec[key].dtype == tf.int64:
                    feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
                else:
                    feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            serialized.append(example.SerializeToString())
        return serialized

    def analyze_and_transform(
        self, frames: list[pd.DataFrame], transform_graph_dir: str, temp_dir: str
    ) -> list[list[dict]]:
        """Runs the use case's preprocessing_fn on Beam as the Transform component does.

        Analyzes `frames[0]`, transforms every frame and writes the transform graph
        (transform_fn, transformed_metadata and the raw metadata, which is the curated schema) to
        `transform_graph_dir`. Returns the transformed rows of each frame.
        """
        metadata = self.raw_metadata
        preprocessing_fn = self.use_case.function("preprocessing_fn")
        with tft_beam.Context(temp_dir=temp_dir):
            (rows, _), transform_fn = (
                self.frame_to_instances(frames[0]),
                metadata,
            ) | tft_beam.AnalyzeAndTransformDataset(preprocessing_fn)
            outputs = [rows]
            for frame in frames[1:]:
                (more_rows, _) = (
                    (self.frame_to_instances(frame), metadata),
                    transform_fn,
                ) | tft_beam.TransformDataset()
                outputs.append(more_rows)
            _ = transform_fn | tft_beam.WriteTransformFn(transform_graph_dir)
        metadata_io.write_metadata(
            metadata, os.path.join(transform_graph_dir, tft.TFTransformOutput.RAW_METADATA_DIR)
        )
        return outputs

    # -- training -----------------------------------------------------------------------------

    def trainer_settings(self, **overrides) -> dict:
        """The Trainer's custom_config as the pipeline builds it from the use case's config
        (pipelines/pipeline.py trainer_config), with SETTINGS.trainer and `overrides` on top;
        without the config's checkpoint_root (the project's .work/), which a test gives where it
        wants one."""
        config = self.config()
        settings = trainer_config(config)
        settings.pop("checkpoint_root")
        # What the Trainer step adds from its run parameters (components/steps/trainer.py).
        settings.update(epochs=config.epochs, max_train_minutes=config.max_train_minutes)
        if self.images:  # what the Trainer step takes from ExampleGen's examples
            settings["class_names"] = self.class_names
        return {**settings, **self.settings.trainer, **overrides}

    def transform(self, folder: Path) -> Transformed:
        """Generated rows transformed as the Transform component does, under `folder`."""
        settings = self.settings
        train_frame = self.generate_span(settings.train_rows, span=0)
        eval_frame = self.generate_span(settings.eval_rows, span=0, seed=7)
        graph_dir = str(folder / "transform_graph")
        train_rows, eval_rows = self.analyze_and_transform(
            [train_frame, eval_frame], graph_dir, temp_dir=str(folder / "tft_tmp")
        )
        # Transformed examples laid out like Transform's output artifact: a folder per split.
        examples = standard_artifacts.Examples()
        examples.uri = str(folder / "transformed_examples")
        examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
        coder = tft.coders.ExampleProtoCoder(
            tft.TFTransformOutput(graph_dir).transformed_metadata.schema
        )
        for split, rows in (("train", train_rows), ("eval", eval_rows)):
            path = f"{examples.uri}/Split-{split}/transformed_examples-00000-of-00001.gz"
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with tf.io.TFRecordWriter(path, options="GZIP") as writer:
                for row in rows:
                    writer.write(coder.encode(row))
        return Transformed(graph_dir, examples, eval_frame)

    def fn_args_for(self, transformed, run_dir, **overrides) -> fn_args_utils.FnArgs:
        """FnArgs as the Trainer executor fills them in for `transformed`'s artifacts, with
        SETTINGS' steps, epochs and learning rate unless `overrides` say otherwise."""
        graph_dir, examples, _ = transformed
        settings = self.settings
        args = dict(
            train_files=[f"{examples.uri}/Split-train/*"],
            eval_files=[f"{examples.uri}/Split-eval/*"],
            transform_output=graph_dir,
            serving_model_dir=str(run_dir / "serving_model"),
            model_run_dir=str(run_dir / "model_run"),
            train_steps=settings.train_steps,
            eval_steps=settings.eval_steps,
            custom_config=self.trainer_settings(
                epochs=settings.epochs, learning_rate=settings.learning_rate
            ),
            data_accessor=fn_args_utils.DataAccessor(
                tf_dataset_factory=tfxio_utils.get_tf_dataset_factory_from_artifact(
                    [examples], ["Trainer"]
                ),
                record_batch_factory=None,
                data_view_decode_fn=None,
            ),
        )
        args.update(overrides)
        return fn_args_utils.FnArgs(**args)


@functools.cache
def of(name: str) -> Kit:
    """The kit of use case `name` (built once per process)."""
    return Kit(name)


class Transformed(NamedTuple):
    """The Transform component's outputs for a use case's generated rows."""

    graph_dir: str
    examples: standard_artifacts.Examples  # the transformed examples, a folder per split
    eval_frame: pd.DataFrame  # the raw rows of the eval split


@dataclasses.dataclass(frozen=True)
class TrainedModel:
    """A use case, the session's model of it and what a test feeds the model."""

    kit: Kit
    fn_args: fn_args_utils.FnArgs
    eval_frame: pd.DataFrame

    @property
    def use_case(self) -> use_cases.UseCase:
        return self.kit.use_case

    @property
    def name(self) -> str:
        return self.kit.name

    @property
    def to_examples(self) -> Callable[..., list[bytes]]:
        """The use case's example encoder: frame_to_examples(frame, with_label=True)."""
        return self.kit.frame_to_examples

    @property
    def model_name(self) -> str:
        """The served model's name in the use case's config (its defaults)."""
        return self.kit.config().model_name


class SessionModels:
    """Each use case transformed and trained at most once per test session, whichever fixture
    asks first (a use case's own fixtures or the generic `use_case_model`)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory):
        self._tmp = tmp_path_factory
        self._transformed: dict[str, Transformed] = {}
        self._trained: dict[str, TrainedModel] = {}

    def transformed(self, name: str) -> Transformed:
        if name not in self._transformed:
            self._transformed[name] = of(name).transform(self._tmp.mktemp(f"transform-{name}"))
        return self._transformed[name]

    def trained(self, name: str) -> TrainedModel:
        """run_fn on the CPU with the default ('auto', so float32) precision, from seed 0."""
        if name not in self._trained:
            transformed = self.transformed(name)
            tf.keras.utils.set_random_seed(0)
            fn_args = of(name).fn_args_for(transformed, self._tmp.mktemp(f"trainer-{name}"))
            loop.run_fn(fn_args)
            self._trained[name] = TrainedModel(of(name), fn_args, transformed.eval_frame)
        return self._trained[name]


def scalar_steps(model_run_dir: str) -> set[int]:
    """The steps of the per-batch scalars in a model_run's TensorBoard logs."""
    steps = set()
    for path in tf.io.gfile.glob(f"{model_run_dir}/logs/train/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            if any(v.tag.startswith("batch_") for v in event.summary.value):
                steps.add(event.step)
    return steps


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def session_models(tmp_path_factory) -> SessionModels:
    """The session's transformed data and trained model of each use case, made on first use."""
    return SessionModels(tmp_path_factory)


@pytest.fixture(scope="session", params=use_cases.shipped())
def use_case_model(request, session_models) -> TrainedModel:
    """Each shipped use case in turn with its trained model, eval frame and example encoder;
    a generic test that takes it runs once per use case (test IDs `[<name>]`)."""
    return session_models.trained(request.param)


TABULAR = [n for n in use_cases.shipped() if use_cases.load(n).input_format == use_cases.CSV]


@pytest.fixture(scope="session", params=TABULAR)
def tabular_use_case_model(request, session_models) -> TrainedModel:
    """`use_case_model` for each shipped use case of CSV rows: for tests that send a client's
    rows read from a span's CSV files (serving, the REST contract of a binary model); an image
    use case's serving has its own tests (tests/use_cases/images/)."""
    return session_models.trained(request.param)
