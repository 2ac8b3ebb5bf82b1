"""The one configuration object every runner uses, and the one set of rules for its values.

The rules and the text parsing are written here rather than taken from pydantic-settings: most
rules are this project's own (pinned images, Kubernetes quantities, DNS names, storage roots),
the same rules must check a few values inside each executor, and every error names the
environment variable or flag the value came from.

Values come from, in order of precedence: `--set field=value` on the command line, environment
variables `PIPELINE_<FIELD>` (upper case), then the defaults below. Object-store endpoint and
credentials are never fields: they come from the environment only (AWS_ENDPOINT_URL_S3,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION), or from a Kubernetes Secret on Kubeflow.

The rules (`problems`) check the config when it is built and, through `check_run_parameters`,
the run parameters each executor receives: on Kubeflow a run's parameters come from the UI or a
recurring run and never pass through this config.
"""

from __future__ import annotations

import codecs
import dataclasses
import difflib
import json
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from components.base.errors import ActionableError
from components.base.use_case import IMAGE_FOLDERS, UseCaseError
from components.base.use_case import load as load_use_case

REPO_ROOT = Path(__file__).resolve().parents[2]
WORK_DIR = Path(os.environ.get("PIPELINE_WORK_DIR", REPO_ROOT / ".work"))
# Kubernetes: the GPU resource name (the KFP backend uses the accelerator type as it) and the
# object-store credentials every step and multi-worker replica gets from `credentials_secret`.
GPU_RESOURCE = "nvidia.com/gpu"
SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3", "AWS_REGION")
ENV_PREFIX = "PIPELINE_"
# The drift strength `add-span --drift` writes without a value (pipelines/data.py): a shift the
# validation step's drift check (the schema's drift_comparator thresholds) catches.
DEFAULT_DRIFT = 1.0
# The edge model's weights (components/steps/edge.py): float32, float16, or int8 (dynamic range).
TFLITE_QUANTIZATIONS = ("none", "float16", "dynamic")
RELEASE_MODES = ("immediate", "canary", "shadow")  # components/base/release.py
RELEASE_ROUTERS = ("serve", "istio")
TUNER_ALGORITHMS = ("random", "bayesian", "hyperband")  # KerasTuner's oracles
# PIPELINE_* variables that are not config fields but are read elsewhere.
OTHER_ENV = {"PIPELINE_WORK_DIR"}


