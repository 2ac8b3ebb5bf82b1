"""Compiles `create_pipeline(config)` into a spec that open-source Kubeflow Pipelines v2 can run.

TFX's KubeflowV2DagRunner targets Vertex AI. Its output is adjusted here, each change for a
reason the backend's code gives (kubeflow/README.md lists them):
- every root parameter gets its default (TFX writes none, so a UI or recurring run with empty
  fields would be rejected);
- steps that read or write state outside their input artifacts are never served from KFP's
  cache, and neither is a step without inputs (UNCACHED_STEPS, kubeflow/README.md "Caching");
- task names become DNS-1123 labels (`ExampleGen` -> `example-gen`): Argo 3.5 names the pods of
  a task with a retry policy after the task, without lower-casing it;
- the Trainer task gets a retry policy (`trainer_retries`), see trainer_retry_policy;
- every step runs `pipelines.kubeflow.kfp_entrypoint` (TFX's entry point on the launcher's local
  copies of the artifacts, see there), in the CPU image with CPU and memory limits; the Trainer
  runs in the GPU image and requests `nvidia.com/gpu`, except with num_workers > 1: then its step
  is a light CPU pod that trains as a TrainJob or TFJob (components/training/cluster_job.py)
  whose replicas get all of that;
- a second YAML document, the Kubernetes platform spec, gives every step the object-store
  credentials from a Secret and the Trainer a GPU node selector and toleration.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from components.base.config import (
    GPU_RESOURCE,
    RUN_PARAMETER_HELP,
    RUN_PARAMETERS,
    SECRET_KEYS,
    SPEC_PATH,
    PipelineConfig,
    kubernetes_quantity,
)

ENTRYPOINT = ["python", "-m", "pipelines.kubeflow.kfp_entrypoint"]
TRAINER = "Trainer"
# Never served from KFP's cache. KFP 2.5 keys a step on its input artifact IDs and parameters,
# never on data, and a hit hands on the earlier run's artifacts as they are, even if the object
# store has deleted them since. SelectSpans and ExampleGen read spans under an unchanged
# data_root; ExampleValidator, the Tuner and LatestPushedModel read the serving directory (the
# previous span's statistics, the served version's record, the served model), ExampleValidator
# and Pusher write it; CuratedSchema has no inputs but the trigger condition's. Every other step
# is a function of its input artifacts and parameters, and reads this run's own decision
# artifact (the Cond), so it is never a hit.
UNCACHED_STEPS = (
    "SelectSpans", "ExampleGen", "CuratedSchema", "ExampleValidator", "Tuner", "LatestPushedModel",
    "Pusher",
)  # fmt: skip
INPUTS_SPEC_FLAG = "--json_serialized_inputs_spec_args"


def compile_documents(config: PipelineConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """(PipelineSpec, PlatformSpec) as dicts, ready to be written as two YAML documents."""
    from tfx import v1 as tfx

    from pipelines.pipeline import create_pipeline

    pipeline = create_pipeline(dataclasses.replace(config, pipeline_root=config.kfp_pipeline_root))
    runner = tfx.orchestration.experimental.KubeflowV2DagRunner(
        config=tfx.orchestration.experimental.KubeflowV2DagRunnerConfig(
            default_image=config.cpu_image, use_pipeline_spec_2_1=True
        ),
    )
    spec = runner.run(pipeline, write_out=False)["pipelineSpec"]

    for name, parameter in spec["root"]["inputDefinitions"]["parameters"].items():
        if name in RUN_PARAMETERS:
            parameter["defaultValue"] = RUN_PARAMETERS[name](getattr(config, name))
            parameter["description"] = _description(name, parameter["defaultValue"])
    for step in UNCACHED_STEPS:
        spec["root"]["dag"]["tasks"][step]["cachingOptions"] = {"enableCache": False}
    if config.trainer_retries:
        spec["root"]["dag"]["tasks"][TRAINER]["retryPolicy"] = trainer_retry_policy(config)
    _beam_args_as_parameter(spec, config)
    _step_names_as_arguments(spec)
    _tasks_as_dns_labels(spec)

    executors = spec["deploymentSpec"]["executors"]
    trainer_executor = spec["components"][TRAINER]["executorLabel"]
    for label, executor in executors.items():
        container = executor["container"]
        container["command"] = list(ENTRYPOINT)
        container["resources"] = {
            "cpuLimit": kubernetes_quantity(config.step_cpu),
            "memoryLimit": _gigabytes(config.step_memory),
        }
        if label == trainer_executor and config.num_workers == 1:
            container["image"] = config.gpu_image
            container["resources"] = {
                "cpuLimit": kubernetes_quantity(config.trainer_cpu),
                "memoryLimit": _gigabytes(config.trainer_memory),
            }
            if config.gpu_count:
                container["resources"]["accelerator"] = {
                    "type": GPU_RESOURCE,
                    "count": str(config.gpu_count),
                }
    return spec, _platform_spec(config, executors, trainer_executor)


def _description(name: str, default: Any) -> str:
    """ParameterSpec.description (pipeline_spec.proto, at most 1024 characters): what the
    parameter does, what it accepts, its default. The 2.5 backend keeps it; the 2.5 UI's run
    form does not show it (frontend/src/components/NewRunParametersV2.tsx labels a field with
    its name and type), so kubeflow/README.md lists the same text."""
    shown = default if name == "beam_args" else json.dumps(default)  # that one is JSON already
    text = f"{RUN_PARAMETER_HELP[name]} Default: {shown}."
    assert len(text) <= 1024, name
    return text


# The longest a Trainer attempt can take once its replicas run (the config's
# replica_start_timeout_minutes comes on top): the largest max_train_minutes a run may set (7
# days), as a cluster job's deadline allows it (a quarter more,
# components/training/cluster_job.py), plus start-up, data download and export (2 h).
LONGEST_TRAINER_ATTEMPT_S = int(7 * 24 * 3600 * 1.25) + 2 * 3600


def trainer_retry_policy(config: PipelineConfig) -> dict:
    """The Trainer task's retryPolicy; each retry resumes from the training's backup
    (components/training/checkpoints.py). How the backends read it
    (backend/src/v2/compiler/argocompiler/container.go):
    - KFP 2.5 compiles it into an Argo retryStrategy: limit = maxRetryCount, the backoff
      duration in whole seconds, the factor truncated to an integer, a maxDuration only when
      backoffMaxDuration is set; Argo's default policy retries a failed pod (non-zero exit, OOM
      kill), not a deleted one (a node preemption).
    - KFP 2.14+ passes the four values as template parameters, an unset one as "0": Argo then
      reads maxDuration "0" as "already past" and never retries, and parses the factor as an
      integer (2.9 errors the task). So the factor is an integer and backoffMaxDuration is
      always set, long enough for every attempt of the longest training a run may ask for
      (max_train_minutes is a run parameter): LONGEST_TRAINER_ATTEMPT_S per attempt, plus the
      time its replicas may wait to start.
    - KFP 2.17's default manifests make Argo retry errors only (a deleted or preempted pod) and
      not failures (kubeflow/README.md, section 6a, says what an operator changes)."""
    attempts = config.trainer_retries + 1
    attempt_s = LONGEST_TRAINER_ATTEMPT_S + int(config.replica_start_timeout_minutes * 60)
    return {"maxRetryCount": config.trainer_retries, "backoffDuration": "30s", "backoffFactor": 2,
            "backoffMaxDuration": f"{attempts * attempt_s}s"}  # fmt: skip


def _beam_args_as_parameter(spec: dict, config: PipelineConfig) -> None:
    """Beam options become the run parameter `beam_args` (a JSON list) of every step.

    TFX freezes them into each container's arguments; here they are cut from the arguments and
    passed as a step parameter instead, which `pipelines.kubeflow.kfp_entrypoint` turns back into
    arguments.
    """
    from pipelines.kubeflow.kfp_entrypoint import BEAM_ARGS_PARAMETER

    default = json.dumps(list(config.beam_args))
    spec["root"]["inputDefinitions"]["parameters"][BEAM_ARGS_PARAMETER] = {
        "parameterType": "STRING",
        "defaultValue": default,
        "description": _description(BEAM_ARGS_PARAMETER, default),
    }
    for component in spec["components"].values():
        parameters = component.setdefault("inputDefinitions", {}).setdefault("parameters", {})
        parameters[BEAM_ARGS_PARAMETER] = {"parameterType": "STRING"}
    for task in spec["root"]["dag"]["tasks"].values():
        parameters = task.setdefault("inputs", {}).setdefault("parameters", {})
        parameters[BEAM_ARGS_PARAMETER] = {"componentInputParameter": BEAM_ARGS_PARAMETER}
    for executor in spec["deploymentSpec"]["executors"].values():
        args = executor["container"]["args"]
        del args[args.index(INPUTS_SPEC_FLAG) + 2 :]


def _step_names_as_arguments(spec: dict) -> None:
    """Each executor gets `--step_name <node id>`: the name its time is recorded under
    (components/steps/step_times.py), as the local runner names it."""
    from pipelines.kubeflow.tfx_v2_executor import STEP_FLAG

    executors = spec["deploymentSpec"]["executors"]
    for node, task in spec["root"]["dag"]["tasks"].items():
        label = spec["components"][task["componentRef"]["name"]]["executorLabel"]
        args = executors[label]["container"]["args"]
        assert STEP_FLAG not in args, f"two tasks run executor {label}: one step name each"
        args += [STEP_FLAG, node]


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def task_name(node_id: str) -> str:
    """The compiled task name of a pipeline node: `LatestPushedModel` -> `latest-pushed-model`."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", node_id).replace("_", "-").lower()


