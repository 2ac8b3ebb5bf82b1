"""The one configuration object every runner uses.

Values come from, in order of precedence: `--set field=value` on the command line, environment
variables `PIPELINE_<FIELD>` (upper case), then the defaults below. Object-store endpoint and
credentials are never fields: they come from the environment only (AWS_ENDPOINT_URL_S3,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION), or from a Kubernetes Secret on Kubeflow.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from pipelines.errors import ActionableError

REPO_ROOT = Path(__file__).resolve().parent.parent
WORK_DIR = Path(os.environ.get("PIPELINE_WORK_DIR", REPO_ROOT / ".work"))


class ConfigError(ActionableError, ValueError):
    """A configuration value is invalid; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    pipeline_name: str = "taxi-tips"
    # Data: `<data_root>/span-N/*.csv`; span -1 reads the newest span.
    data_root: str = "s3://tfx-pipeline/data/taxi-trips"
    span: int = -1
    # Served models: `<serving_root>/<model_name>/<version>/`.
    serving_root: str = "s3://tfx-pipeline/serving"
    model_name: str = "taxi-tips"
    # Artifacts and ML Metadata. Local disk for the local runner (see README: object-store root).
    pipeline_root: str = str(WORK_DIR / "pipeline_root")
    metadata_path: str = str(WORK_DIR / "metadata.sqlite")
    # Training.
    train_steps: int = 2000
    eval_steps: int = 200
    epochs: int = 4
    batch_size: int = 128
    learning_rate: float = 0.003
    hidden_units: tuple[int, ...] = (64, 32)
    mixed_precision: str = "auto"  # auto: on when a GPU is present
    # Evaluation: value thresholds, and how much worse than the last blessed model is tolerated.
    min_auc: float = 0.75
    min_accuracy: float = 0.7
    max_auc_drop: float = 0.01
    # Data generated when the data root is empty, and for `add-span`.
    rows_per_span: int = 20_000
    drift: float = 0.0
    seed: int = 42
    beam_args: tuple[str, ...] = ("--direct_running_mode=in_memory", "--direct_num_workers=1")
    # Kubeflow: the artifact root every step shares, the images (exact tags), resources, GPU
    # placement, and the Kubernetes Secret whose keys become every step's S3 environment.
    kfp_pipeline_root: str = "s3://tfx-pipeline/pipeline_root"
    cpu_image: str = "registry.example.com/tfx-taxi-tips:0.1.0"
    gpu_image: str = "registry.example.com/tfx-taxi-tips-gpu:0.1.0"
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

    def __post_init__(self) -> None:
        problems = []
        for name in ("train_steps", "eval_steps", "epochs", "batch_size", "rows_per_span"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.span < -1:
            problems.append(f"span must be -1 (newest) or a span number, got {self.span}")
        if self.epochs > self.train_steps:
            problems.append(
                f"epochs ({self.epochs}) cannot exceed train_steps ({self.train_steps})"
            )
        for name in ("min_auc", "min_accuracy"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                problems.append(f"{name} must be between 0 and 1, got {getattr(self, name)}")
        if self.max_auc_drop < 0:
            problems.append(f"max_auc_drop must be >= 0, got {self.max_auc_drop}")
        if self.learning_rate <= 0:
            problems.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.mixed_precision not in ("auto", "on", "off"):
            problems.append(
                f"mixed_precision must be auto, on or off, got {self.mixed_precision!r}"
            )
        if not self.hidden_units or any(u < 1 for u in self.hidden_units):
            problems.append(f"hidden_units must be positive sizes, got {list(self.hidden_units)}")
        for name in ("data_root", "serving_root", "pipeline_name", "model_name"):
            if not getattr(self, name):
                problems.append(f"{name} must not be empty")
        if "/" in self.model_name:
            problems.append(f"model_name must not contain '/', got {self.model_name!r}")
        if self.gpu_count < 0:
            problems.append(f"gpu_count must be 0 or more, got {self.gpu_count}")
        for name in ("cpu_image", "gpu_image"):
            if not _pinned(getattr(self, name)):
                problems.append(
                    f"{name} must name an exact tag or digest (not 'latest'), got "
                    f"{getattr(self, name)!r}"
                )
        if "=" not in self.gpu_node_selector:
            problems.append(
                f"gpu_node_selector must be label=value, got {self.gpu_node_selector!r}"
            )
        if problems:
            raise ConfigError("invalid pipeline config: " + "; ".join(problems))

    @classmethod
    def load(cls, overrides: dict[str, str] | None = None, environ=None) -> PipelineConfig:
        """Defaults, then PIPELINE_<FIELD> environment variables, then `overrides`."""
        environ = os.environ if environ is None else environ
        values: dict[str, str] = {}
        for field in dataclasses.fields(cls):
            env_name = f"PIPELINE_{field.name.upper()}"
            if env_name in environ:
                values[field.name] = environ[env_name]
        values.update(overrides or {})
        return cls(**{name: _parse(name, text) for name, text in values.items()})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _pinned(image: str) -> bool:
    """An image reference with an explicit tag other than `latest`, or a digest."""
    if "@sha256:" in image:
        return True
    name, _, tag = image.rpartition(":")
    return bool(name) and "/" not in tag and tag not in ("", "latest")


def _parse(name: str, text: str):
    fields = {f.name: f for f in dataclasses.fields(PipelineConfig)}
    if name not in fields:
        raise ConfigError(
            f"unknown config field {name!r}; known fields: {', '.join(sorted(fields))}"
        )
    default = fields[name].default
    try:
        if isinstance(default, bool):
            return text.lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(text)
        if isinstance(default, float):
            return float(text)
        if isinstance(default, tuple):
            items = json.loads(text) if text.strip().startswith("[") else text.split(",")
            kind = type(default[0]) if default else str
            return tuple(kind(item) for item in items if str(item).strip())
    except (ValueError, TypeError, json.JSONDecodeError) as e:
        raise ConfigError(
            f"config field {name}: cannot parse {text!r} as {type(default).__name__}"
        ) from e
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