class ConfigError(ActionableError, ValueError):
    """A configuration value is invalid; the message names the field and the fix."""

    def __init__(self, message: str, problems: list[tuple[str, str]] | None = None):
        super().__init__(message)
        self.problems = problems or []


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """Every setting of a run. Product code builds it with `PipelineConfig.load`, which applies
    the use case's defaults, the environment and `--set`; the constructor alone gives the generic
    defaults below, for tests that set the fields they need (tests/pipelines/test_layout.py
    keeps the constructor out of pipelines/ and components/)."""

    # The use case: a data set and its model (components/base/use_case.py), one of
    # components/use_cases/ or a package of your own (`mycompany.churn`). Its USE_CASE sets the
    # defaults of some fields below (names, data root, thresholds: `config_defaults`), which
    # `load` applies; on Kubeflow it is fixed when the spec is compiled.
    use_case: str = "taxi"
    pipeline_name: str = "tfx-pipeline"
    # Data: `<data_root>/span-N/*.csv` (or .csv.gz); span -1 reads the newest complete span. A
    # span is complete once it holds `success_marker` (written last by the uploader); "" counts
    # every span folder as complete. Training reads the newest `window_spans` complete spans up
    # to `span`; evaluation reads `span` alone.
    data_root: str = "s3://tfx-pipeline/data"
    span: int = -1
    window_spans: int = 1
    success_marker: str = "_SUCCESS"
    input_encoding: str = "utf-8"
    # Images in one folder per class (a use case whose input_format is image_folders): the
    # model's classes in label order, comma-separated. "" takes the classes recorded for the
    # model (the first span's folder names); setting it accepts a span with a new or a missing
    # class (components/steps/image_input.py).
    class_names: str = ""
    # 1: train even when the selected spans already produced a model (blessed or not).
    force: int = 0
    # Served models: `<serving_root>/<model_name>/<version>/`.
    serving_root: str = "s3://tfx-pipeline/serving"
    model_name: str = "model"
    # Pushed versions kept; older ones are deleted once a newer one serves (never the served one
    # nor the one `rollback` returns to).
    keep_versions: int = 5
    # How a blessed version reaches traffic (components/base/release.py): "immediate" makes it
    # `stable` at once; "canary" labels it `canary` beside `stable` and sends it canary_percent
    # of the requests that name no version; "shadow" sends it a copy of each of them (clients get
    # stable's answer). A release is judged on live figures (components/base/live_release.py) by
    # `watch` once the canary has answered release_min_requests requests over at least
    # release_min_minutes, then promoted or aborted; `tkp rollout promote|abort` forces it.
    release_mode: str = "immediate"  # RELEASE_MODES
    canary_percent: float = 10.0
    release_min_requests: int = 200
    release_min_minutes: float = 10.0
    # Abort when the canary's error rate exceeds stable's by more than this (0.01: one point),
    # its p99 latency is more than this many times stable's, or its predictions' distribution
    # is further than this from stable's (Jensen-Shannon divergence, base 2: 0 same, 1 disjoint).
    release_max_error_rate_increase: float = 0.01
    release_max_p99_ratio: float = 1.5
    release_max_prediction_shift: float = 0.1
    # Where `watch` reads the live figures: a Prometheus text endpoint (`tkp serve`'s, or on a
    # cluster the release's; kubeflow/README.md). "" is `tkp serve`'s default address.
    release_metrics_url: str = ""
    # Who splits a release's traffic: "serve" (`tkp serve` itself; its figures at
    # release_metrics_url) or "istio" (a cluster: kubeflow/serving/tf-serving.yaml's two
    # Deployments and VirtualService; `watch` moves the weights and reads each pod's TF Serving
    # metrics: pipelines/serving/cluster_release.py).
    release_router: str = "serve"  # RELEASE_ROUTERS
    # 1: each pushed version also holds `assets.extra/model.tflite`, a TFLite model of it that
    # takes the raw features (for devices; components/steps/edge.py says which runtime it needs).
    export_tflite: int = 0
    # Its weights: "none" (float32, as served), "float16" (half the size) or "dynamic" (int8
    # weights, a quarter); components/steps/edge.py.
    tflite_quantization: str = "none"  # TFLITE_QUANTIZATIONS
    # `watch`: seconds between polls of the data root.
    watch_interval: int = 60
    # Artifacts and ML Metadata. Local disk for the local runner (see README: object-store root).
    pipeline_root: str = str(WORK_DIR / "pipeline_root")
    metadata_path: str = str(WORK_DIR / "metadata.sqlite")
    # Training.
    train_steps: int = 2000
    eval_steps: int = 200
    epochs: int = 4
    batch_size: int = 128
    learning_rate: float = 0.003
    # The model's own settings as a JSON object, over the use case's defaults (its
    # `hyperparameters`): `--set 'hyperparameters={"hidden_units": [128, 64]}'`.
    hyperparameters: str = "{}"
    # Hyperparameter search (components/training/search.py). tune=1: a search runs before the
    # Trainer over the use case's search space (its `search_space`), tuner_parallel_trials
    # trials at once (local: processes on loopback; Kubeflow: pods), at most tuner_max_trials
    # trials and tuner_max_minutes, each training tuner_trial_steps steps (0: train_steps);
    # the best trial's values train the model. tune=0: the served version's searched values
    # (its registry record), else the defaults. Names set in `hyperparameters` are never
    # searched nor taken from the served version.
    tune: int = 0
    tuner_parallel_trials: int = 2
    tuner_max_trials: int = 8
    tuner_max_minutes: float = 60.0
    tuner_algorithm: str = "random"  # TUNER_ALGORITHMS
    # The eval metric the search maximises: "" is the use case's quality metric on the eval
    # split (val_<quality_metric>); else `val_<a compiled metric>`.
    tuner_objective: str = ""
    tuner_trial_steps: int = 0
    # Images: a Keras weights file (.h5) the model starts from instead of random weights, for
    # fine-tuning: on the object store (s3://, gs://) or a local path, since no model hub is
    # reachable from a cluster's pods. The whole model's weights (a previous training's), or its
    # pretrained backbone's without the top ("notop"), as the use case's model.py says. "": from
    # scratch.
    initial_weights: str = ""
    mixed_precision: str = "auto"  # auto: on when a GPU is present
    # How training is distributed (components/training/distribution.py): auto, one_device, mirrored
    # or multi_worker; `num_workers` > 1 trains on that many machines (local: processes on
    # loopback; Kubeflow: a job of replicas). batch_size is per replica; the learning rate grows
    # with sqrt(replicas).
    strategy: str = "auto"
    num_workers: int = 1
    # Kubeflow, num_workers > 1: the job the replicas run as (components/training/cluster_job.py):
    # `trainjob` (Kubeflow Trainer v2, against the ClusterTrainingRuntime `trainjob_runtime`,
    # shipped as kubeflow/trainjob-runtime.yaml) or `tfjob` (Training Operator v1). Replicas not
    # all started within `replica_start_timeout_minutes` (no GPU free, a missing Secret) fail
    # the step, naming each waiting pod and why it waits.
    multi_worker_job: str = "trainjob"
    trainjob_runtime: str = "tfx-tensorflow-distributed"
    replica_start_timeout_minutes: float = 20.0
    # Guards: training stops cleanly after `max_train_minutes` (and exports the best model so
    # far); EarlyStopping stops after `early_stopping_patience` epochs without a better eval AUC
    # (0: never early) and the best epoch's weights are exported.
    max_train_minutes: float = 120.0
    early_stopping_patience: int = 2
    # Preemption: training state is backed up every epoch and every `checkpoint_every_steps`
    # steps (0: every epoch only) under `<pipeline_root>/_checkpoints/` (Kubeflow: the run's
    # `<pipeline root>/<pipeline name>/_checkpoints/`), keyed by what defines the training, so a
    # re-run resumes; backups untouched for `checkpoint_max_age_hours` are removed.
    checkpoint_every_steps: int = 0
    checkpoint_max_age_hours: float = 72.0
    # Kubeflow: how often the backend retries a failed Trainer pod (it resumes from the backup).
    trainer_retries: int = 2
    # 1: cache the decoded training data in memory after the first epoch (small data only).
    cache_training_data: int = 0
    # TensorBoard: scalars every N steps (plus weight histograms per epoch, and the graph).
    tensorboard_every_steps: int = 50
    # Evaluation: value thresholds, and how much worse than the last blessed model is tolerated
    # (a use case sets its own bars).
    min_auc: float = 0.5
    min_accuracy: float = 0.5
    max_auc_drop: float = 0.01
    # Data generated when the data root is empty, and for `add-span`.
    rows_per_span: int = 20_000
    drift: float = 0.0
    seed: int = 42
    # cloudpickle: Beam 2.59 pickles with dill by default, and dill took a quarter of Transform
    # (py-spy); cloudpickle is Beam's own default from 2.65 on.
    beam_args: tuple[str, ...] = (
        "--direct_running_mode=in_memory", "--direct_num_workers=1", "--pickle_library=cloudpickle",
    )  # fmt: skip
    # Kubeflow: the artifact root every step shares, the images (exact tags), resources
    # (Kubernetes quantities: `2`, `500m`; `8G`, `8Gi`), GPU placement, and the Kubernetes Secret
    # whose keys become every step's S3 environment.
    kfp_pipeline_root: str = "s3://tfx-pipeline/pipeline_root"
    cpu_image: str = "registry.example.com/tfx-pipeline:0.1.0"
    gpu_image: str = "registry.example.com/tfx-pipeline-gpu:0.1.0"
    gpu_count: int = 1
    gpu_node_selector: str = "nvidia.com/gpu.present=true"
    gpu_toleration_key: str = "nvidia.com/gpu"
    credentials_secret: str = "tfx-pipeline-s3"
    step_cpu: str = "2"
    step_memory: str = "8G"
    trainer_cpu: str = "4"
    trainer_memory: str = "16G"

    @property
    def serving_model_dir(self) -> str:
        return f"{self.serving_root.rstrip('/')}/{self.model_name}"

    def metrics_url(self) -> str:
        """Where the live figures of a release are read (release_metrics_url, else `tkp serve`'s
        default address)."""
        return self.release_metrics_url or "http://127.0.0.1:8501/monitoring/prometheus/metrics"

    def release_policy(self) -> dict[str, Any]:
        """How a blessed version is released and judged (components/base/release.py); a release
        keeps the policy it started with."""
        return {"mode": self.release_mode, "canary_percent": self.canary_percent,
                "min_requests": self.release_min_requests,
                "min_minutes": self.release_min_minutes,
                "max_error_rate_increase": self.release_max_error_rate_increase,
                "max_p99_ratio": self.release_max_p99_ratio,
                "max_prediction_shift": self.release_max_prediction_shift}  # fmt: skip

    def __post_init__(self) -> None:
        found = problems(dataclasses.asdict(self))
        if found:
            raise ConfigError(_message("invalid pipeline config", found), found)

    @classmethod
    def load(
        cls, overrides: Mapping[str, str] | None = None, environ: Mapping[str, str] | None = None
    ) -> PipelineConfig:
        """Defaults, then PIPELINE_<FIELD> environment variables, then `overrides` (`--set`).

        An error names where the bad value came from; an unknown PIPELINE_* variable is reported
        on stderr (it is most likely a typo that would otherwise be ignored silently).
        """
        environ = os.environ if environ is None else environ
        texts: dict[str, str] = {}
        sources: dict[str, str] = {}
        for env_name in sorted(environ):
            if not env_name.startswith(ENV_PREFIX) or env_name in OTHER_ENV:
                continue
            name = env_name[len(ENV_PREFIX) :].lower()
            if name in FIELDS:
                texts[name], sources[name] = environ[env_name], env_name
            else:
                print(f"warning: {env_name} is not a config field and is ignored"
                      f"{_did_you_mean(name, prefix=ENV_PREFIX, upper=True)}.",
                      file=sys.stderr)  # fmt: skip
        for name, text in (overrides or {}).items():
            if name not in FIELDS:
                raise ConfigError(
                    f"unknown config field {name!r}{_did_you_mean(name)}; "
                    f"known fields: {', '.join(FIELDS)}"
                )
            texts[name], sources[name] = text, f"--set {name}"
        values, found = {}, []
        for name, text in texts.items():
            try:
                values[name] = parse_value(name, text)
            except ConfigError as e:
                found.append((name, str(e)))
        found += problems(values)  # all problems at once, not one per attempt
        if not found:
            try:
                use_case = load_use_case(values.get("use_case", FIELDS["use_case"].default))
            except UseCaseError as e:
                found.append(("use_case", str(e)))
            else:
                values = {**use_case.config_defaults, **values}
                given = json.loads(values.get("hyperparameters", "{}"))
                found += [("hyperparameters", p) for p in use_case.hyperparameter_problems(given)]
                if values.get("initial_weights") and use_case.input_format != IMAGE_FOLDERS:
                    found.append(("initial_weights", "initial_weights is for use cases of "
                                  f"images; {use_case.name!r} trains from scratch"))  # fmt: skip
                if values.get("class_names") and use_case.input_format != IMAGE_FOLDERS:
                    found.append(("class_names", f"class_names is for use cases whose classes "
                                  f"are folders of images; {use_case.name!r} names its classes "
                                  "itself (its label column's values)"))  # fmt: skip
        if not found:
            try:
                return cls(**values)
            except ConfigError as e:  # a rule across fields, one of them a default
                found = e.problems
        raise ConfigError(_message("invalid pipeline config", found, sources), found)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(PipelineConfig)}