def _tasks_as_dns_labels(spec: dict) -> None:
    """Renames every task to `task_name(node id)`: the task keys, `taskInfo.name` (the name the
    UI shows) and every `dependentTasks` and `producerTask` reference."""
    tasks = spec["root"]["dag"]["tasks"]
    names = [task_name(old) for old in tasks]
    for name in names:
        if names.count(name) > 1 or not _DNS_LABEL.match(name):
            raise ValueError(f"task name {name!r} is taken twice or not a DNS-1123 label: rename "
                             "the pipeline node (with_id) it comes from")  # fmt: skip
    for old in list(tasks):
        task = tasks.pop(old)
        task["taskInfo"]["name"] = task_name(old)
        if "dependentTasks" in task:
            task["dependentTasks"] = [task_name(t) for t in task["dependentTasks"]]
        for kind in ("artifacts", "parameters"):
            for source in task.get("inputs", {}).get(kind, {}).values():
                for reference in ("taskOutputArtifact", "taskOutputParameter"):
                    if reference in source:
                        source[reference]["producerTask"] = task_name(
                            source[reference]["producerTask"]
                        )
        tasks[task_name(old)] = task


def _gigabytes(quantity: str) -> float:
    """A Kubernetes memory quantity in GB ('16G' -> 16.0, '8Gi' -> 8.589934592): the backend
    renders memoryLimit as '<n>G' (backend/src/v2/compiler/argocompiler/container.go)."""
    return kubernetes_quantity(quantity) / 1e9


