"""The multi-worker Trainer step as the launcher runs it on Kubeflow, against the Kubernetes
stand-in (tests/stand_ins/kube_stand_in.py): input artifacts on a real object store (SeaweedFS)
with local copies under the launcher's root, local output folders, the step pod's env, and the
stand-in in KUBECONFIG. Shared by the TrainJob and TFJob tests."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml
from tfx.proto import trainer_pb2
from tfx.types import standard_artifacts
from tfx.utils import proto_utils

from components.base import storage
from components.base.config import REPO_ROOT, SECRET_KEYS, PipelineConfig
from components.base.launcher_paths import LOCAL_ROOT_ENV, PIPELINE_FOLDER_ENV, local_path
from components.steps.trainer import TunableTrainerExecutor
from components.training import cluster_job
from components.training.replica import __name__ as REPLICA_MODULE
from pipelines.pipeline import cluster_job_settings
from tests.stand_ins.kube_stand_in import KubeStandIn
from tests.training import processes
from tests.use_cases.taxi.fixtures import trainer_settings

NAMESPACE = "kubeflow-user"
RUNTIME_FILE = REPO_ROOT / "kubeflow" / "trainjob-runtime.yaml"
RBAC_FILE = REPO_ROOT / "kubeflow" / "training-rbac.yaml"


@dataclass
class ClusterStep:
    stand_in: KubeStandIn
    inputs: dict
    outputs: dict
    properties: dict
    folder: str  # the pipeline's folder on the object store

    @property
    def settings(self) -> dict:
        return json.loads(self.properties["custom_config"])["cluster_job"]

    def set(self, **settings) -> None:
        """Changes the cluster job's settings (what the compiled spec would carry)."""
        custom_config = json.loads(self.properties["custom_config"])
        custom_config["cluster_job"].update(settings)
        self.properties["custom_config"] = json.dumps(custom_config)

    def run(self) -> None:
        TunableTrainerExecutor().Do(self.inputs, self.outputs, self.properties)


def make_step(kind: str, transformed, object_store, tmp_path: Path, monkeypatch,
              runtime: bool = True, **stand_in_options) -> ClusterStep:  # fmt: skip
    bucket = object_store.new_bucket("cluster-job")
    folder = f"s3://{bucket}/root/taxi"
    launcher_root = tmp_path / "launcher"
    graph_dir, examples, _ = transformed

    def staged(artifact_kind, source: str, name: str):
        uri = f"{folder}/run-1/{name}"
        storage.copy_tree(source, uri)
        storage.copy_tree(uri, local_path(uri, str(launcher_root)))
        artifact = artifact_kind()
        artifact.uri = local_path(uri, str(launcher_root))
        return artifact

    remote_examples = staged(standard_artifacts.Examples, examples.uri, "transform/examples")
    remote_examples.split_names = examples.split_names
    inputs = {
        "examples": [remote_examples],
        "transform_graph": [staged(standard_artifacts.TransformGraph, graph_dir, "graph")],
    }
    outputs = {}
    kinds = {"model": standard_artifacts.Model, "model_run": standard_artifacts.ModelRun}
    for key, artifact_kind in kinds.items():
        artifact = artifact_kind()
        artifact.uri = local_path(f"{folder}/run-1/trainer/{key}", str(launcher_root))
        os.makedirs(artifact.uri)
        outputs[key] = [artifact]
    config = PipelineConfig(num_workers=2, gpu_count=1, multi_worker_job=kind)
    custom_config = trainer_settings(batch_size=32, learning_rate=0.01, num_workers=2, epochs=1,
                                     cluster_job=cluster_job_settings(config))  # fmt: skip
    properties = {
        "run_fn": "components.training.loop.run_fn",
        "train_steps": 20,
        "epochs": 1,
        "max_train_minutes": 10.0,
        "eval_args": proto_utils.proto_to_json(trainer_pb2.EvalArgs(num_steps=0)),
        "custom_config": json.dumps(custom_config),
    }
    stand_in_options.setdefault("secrets", {
        config.credentials_secret: {key: os.environ[key] for key in SECRET_KEYS},
    })  # fmt: skip
    stand_in = KubeStandIn(tmp_path, NAMESPACE, **stand_in_options)
    if runtime and stand_in.trainer:
        stand_in.trainer.install_runtime(RUNTIME_FILE)
    for name, value in {
        LOCAL_ROOT_ENV: str(launcher_root), PIPELINE_FOLDER_ENV: folder,
        "KFP_POD_NAME": "run-1-trainer-pod", "KFP_POD_UID": str(uuid.uuid4()),
        "KUBECONFIG": str(stand_in.kubeconfig),
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    return ClusterStep(stand_in, inputs, outputs, properties, folder)


def allowed_requests() -> set[tuple[str, str, str]]:
    """(API group, resource, verb) that kubeflow/training-rbac.yaml's Role allows."""
    (role,) = [d for d in yaml.safe_load_all(RBAC_FILE.read_text()) if d["kind"] == "Role"]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]
    }  # fmt: skip


def replica_processes() -> list[psutil.Process]:
    """The replicas still running."""
    return processes.running(REPLICA_MODULE)


def staging_left(step: ClusterStep) -> list[str]:
    return storage.list_files(f"{step.folder}/{cluster_job.STAGING_FOLDER}/**")