def spec_path(use_case: str) -> Path:
    """The committed Kubeflow spec of a use case: kubeflow/pipeline-<use case>.yaml."""
    return REPO_ROOT / "kubeflow" / f"pipeline-{use_case}.yaml"


# The default use case's committed spec (the stale-spec test, the bench's start-up part).
SPEC_PATH = spec_path(FIELDS["use_case"].default)


def compiled_spec_path(use_case: str) -> Path:
    """Where `make compile` writes a use case's spec with the operator's settings (image tags,
    roots), and what `make submit`, `make schedule` and `tkp watch --endpoint` send unless given
    another: .work/kubeflow/pipeline-<use case>.yaml. Never the committed spec, which carries
    the defaults' example image tags and is rewritten only by `make specs`."""
    return WORK_DIR / "kubeflow" / f"pipeline-{use_case}.yaml"


# Settable per run (Kubeflow UI, recurring runs); the config gives their defaults. The local
# runner uses the defaults, so both runners run the same definition (pipelines/pipeline.py).
RUN_PARAMETERS: dict[str, type] = {
    "data_root": str,
    "span": int,
    "window_spans": int,
    "force": int,
    "train_steps": int,
    "epochs": int,
    "max_train_minutes": float,
    "tune": int,
    "tuner_parallel_trials": int,
    "tuner_max_trials": int,
    "tuner_max_minutes": float,
    "min_auc": float,
    "min_accuracy": float,
    "max_auc_drop": float,
    "serving_root": str,
    "model_name": str,
}