def _platform_spec(config: PipelineConfig, executors: dict, trainer_executor: str) -> dict:
    label, _, value = config.gpu_node_selector.partition("=")
    platform: dict[str, dict] = {}
    for executor in sorted(executors):
        secret_env = {
            "secretName": config.credentials_secret,
            "keyToEnv": [{"secretKey": key, "envVar": key} for key in SECRET_KEYS],
        }
        platform[executor] = {"secretAsEnv": [secret_env]}
        if executor == trainer_executor and config.gpu_count and config.num_workers == 1:
            platform[executor]["nodeSelector"] = {"labels": {label: value}}
            platform[executor]["tolerations"] = [
                {"key": config.gpu_toleration_key, "operator": "Exists", "effect": "NoSchedule"}
            ]
    return {"platforms": {"kubernetes": {"deploymentSpec": {"executors": platform}}}}


def render(config: PipelineConfig) -> str:
    spec, platform = compile_documents(config)
    header = (
        "# Compiled by `tkp compile` from pipelines/pipeline.py; do not edit by hand.\n"
        f"# Parameters (defaults): {json.dumps(_defaults(spec), sort_keys=True)}\n"
    )
    return header + yaml.safe_dump_all([spec, platform], sort_keys=True)


def _defaults(spec: dict) -> dict:
    parameters = spec["root"]["inputDefinitions"]["parameters"]
    return {name: p.get("defaultValue") for name, p in parameters.items()}


def write(config: PipelineConfig, path: Path) -> Path:
    """The spec written whole or not at all: a reader (a test, `make submit`) never sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(render(config))
    os.replace(partial, path)
    return path


def load_documents(path: Path = SPEC_PATH) -> tuple[dict, dict]:
    spec, platform = yaml.safe_load_all(path.read_text())
    return spec, platform