# What each run parameter does and what it accepts, for the compiled spec's parameter
# descriptions (pipelines/kubeflow/kubeflow_runner.py adds the default).
# tests/pipelines/kubeflow/test_kubeflow_spec.py
# checks each stated range against RULES.
RUN_PARAMETER_HELP: dict[str, str] = {
    "data_root": "Folder with one sub-folder per data span (`span-N/`: CSV files, or images "
                 "in one folder per class). "
                 "Allowed: s3://BUCKET/..., gs://BUCKET/... or a local path.",
    "span": "The span to train on: -1 for the newest complete span, else its number. "
            "Allowed: -1 or more.",
    "window_spans": "How many spans, up to the chosen one, the Trainer reads. Allowed: 1 to 52.",
    "force": "1: train, evaluate and maybe push even if these spans were trained on before. "
             "Allowed: 0 or 1.",
    "train_steps": "Training steps in all, split evenly over the epochs. Allowed: 1 or more.",
    "epochs": "Epochs the training steps are split into; early stopping may end sooner. "
              "Allowed: 1 or more.",
    "max_train_minutes": "Training stops after this long, keeping its best weights. "
                         "Allowed: 0.1 to 10080.",
    "tune": "1: search hyperparameters (tuner_parallel_trials trials at once) before "
            "training; 0: train with the served version's searched ones, else the defaults. "
            "Allowed: 0 or 1.",
    "tuner_parallel_trials": "With tune=1: trials run at once, on Kubeflow each in a pod of "
                             "its own (no more than tuner_max_trials). Allowed: 1 to 64.",
    "tuner_max_trials": "With tune=1: trials the search runs in all. Allowed: 1 to 1000.",
    "tuner_max_minutes": "With tune=1: the search starts no trial after this long and stops "
                         "the running ones. Allowed: 0.1 to 10080.",
    "min_auc": "A model whose AUC on the eval split is below this is not pushed. "
               "Allowed: 0 to 1.",
    "min_accuracy": "A model whose accuracy on the eval split is below this is not pushed. "
                    "Allowed: 0 to 1.",
    "max_auc_drop": "How far the AUC may fall below the served model's on the same data "
                    "(and below the best version's) before the model is not pushed. "
                    "Allowed: 0 to 1.",
    "serving_root": "Folder of the served versions: `<serving_root>/<model_name>/<version>/`. "
                    "Allowed: s3://BUCKET/..., gs://BUCKET/... or a local path.",
    "model_name": "The served model's name, one folder under serving_root. Allowed: letters, "
                  "digits, '.', '_', '-', starting with a letter or digit.",
    "beam_args": "Beam options as a JSON list, for StatisticsGen, Transform and the Evaluator "
                 "(README.md, Speed and scale). Allowed: options starting with '--'.",
}  # fmt: skip


def check_run_parameters(step: str, values: Mapping[str, Any]) -> None:
    """Raises ConfigError naming each run parameter of `step` that breaks a config rule.

    Executors call it first: on Kubeflow a run's parameters reach them without passing through
    PipelineConfig, and `model_name=..` or `min_auc=5` must stop the run, not train a model."""
    check_values(f"{step}: invalid run parameter", values)


def check_values(
    where: str, values: Mapping[str, Any], sources: Mapping[str, str] | None = None
) -> None:
    """Raises ConfigError listing every value that breaks its field's rule; `sources` says where
    a value came from (an environment variable, a flag)."""
    found = problems(values)
    if found:
        raise ConfigError(_message(where, found, sources), found)


def _message(
    title: str, found: list[tuple[str, str]], sources: Mapping[str, str] | None = None
) -> str:
    parts = []
    for names, problem in found:  # a rule across fields names them joined by "+"
        given = [(sources or {}).get(name) for name in names.split("+")]
        given = [source for source in given if source]
        parts.append(f"{problem} (from {', '.join(given)})" if given else problem)
    return f"{title}: " + "; ".join(parts)


def _did_you_mean(name: str, prefix: str = "", upper: bool = False) -> str:
    close = difflib.get_close_matches(name, FIELDS, n=1)
    if not close:
        return ""
    suggestion = prefix + (close[0].upper() if upper else close[0])
    return f" (did you mean {suggestion}?)"


# --------------------------------------------------------------------------------------------
# Rules: one per field. Each returns a problem (naming the field and the value) or None.
# --------------------------------------------------------------------------------------------

# DNS-1123 label: what Kubernetes accepts as a name part, and a subset of TFX's Kubeflow V2
# pipeline-name pattern `[a-z0-9][a-z0-9-]{0,127}` (tfx/orchestration/kubeflow/v2/
# pipeline_builder.py) and of TFX's 63-character limit (tfx/orchestration/pipeline.py).
_DNS_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
# One folder name: no '/', no '.' or '..' (which would leave serving_root for local paths).
_PATH_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# Kubernetes resource quantities (k8s.io/apimachinery/pkg/api/resource/quantity.go).
_QUANTITY = re.compile(
    r"(\d+(?:\.\d*)?|\.\d+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)|[eE]([+-]?\d+))?"
)
_QUANTITY_FACTORS = {
    None: 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
    "P": 1e15, "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50,
    "Ei": 2**60,
}  # fmt: skip


def kubernetes_quantity(text: str) -> float:
    """'500m' -> 0.5, '8Gi' -> 8589934592.0, '2' -> 2.0; ValueError for anything else."""
    match = _QUANTITY.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    number, suffix, exponent = match.groups()
    if exponent is not None:
        return float(number) * 10 ** int(exponent)
    return float(number) * _QUANTITY_FACTORS[suffix]


def _at_least(low: int) -> Callable[[str, Any], str | None]:
    def rule(name: str, value: Any) -> str | None:
        return None if value >= low else f"{name} must be at least {low}, got {value}"

    return rule


def _between(low: float, high: float) -> Callable[[str, Any], str | None]:
    def rule(name: str, value: Any) -> str | None:
        ok = low <= value <= high
        return None if ok else f"{name} must be between {low:g} and {high:g}, got {value}"

    return rule


def _positive(name: str, value: float) -> str | None:
    return None if value > 0 else f"{name} must be > 0, got {value}"


def _not_empty(name: str, value: str) -> str | None:
    return None if value.strip() else f"{name} must not be empty"


def _storage_root(name: str, value: str) -> str | None:
    if not value.strip():
        return f"{name} must not be empty"
    scheme, sep, rest = value.partition("://")
    if sep and (scheme not in ("s3", "gs") or not rest.split("/")[0]):
        return f"{name} must be s3://BUCKET/..., gs://BUCKET/... or a local path, got {value!r}"
    return None


def _object_store_root(name: str, value: str) -> str | None:
    if not value.startswith(("s3://", "gs://")) or _storage_root(name, value):
        return (
            f"{name} must be s3://BUCKET/... or gs://BUCKET/... (every pod reads it), got {value!r}"
        )
    return None


def _matches(pattern: re.Pattern, what: str) -> Callable[[str, Any], str | None]:
    def rule(name: str, value: str) -> str | None:
        return None if pattern.fullmatch(value) else f"{name} must be {what}, got {value!r}"

    return rule


def _span(name: str, value: int) -> str | None:
    return None if value >= -1 else f"{name} must be -1 (newest) or a span number, got {value}"


def _marker(name: str, value: str) -> str | None:
    if value == "" or _PATH_SEGMENT.fullmatch(value) or re.fullmatch(r"_[A-Za-z0-9._-]+", value):
        return None
    return f"{name} must be a file name such as _SUCCESS (or empty: no marker), got {value!r}"


def _encoding(name: str, value: str) -> str | None:
    try:
        codecs.lookup(value)
    except LookupError:
        return f"{name} must be a text encoding Python knows (utf-8, latin-1, ...), got {value!r}"
    return None


def _one_of_numbers(*choices: int) -> Callable[[str, Any], str | None]:
    def rule(name: str, value: int) -> str | None:
        shown = " or ".join(str(c) for c in choices)
        return None if value in choices else f"{name} must be {shown}, got {value}"

    return rule


def _one_of(*choices: str) -> Callable[[str, Any], str | None]:
    def rule(name: str, value: str) -> str | None:
        return None if value in choices else f"{name} must be {' or '.join(choices)}, got {value!r}"

    return rule


def _json_object(name: str, value: str) -> str | None:
    try:
        parsed = json.loads(value)
    except ValueError as e:
        return f'{name} must be a JSON object such as {{"name": value, ...}} ({e})'
    return None if isinstance(parsed, dict) else f"{name} must be a JSON object, got {value!r}"


def _class_names(name: str, value: str) -> str | None:
    if not value:
        return None
    names = value.split(",")
    bad = [n for n in names if not _PATH_SEGMENT.fullmatch(n)]
    if bad:
        return (f"{name} must be folder names (letters, digits, '.', '_', '-') separated by "
                f"commas, got {bad}")  # fmt: skip
    if len(set(names)) != len(names) or len(names) < 2:
        return f"{name} must name at least 2 different classes, got {value!r}"
    return None


def _use_case_name(name: str, value: str) -> str | None:
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", value):
        return None
    return f"{name} must be a use case's name or a package's import path, got {value!r}"


def _beam_args(name: str, value: tuple) -> str | None:
    bad = [a for a in value if not isinstance(a, str) or not a.startswith("--")]
    return f"{name} must be Beam options starting with '--', got {bad}" if bad else None


# An image reference after the distribution project's grammar (reference/regexp.go):
# [host[:port]/]path[:tag][@digest], the path in lower case, ASCII only; narrower than it in
# taking sha256 digests only and no IPv6 host.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*"
_REFERENCE = re.compile(
    rf"(?:{_HOST}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
    r"(?::(?P<tag>\w[\w.-]{0,127}))?(?:@(?P<digest>sha256:[0-9a-f]{64}))?",
    re.ASCII,
)


def _pinned(name: str, image: str) -> str | None:
    """An image reference with an explicit tag other than `latest`, or a digest."""
    reference = _REFERENCE.fullmatch(image)
    if not reference:
        return (f"{name} is not an image reference (HOST/PATH:TAG, the path in lower case), "
                f"got {image!r}")  # fmt: skip
    if reference.group("digest") or reference.group("tag") not in (None, "latest"):
        return None
    return f"{name} must name an exact tag or digest (not 'latest'), got {image!r}"


def _cpu(name: str, value: str) -> str | None:
    """CPUs as Kubernetes writes them: cores (`2`, `0.5`) or millicores (`500m`), at least 1m."""
    match = _QUANTITY.fullmatch(value.strip())
    if match and match.group(2) in (None, "m") and kubernetes_quantity(value) >= 1e-3:
        return None
    return f"{name} must be CPUs such as 2, 0.5 or 500m, got {value!r}"


def _memory(name: str, value: str) -> str | None:
    """Bytes as Kubernetes writes them (`8G`, `8Gi`, `512Mi`), at least 1M: the backend writes
    the limit as `<n>G`, and a fraction of a byte (`500m`) is no limit a pod can start with."""
    match = _QUANTITY.fullmatch(value.strip())
    if match and match.group(2) not in ("n", "u", "m") and kubernetes_quantity(value) >= 1e6:
        return None
    return f"{name} must be memory of at least 1M such as 8G, 8Gi or 512Mi, got {value!r}"


def _label_selector(name: str, value: str) -> str | None:
    label, sep, _ = value.partition("=")
    return None if sep and label else f"{name} must be label=value, got {value!r}"


STRATEGIES = ("auto", "one_device", "mirrored", "multi_worker")
# Strategies refused when the config is built, so that no run fails half-way: what each needs
# that this pipeline does not have, and what to use instead.
REFUSED_STRATEGIES = {
    "parameter_server": (
        "parameter_server needs parameter-server tasks and a coordinator running a custom "
        "training loop over a ClusterCoordinator; this model's few hundred thousand weights fit "
        "on every worker, where synchronous all-reduce is faster. Use strategy=multi_worker with "
        "num_workers=N"
    ),
    "tpu": (
        "tpu needs Cloud TPU nodes (a TPUClusterResolver on GKE or Vertex AI), which open-source "
        "Kubeflow Pipelines does not schedule and nothing here can test. Use strategy=mirrored "
        "on GPU nodes, or multi_worker with num_workers=N"
    ),
}


def _strategy(name: str, value: str) -> str | None:
    if value in REFUSED_STRATEGIES:
        return f"{name}={value} is not supported: {REFUSED_STRATEGIES[value]}"
    if value not in STRATEGIES:
        return f"{name} must be {' or '.join(STRATEGIES)}, got {value!r}"
    return None


RULES: dict[str, Callable[[str, Any], str | None]] = {
    "use_case": _use_case_name,
    "pipeline_name": _matches(
        _DNS_LABEL,
        "lower-case letters, digits and '-' (at most 63, "
        "starting and ending with a letter or digit)",
    ),  # fmt: skip
    "data_root": _storage_root,
    "span": _span,
    "window_spans": _between(1, 52),
    "success_marker": _marker,
    "input_encoding": _encoding,
    "class_names": _class_names,
    "force": _one_of_numbers(0, 1),
    "keep_versions": _at_least(2),
    "export_tflite": _one_of_numbers(0, 1),
    "tflite_quantization": _one_of(*TFLITE_QUANTIZATIONS),
    "release_mode": _one_of(*RELEASE_MODES),
    "release_router": _one_of(*RELEASE_ROUTERS),
    "canary_percent": _between(1, 99),
    "release_min_requests": _between(1, 10_000_000),
    "release_min_minutes": _between(0, 7 * 24 * 60),
    "release_max_error_rate_increase": _between(0, 1),
    "release_max_p99_ratio": _between(1, 100),
    "release_max_prediction_shift": _between(0, 1),
    "release_metrics_url": _matches(re.compile(r"(https?://\S+)?"), "an http(s):// URL or empty"),
    "watch_interval": _between(5, 3600),
    "serving_root": _storage_root,
    "model_name": _matches(
        _PATH_SEGMENT,
        "one folder name (letters, digits, '.', '_', '-'; " "starting with a letter or digit)",
    ),  # fmt: skip
    "pipeline_root": _storage_root,
    "metadata_path": _not_empty,
    "train_steps": _at_least(1),
    "eval_steps": _at_least(1),
    "epochs": _at_least(1),
    "batch_size": _at_least(1),
    "learning_rate": _positive,
    "hyperparameters": _json_object,
    "tune": _one_of_numbers(0, 1),
    "tuner_parallel_trials": _between(1, 64),
    "tuner_max_trials": _between(1, 1000),
    "tuner_max_minutes": _between(0.1, 7 * 24 * 60),
    "tuner_algorithm": _one_of(*TUNER_ALGORITHMS),
    # Maximised: a loss (lower is better) would pick the worst model.
    "tuner_objective": _matches(
        re.compile(r"(val_(?![A-Za-z0-9_]*loss$)[A-Za-z0-9_]+)?"),
        "val_<a metric the model compiles, higher is better, not a loss> or empty",
    ),
    "tuner_trial_steps": _at_least(0),
    "initial_weights": lambda name, value: _storage_root(name, value) if value else None,
    "mixed_precision": _one_of("auto", "on", "off"),
    "strategy": _strategy,
    "num_workers": _between(1, 64),
    "multi_worker_job": _one_of("trainjob", "tfjob"),
    "trainjob_runtime": _matches(_DNS_SUBDOMAIN, "a ClusterTrainingRuntime name"),
    "replica_start_timeout_minutes": _between(1, 24 * 60),
    "max_train_minutes": _between(0.1, 7 * 24 * 60),
    "early_stopping_patience": _at_least(0),
    "checkpoint_every_steps": _at_least(0),
    "checkpoint_max_age_hours": _positive,
    "trainer_retries": _between(0, 10),
    "cache_training_data": _one_of_numbers(0, 1),
    "tensorboard_every_steps": _at_least(1),
    "min_auc": _between(0, 1),
    "min_accuracy": _between(0, 1),
    "max_auc_drop": _between(0, 1),
    "rows_per_span": _at_least(1),
    "drift": lambda name, value: None if value >= 0 else f"{name} must be >= 0, got {value}",
    "seed": _at_least(0),
    "beam_args": _beam_args,
    "kfp_pipeline_root": _object_store_root,
    "cpu_image": _pinned,
    "gpu_image": _pinned,
    "gpu_count": _at_least(0),
    "gpu_node_selector": _label_selector,
    "gpu_toleration_key": _not_empty,
    "credentials_secret": _matches(_DNS_SUBDOMAIN, "a Kubernetes Secret name"),
    "step_cpu": _cpu,
    "step_memory": _memory,
    "trainer_cpu": _cpu,
    "trainer_memory": _memory,
}
assert set(RULES) == set(FIELDS), "every config field needs a rule"


def _type_problem(name: str, value: Any) -> str | None:
    expected = type(FIELDS[name].default)
    if expected is float:
        if type(value) not in (int, float):
            return f"{name} must be a number, got {value!r}"
        if not math.isfinite(value):
            return f"{name} must be a finite number, got {value}"
    elif expected is int and type(value) is not int:
        return f"{name} must be a whole number, got {value!r}"
    elif expected in (str, tuple) and not isinstance(value, expected):
        return f"{name} must be a {'list' if expected is tuple else 'text'}, got {value!r}"
    return None


def problems(values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, problem) for every value that breaks its rule; unknown names are problems too.
    Rules across fields apply when both are given."""
    found = []
    for name, value in values.items():
        if name not in FIELDS:
            found.append((name, f"unknown parameter {name!r}"))
            continue
        problem = _type_problem(name, value) or RULES[name](name, value)
        if problem:
            found.append((name, problem))
    bad = {name for name, _ in found}  # a cross-field rule only on values that pass their own
    if {"epochs", "train_steps"} <= set(values) - bad and values["epochs"] > values["train_steps"]:
        too_many = (
            f"epochs ({values['epochs']}) cannot exceed train_steps ({values['train_steps']})"
        )
        found.append(("epochs+train_steps", too_many))  # "+": both fields' sources are named
    if {"strategy", "num_workers"} <= set(values) - bad:
        strategy, workers = values["strategy"], values["num_workers"]
        if strategy == "multi_worker" and workers < 2:
            found.append(("strategy+num_workers", "strategy=multi_worker needs num_workers of "
                          "2 or more (on one machine use mirrored)"))  # fmt: skip
        elif strategy in ("one_device", "mirrored") and workers > 1:
            found.append(("strategy+num_workers", f"strategy={strategy} trains on one machine, "
                          f"but num_workers={workers}: use multi_worker (or auto)"))  # fmt: skip
    if {"tuner_parallel_trials", "tuner_max_trials"} <= set(values) - bad and (
        values["tuner_parallel_trials"] > values["tuner_max_trials"]
    ):
        found.append(("tuner_parallel_trials+tuner_max_trials",
                      f"tuner_parallel_trials ({values['tuner_parallel_trials']}) cannot exceed "
                      f"tuner_max_trials ({values['tuner_max_trials']}): the extra trials would "
                      "have nothing to run"))  # fmt: skip
    return found


# --------------------------------------------------------------------------------------------
# Text (environment, --set) to typed values.
# --------------------------------------------------------------------------------------------


def parse_value(name: str, text: str) -> Any:
    """The typed value of field `name` from its text; ConfigError naming the field otherwise.

    Lists are a JSON list or comma-separated; Beam options split only at a comma followed by
    `--`, so that an option's own commas (`--experiments=a,b`) stay in it."""
    default = FIELDS[name].default
    try:
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, tuple):
            kind = type(default[0])
            if text.strip().startswith("["):
                items = json.loads(text)
                if not isinstance(items, list) or any(type(i) is not kind for i in items):
                    raise ValueError(f"a JSON list of {kind.__name__} values expected")
                return tuple(items)
            pieces = re.split(r",(?=\s*--)", text) if kind is str else text.split(",")
            pieces = [piece.strip() for piece in pieces]
            if "" in pieces:
                raise ValueError("an empty item")
            return tuple(kind(piece) for piece in pieces)
    except (ValueError, TypeError) as e:
        kind = "whole number" if isinstance(default, int) else type(default).__name__
        if isinstance(default, float):
            kind = "number"
        elif isinstance(default, tuple):
            kind = f"list of {type(default[0]).__name__}"
        raise ConfigError(f"{name}: cannot read {text!r} as a {kind} ({e})") from e
    return text


def parse_assignments(assignments: list[str], flag: str = "--set") -> dict[str, str]:
    """`["train_steps=100", ...]` from `--set` flags into a dict, with a clear error for a typo."""
    result = {}
    for item in assignments:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"{flag} expects name=value, got {item!r}")
        result[name.strip()] = value
    return result
