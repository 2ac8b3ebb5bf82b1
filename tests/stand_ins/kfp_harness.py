"""Plays the open-source Kubeflow Pipelines backend for a compiled spec, without a cluster.

A test of the compiled artifact, not an orchestrator: it runs a spec as the backend's API
server, driver and launcher would, across several runs, and refuses what it does not emulate.
The backend version it plays (2.5.0, 2.16.1 or 2.17.0, the newest by default) switches the rules
that differ between them, in one place (kfp_versions.py, each switch citing its source); the
rules below are those all three share, each naming the file of kubeflow/pipelines at tag 2.5.0
(backend/src/...) that it follows:
- the API server: root parameters take the run's values, else their defaults; unknown names,
  values of the wrong type and a required parameter with neither are rejected
  (apiserver/template/v2_template.go, v2/compiler/argocompiler/argo.go);
- the driver, per task (v2/driver/driver.go Container): input parameters and their type checks
  and conversions (resolveInputs), input artifacts as the consumer receives them from ML Metadata
  (kfp_store.py), output URIs `<root>/<pipeline>/<run>/<task>/<uuid>/<key>` plus the
  `executor-logs` output (provisionOutputs), and the cache: key, lookup, and a hit that skips the
  pod and hands on the earlier execution's artifacts as they are (getFingerPrintsAndID,
  reuseCachedOutputs; v2/cacheutils/cache.go);
- the pod and the launcher (kfp_launcher.py): a fresh root per task, the pod's environment
  only, the memory limit, downloads, the log file, the ExecutorOutput merge, uploads;
- ML Metadata and the cache table, shared by all runs of one `Backend` (kfp_store.py);
- a task's `triggerPolicy.condition`: CEL over the task's resolved inputs, evaluated by the
  driver before the cache and the pod (v2/driver/driver.go Container, v2/expression/
  expression.go Condition); false records a CANCELED execution and the task is skipped
  (v2/metadata/client.go CreateExecution with NotTriggered; argocompiler/dag.go `when`), and
  every task that depends on it is omitted, because Argo's enhanced depends wait for
  `<task>.Succeeded` (argocompiler/dag.go depends). The run still succeeds.
Artifacts live on a real S3 store (SeaweedFS). Each pod is a process of this project's .venv
with the image's ENV (kfp_launcher.Pod), or with `containers=` a container of the image itself
(kfp_containers.py).
"""

from __future__ import annotations

import json
import re
import shutil
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from components.base.config import REPO_ROOT
from components.base.object_store import s3_client
from tests.stand_ins import kfp_launcher, kfp_launcher_config, kfp_store
from tests.stand_ins.kfp_containers import ContainerRuntime
from tests.stand_ins.kfp_launcher import EXECUTOR_LOGS, TaskFailed
from tests.stand_ins.kfp_versions import NEWEST, KfpBackend

__all__ = ["Backend", "TaskFailed", "UnsupportedByKubeflow", "check_supported", "load_strictly"]

# Argo 3.5 names a retried task's templates `<task>-system-container-impl`
# (v2/compiler/argocompiler/container.go addContainerExecutorTemplate) and names pods after
# templates without lower-casing them: only a DNS-1123 label makes a valid pod name. Stricter
# than 2.5, which fails only once the task has a retry policy: refused for every task here, so
# that adding a retry policy cannot break the spec.
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# 2.14.0+: shared retry templates; Argo's own rule for a DAG task's name remains, with KFP's
# `-driver` suffix within its 128 characters (argo-workflows workflow/validate/validate.go).
ARGO_TASK_NAME = re.compile(r"^[a-zA-Z0-9][-a-zA-Z0-9]{0,120}$")
# Platform-spec fields with an effect the harness plays (secretAsEnv) or that only place the pod.
_PLATFORM_FIELDS = {"secretAsEnv", "nodeSelector", "tolerations"}
# Trigger conditions over what evaluate_condition builds: every `inputs.` reference goes to a
# parameter value or to an artifact's metadata; no `outputs`, no functions such as parseJson.
_PLAYED_REFERENCE = re.compile(
    r"inputs\.parameter_values\['[^']*'\]"
    r"|inputs\.artifacts\['[^']*'\]\.artifacts\[\d+\]\.metadata\['[^']*'\]"
)


# PipelineTaskSpec.RetryPolicy (pipeline_spec.proto); argocompiler/container.go
# getTaskRetryStrategy reads all four.
_RETRY_FIELDS = {"maxRetryCount", "backoffDuration", "backoffFactor", "backoffMaxDuration"}


def _condition_played(condition: str) -> bool:
    rest = re.sub(r"'[^']*'|\"[^\"]*\"", " ", _PLAYED_REFERENCE.sub(" ", condition))
    return not set(re.findall(r"[A-Za-z_]\w*", rest)) - {"true", "false", "null"}


class StillPending(TaskFailed):
    """A pod that never started (a missing Secret): it never fails, so Argo never retries it;
    the test gave up waiting."""


class Preempted(TaskFailed):
    """The task's pod was deleted with its node (a test's `preempt` hook): not retried."""


class UnsupportedByKubeflow(AssertionError):
    """The spec uses something open-source KFP 2.5 cannot run, or this harness does not play."""


def load_strictly(spec: dict) -> pipeline_spec_pb2.PipelineSpec:
    """As the KFP client does before upload: unknown fields are errors."""
    return json_format.ParseDict(
        spec, pipeline_spec_pb2.PipelineSpec(), ignore_unknown_fields=False
    )


def check_supported(spec: dict, parameter_values: dict, platform: dict | None = None,
                    version: KfpBackend = NEWEST) -> None:  # fmt: skip
    """Refuses what the backend `version` rejects and what this harness does not emulate."""
    for label, executor in spec["deploymentSpec"]["executors"].items():
        if "resolver" in executor:  # argocompiler/argo.go: "resolver not implemented yet"
            raise UnsupportedByKubeflow(f"{label}: resolver executors are not implemented")
        if "container" not in executor:
            raise UnsupportedByKubeflow(f"{label}: only container executors are played")
        if "lifecycle" in executor["container"]:
            raise UnsupportedByKubeflow(f"{label}: lifecycle hooks (preCacheCheck) are never run")
        container = executor["container"]
        arguments = " ".join(container.get("command", []) + container.get("args", []))
        if "{{$" in arguments.replace("{{$}}", ""):
            raise UnsupportedByKubeflow(f"{label}: placeholders other than {{{{$}}}}")
    for name, parameter in spec["root"]["inputDefinitions"].get("parameters", {}).items():
        if name not in parameter_values and "defaultValue" not in parameter:
            if not parameter.get("isOptional"):
                raise UnsupportedByKubeflow(f"parameter {name} has neither value nor default")
    for name, component in spec["components"].items():
        if "dag" in component or component.get("outputDefinitions", {}).get("parameters"):
            raise UnsupportedByKubeflow(f"{name}: sub-DAGs and output parameters are not played")
    for task_name, task in spec["root"]["dag"]["tasks"].items():
        if version.task_name_in_pod_name and not DNS_1123_LABEL.match(task_name):
            raise UnsupportedByKubeflow(
                f"task {task_name!r}: not a DNS-1123 label; Argo names the pods of a task with a "
                "retry policy after it"
            )
        if not ARGO_TASK_NAME.match(task_name):
            raise UnsupportedByKubeflow(f"task {task_name!r}: not a valid Argo task name")
        # driver.go getDAGTasks keys a run's executions by taskInfo.name, and
        # resolveUpstreamArtifacts looks each producerTask up there.
        if task["taskInfo"]["name"] != task_name:
            raise UnsupportedByKubeflow(f"task {task_name!r}: taskInfo.name differs from its key")
        policy = task.get("triggerPolicy", {})
        if set(policy) - {"condition"}:  # a strategy changes the dependencies (argocompiler/dag.go)
            raise UnsupportedByKubeflow(
                f"{task_name}: triggerPolicy {sorted(policy)} beyond a condition"
            )
        if not _condition_played(policy.get("condition", "")):
            raise UnsupportedByKubeflow(
                f"{task_name}: a condition reading more than parameter values and artifact "
                f"metadata is not played: {policy['condition']}"
            )
        if set(task.get("retryPolicy", {})) - _RETRY_FIELDS:
            raise UnsupportedByKubeflow(f"{task_name}: retryPolicy {sorted(task['retryPolicy'])}")
        for unplayed in ("parameterIterator", "artifactIterator"):
            if unplayed in task:
                raise UnsupportedByKubeflow(f"{task_name}: {unplayed} is not played yet; teach it")
        for name, source in task.get("inputs", {}).get("parameters", {}).items():
            if "componentInputParameter" in source or "constant" in source.get("runtimeValue", {}):
                continue  # constantValue: the backend reads only runtimeValue.constant
            raise UnsupportedByKubeflow(f"{task_name}.{name}: parameter source {sorted(source)}")
        for name, source in task.get("inputs", {}).get("artifacts", {}).items():
            if "taskOutputArtifact" not in source:
                raise UnsupportedByKubeflow(f"{task_name}.{name}: artifact source {sorted(source)}")
        if not set(task.get("dependentTasks", [])) >= {
            source["taskOutputArtifact"]["producerTask"]
            for source in task.get("inputs", {}).get("artifacts", {}).values()
        }:
            raise UnsupportedByKubeflow(f"{task_name}: a producer task is not in dependentTasks")
    for label, config in _platform_executors(platform).items():
        if set(config) - _PLATFORM_FIELDS:
            unplayed = sorted(set(config) - _PLATFORM_FIELDS)
            raise UnsupportedByKubeflow(f"{label}: platform fields {unplayed} are not played")


@dataclass
class TaskResult:
    state: str  # "executed", "cached", "skipped" (condition false) or "omitted" (upstream)
    outputs: dict[str, dict]  # output key -> runtime artifact as a consumer receives it
    log_path: Path | None = None


@dataclass
class PipelineRun:
    run_id: str
    run_root: str  # `<pipeline root>/<pipeline name>/<run id>`: where its outputs are written
    tasks: dict[str, TaskResult] = field(default_factory=dict)

    def outputs(self, task: str) -> dict[str, dict]:
        return self.tasks[task].outputs


class Backend:
    """One KFP deployment (`version`, kfp_versions.py): a namespace with its Secrets and
    pipeline root, ML Metadata and the cache table that all its runs share.

    `images` maps each image reference in the spec to the Dockerfile it is built from (its ENV
    is the container's environment); `secrets` maps Secret name -> key -> value.
    """

    def __init__(
        self,
        pipeline_root: str | None,
        images: dict[str, Path],
        secrets: dict[str, dict[str, str]],
        work_dir: Path,
        namespace: str = "kubeflow",
        publish_logs: bool = True,
        interrupt: dict[str, Callable[[], bool]] | None = None,
        containers: ContainerRuntime | None = None,
        version: KfpBackend = NEWEST,
        pending_deadline_s: float = 60,
        launcher_config: dict[str, str] | None = None,
    ):
        # driver/driver.go RootDAG: the run's own root (runtime_config.pipeline_root) when it sets
        # one, else the namespace's kfp-launcher ConfigMap's (`launcher_config`, its data), whose
        # providers also give the store session (kfp_launcher_config.py).
        pipeline_root = pipeline_root or kfp_launcher_config.pipeline_root(launcher_config)
        if not pipeline_root.startswith("s3://"):
            raise UnsupportedByKubeflow(f"pipeline root {pipeline_root}: only s3:// is played")
        self.pipeline_root, self.images, self.secrets = pipeline_root.rstrip("/"), images, secrets
        self.work_dir, self.namespace, self.publish_logs = work_dir, namespace, publish_logs
        # Test hooks: task name -> a predicate; the task's first pod is SIGKILLed once it holds.
        # `interrupt`: a crash mid-step (a failed pod, retried by the retryPolicy). `preempt`:
        # the node is reclaimed and the pod deleted, which Argo's default retry policy
        # OnFailure does not retry (an errored node, not a failed one: workflow_types.go
        # RetryPolicyOnFailure), so the task and the run fail. `retry_waits` lists the backoffs
        # Argo would have waited.
        self.interrupt = dict(interrupt or {})
        # The backend played (kfp_versions.py), and how long a pod that cannot start (a missing
        # Secret) is watched before the test gives up on the run, which KFP never does.
        self.version, self.pending_deadline_s = version, pending_deadline_s
        # Each pod as a container of the image the spec names (kfp_containers.py), else as a
        # process of this project's .venv with the image's ENV.
        self.containers = containers
        if containers is not None:
            containers.version = version
        self.preempt: dict[str, Callable[[], bool]] = {}
        self.retry_waits: list[tuple[str, int]] = []
        # The session the root DAG's driver records and every launcher opens: a ConfigMap's error
        # fails the run's first task, as the launcher that cannot open the bucket does.
        self.session_error = ""
        try:
            session = kfp_launcher_config.session_info(launcher_config, pipeline_root, version)
            kfp_launcher_config.credentials(session, secrets, namespace)
        except kfp_launcher_config.LauncherConfigError as error:
            session, self.session_error = {"Provider": "s3", "Params": {}}, str(error)
        endpoint = session["Params"].get("endpoint")
        if endpoint and endpoint != urllib.parse.urlparse(s3_client().meta.endpoint_url).netloc:
            raise UnsupportedByKubeflow(f"the kfp-launcher ConfigMap's endpoint {endpoint} is not "
                                        "the store the harness moves artifacts in")  # fmt: skip
        self.metadata = kfp_store.MetadataStore(session)

    def run(self, spec: dict, platform: dict | None, parameter_values: dict) -> PipelineRun:
        load_strictly(spec)
        check_supported(spec, parameter_values, platform, self.version)
        run_id = str(uuid.uuid4())
        # metadata/client.go GetPipeline: the run's root under the pipeline root.
        run = PipelineRun(run_id, f"{self.pipeline_root}/{spec['pipelineInfo']['name']}/{run_id}")
        root_values = self._root_values(spec, parameter_values)
        tasks = spec["root"]["dag"]["tasks"]
        for task_name in _topological(tasks):
            if self.session_error:  # component/launcher_v2.go Execute opens the bucket first
                raise TaskFailed(f"task {task_name} failed: {self.session_error}")
            upstream = [run.tasks[t].state for t in tasks[task_name].get("dependentTasks", [])]
            if any(state in ("skipped", "omitted") for state in upstream):
                run.tasks[task_name] = TaskResult("omitted", {})  # dag.go depends: .Succeeded
                continue
            try:
                run.tasks[task_name] = self._task(spec, platform, run, task_name, root_values)
            except TaskFailed as failure:
                raise TaskFailed(f"task {task_name} failed: {failure}") from None
        return run

    def _root_values(self, spec: dict, parameter_values: dict) -> dict:
        """apiserver/template/v2_template.go validatePipelineJobInputs checks the values the user
        sent (known names, types); argocompiler/argo.go then fills in defaults (null for an
        optional parameter without one)."""
        definitions = spec["root"]["inputDefinitions"].get("parameters", {})
        unknown = set(parameter_values) - set(definitions)
        if unknown:
            raise UnsupportedByKubeflow(f"parameter(s) not required by pipeline: {sorted(unknown)}")
        values = {}
        for name, parameter in definitions.items():
            if name in parameter_values:
                if not _matches(parameter_values[name], parameter["parameterType"]):
                    raise UnsupportedByKubeflow(
                        f"input parameter {name} requires type {parameter['parameterType']}: "
                        f"{parameter_values[name]!r}"
                    )
                values[name] = parameter_values[name]
            else:
                values[name] = parameter.get("defaultValue")
        return values

    def _task(self, spec, platform, run, task_name, root_values) -> TaskResult:
        task = spec["root"]["dag"]["tasks"][task_name]
        component = spec["components"][task["componentRef"]["name"]]
        label = component["executorLabel"]
        container = spec["deploymentSpec"]["executors"][label]["container"]
        executor_input = {
            "inputs": {
                "parameterValues": _resolve_parameters(task, component, root_values),
                "artifacts": {
                    name: {"artifacts": [self._upstream(run, source["taskOutputArtifact"])]}
                    for name, source in task.get("inputs", {}).get("artifacts", {}).items()
                },
            },
            "outputs": self._provision_outputs(spec, run, task_name, component),
        }
        condition = task.get("triggerPolicy", {}).get("condition", "")
        if condition and not evaluate_condition(executor_input, condition):
            self.metadata.new_execution(task_name, run.run_id, "CANCELED", {})
            return TaskResult("skipped", {})
        command_and_args = container.get("command", []) + container.get("args", [])
        caching = task.get("cachingOptions", {}).get("enableCache", False)
        fingerprint = (
            kfp_store.fingerprint(executor_input, {}, command_and_args, container["image"])
            if caching
            else ""
        )
        pipeline_name = spec["pipelineInfo"]["name"]
        cached = fingerprint and self.metadata.cached_execution(
            fingerprint, pipeline_name, self.namespace
        )
        if cached:  # reuseCachedOutputs: the same artifacts, wherever they are now
            outputs = self.metadata.executions[cached].outputs
            self.metadata.new_execution(task_name, run.run_id, "CACHED", outputs)
            return TaskResult("cached", self._as_inputs(outputs))

        log_path = self.work_dir / "logs" / run.run_id / f"{task_name}.log"
        policy = task.get("retryPolicy")
        started = time.monotonic()
        attempt = 0
        while True:
            try:
                outputs = self._attempt(
                    spec, platform, run, task_name, executor_input, log_path, attempt
                )
                break
            except (TaskFailed, kfp_store.ArtifactRecordError) as failure:
                wait = self._retry(task_name, policy, failure, attempt, started)
                if wait is None:
                    self.metadata.new_execution(task_name, run.run_id, "FAILED", {})
                    raise TaskFailed(str(failure)) from failure
                self.retry_waits.append((task_name, wait))
                attempt += 1
        execution = self.metadata.new_execution(task_name, run.run_id, "COMPLETE", outputs)
        if fingerprint:
            self.metadata.add_cache_entry(fingerprint, pipeline_name, self.namespace, execution)
        return TaskResult("executed", self._as_inputs(outputs), log_path)

    def _retry(self, task_name: str, policy: dict | None, failure: Exception, attempt: int,
               started: float) -> int | None:  # fmt: skip
        """Whether Argo runs the task's pod again after `failure`, and after how many seconds
        (kfp_versions.py: retry_values_as_parameters, retry_on_error_only; Argo's
        workflow/controller/operator.go processNodeRetries). A preempted pod is an errored node;
        a non-zero exit or an OOM kill a failed one."""
        if isinstance(failure, StillPending):
            return None
        errored = isinstance(failure, Preempted)
        if self.version.retry_on_error_only:  # 2.17.0's templateDefaults: every template
            if not errored:
                return None
            limit = int(policy["maxRetryCount"]) if policy else 2
        else:  # OnFailure, KFP's retryPolicy only
            if errored or not policy:
                return None
            limit = int(policy.get("maxRetryCount", 0))
        if attempt + 1 > limit:
            return None
        if not policy:
            return 0
        max_duration = policy.get("backoffMaxDuration")  # 2.5.0: only when set
        if self.version.retry_values_as_parameters:
            max_duration = max_duration or "0s"  # an unset parameter's default "0"
            number = float(policy.get("backoffFactor", 0))  # a double, as Go's %v prints it
            factor = str(int(number)) if number.is_integer() else repr(number)
            if not factor.lstrip("-").isdigit():
                raise TaskFailed(f"{task_name}: Argo cannot parse the backoff factor {factor!r} "
                                 "(intstr: strconv.Atoi): the retry node errors")  # fmt: skip
        if max_duration is not None:  # counted from the first attempt's start
            if time.monotonic() - started >= float(max_duration.rstrip("s")):
                raise TaskFailed(
                    f"{task_name}: Max duration limit exceeded (backoffMaxDuration "
                    f"{policy.get('backoffMaxDuration', 'unset: 0')}): {failure}"
                )
        return _backoff(policy, attempt)

    def _attempt(self, spec, platform, run, task_name, executor_input, log_path, attempt):
        """One pod of the task (Argo retries re-run the launcher pod with the same executor
        input: the driver ran once, so output URIs and the execution stay the same)."""
        task = spec["root"]["dag"]["tasks"][task_name]
        component = spec["components"][task["componentRef"]["name"]]
        label = component["executorLabel"]
        container = spec["deploymentSpec"]["executors"][label]["container"]
        pod_root = self.work_dir / "pods" / run.run_id / f"{task_name}-{attempt}"
        image_env = self._image_env(container["image"])
        container_env = {item["name"]: item["value"] for item in container.get("env", [])}
        secret_env = self._secret_env(platform, label, task_name)
        if self.version.retry_index_env and task.get("retryPolicy"):  # common.go retryIndexEnv
            container_env = {**container_env, "KFP_RETRY_INDEX": str(attempt)}
        resources = container.get("resources", {})
        if self.containers is not None:
            environment = kfp_launcher.pod_environment(container_env, secret_env)
            pod = self.containers.pod(
                pod_root, container["image"], environment, resources, task_name
            )
        else:
            pod = kfp_launcher.Pod.create(
                pod_root, image_env, container_env, secret_env, resources.get("memoryLimit")
            )
        executor_input = json.loads(json.dumps(executor_input))
        output_file = executor_input["outputs"]["outputFile"]  # the launcher's own path
        executor_input["outputs"]["outputFile"] = pod.step_path(output_file)
        interrupt = self.interrupt.pop(task_name, None) if attempt == 0 else None
        preempt = self.preempt.pop(task_name, None) if attempt == 0 else None
        preempted = []

        def kill_when() -> bool:
            if preempt is not None and preempt():
                preempted.append(True)
                return True
            return interrupt is not None and interrupt()

        try:
            try:
                artifacts = kfp_launcher.launch(
                    pod, executor_input, component, container, run.run_root, log_path,
                    cwd=REPO_ROOT, kill_when=kill_when, attempt=attempt,
                    output_file=output_file, version=self.version,
                )  # fmt: skip
            except TaskFailed as failure:
                if preempted:
                    raise Preempted(f"pod deleted: its node was preempted\n{failure}") from None
                raise
            return {
                name: self.metadata.record_artifact(name, artifact)
                for name, artifact in artifacts.items()
            }
        finally:
            shutil.rmtree(pod_root, ignore_errors=True)  # the pod and its volumes are gone

    def expire(self, run: PipelineRun) -> int:
        """Deletes every object a run wrote under its root, as an object-store lifecycle rule
        (or an operator) does; ML Metadata and the cache table keep pointing at them."""
        return kfp_launcher.delete_prefix(run.run_root + "/")

    def _upstream(self, run: PipelineRun, source: dict) -> dict:
        producer = run.tasks[source["producerTask"]]
        return producer.outputs[source["outputArtifactKey"]]

    def _as_inputs(self, outputs: dict[str, int]) -> dict[str, dict]:
        return {name: self.metadata.runtime_artifact(i) for name, i in outputs.items()}

    def _provision_outputs(self, spec, run, task_name, component) -> dict:
        """driver.go provisionOutputs; the URI as metadata/client.go GenerateOutputURI builds it
        under the run's root `<pipeline root>/<pipeline name>/<run id>`."""
        declared = dict(component.get("outputDefinitions", {}).get("artifacts", {}))
        if self.publish_logs:
            declared[EXECUTOR_LOGS] = {"artifactType": {"schemaTitle": "system.Artifact"}}
        task_root = f"{run.run_root}/{task_name}/{str(uuid.uuid4())}"
        artifacts = {}
        for key, definition in declared.items():
            artifact = {"uri": f"{task_root}/{key}"}
            if self.version.named_outputs:
                artifact["name"] = key
            artifact["type"] = definition["artifactType"]
            if "metadata" in definition:
                artifact["metadata"] = definition["metadata"]
            artifacts[key] = {"artifacts": [artifact]}
        output_file = kfp_launcher.OUTPUT_METADATA_FILE
        if self.version.output_file_in_task_root:  # <local task root>/output_metadata.json
            local_root = kfp_launcher.local_path(task_root, Path("/"))
            output_file = f"{local_root}/output_metadata.json"
        return {"artifacts": artifacts, "outputFile": output_file}

    def _image_env(self, image: str) -> dict[str, str]:
        if image not in self.images:
            raise UnsupportedByKubeflow(f"image {image}: not one of {sorted(self.images)}")
        return kfp_launcher.image_environment(self.images[image])

    def _secret_env(self, platform: dict | None, executor_label: str, task: str) -> dict[str, str]:
        """secretAsEnv: each key from the named Secret. A missing Secret or key leaves the pod
        Pending in CreateContainerConfigError, which neither the driver nor Argo ever fails (no
        deadline by default, at every version played): the harness waits for the Secret to
        appear for `pending_deadline_s`, then ends the run saying what it waits for."""
        config = _platform_executors(platform).get(executor_label, {})
        deadline = time.monotonic() + self.pending_deadline_s
        while True:
            environment, missing = {}, ""
            for secret in config.get("secretAsEnv", []):
                values = self.secrets.get(secret["secretName"])
                for mapping in secret["keyToEnv"]:
                    if values is None:
                        missing = f'secret "{secret["secretName"]}" not found'
                    elif mapping["secretKey"] not in values:
                        missing = (f"couldn't find key {mapping['secretKey']} in Secret "
                                   f"{self.namespace}/{secret['secretName']}")  # fmt: skip
                    else:
                        environment[mapping["envVar"]] = values[mapping["secretKey"]]
            if not missing:
                return environment
            if time.monotonic() > deadline:
                raise StillPending(
                    f"the pod of task {task} is still Pending after {self.pending_deadline_s:.0f}"
                    f" s: CreateContainerConfigError: {missing}. KFP and Argo never fail such a "
                    "pod: on a cluster the run waits until the Secret exists in namespace "
                    f"{self.namespace} or the run is terminated"
                )
            time.sleep(0.2)


def _backoff(policy: dict, attempt: int) -> int:
    """Seconds Argo waits before retry `attempt + 1`: duration x factor^attempt, the duration in
    whole seconds and the factor truncated to an integer (container.go getTaskRetryStrategy)."""
    duration = int(float(policy.get("backoffDuration", "0s").rstrip("s")))
    return duration * int(policy.get("backoffFactor", 0) or 1) ** attempt


def evaluate_condition(executor_input: dict, condition: str) -> bool:
    """v2/expression/expression.go Condition: the CEL expression over the ExecutorInput proto
    (msgToCELMap: fields by their proto names, `inputs.parameter_values`, `inputs.artifacts`),
    where protobuf Values and Structs are dynamic, so every number is a double. A compile or
    evaluation error (a missing key) or a result that is not a bool fails the task.

    Played for what _condition_played admits: parameter values and artifact metadata, not the
    artifacts' other fields, the outputs or the `parseJson` function. Stricter than cel-go in one
    way: comparing a double with an int literal (`== 1`) or a string fails here, where cel-go
    v0.18 (KFP 2.5's go.mod) may compare across types; write doubles, as TFX compiles them."""
    import celpy

    inputs = executor_input["inputs"]
    view = {
        "inputs": {
            "parameter_values": _as_doubles(inputs.get("parameterValues", {})),
            "artifacts": {
                name: {"artifacts": [_as_doubles(a) for a in artifact_list["artifacts"]]}
                for name, artifact_list in inputs.get("artifacts", {}).items()
            },
        }
    }
    environment = celpy.Environment()
    try:
        program = environment.program(environment.compile(condition))
        result = program.evaluate(celpy.json_to_cel(view))
    except Exception as e:  # celpy raises CELParseError, CELEvalError and others
        raise TaskFailed(f"evaluation error: {condition}: {e}") from e
    if isinstance(result, Exception) or not isinstance(result, celpy.celtypes.BoolType):
        raise TaskFailed(f"evaluation error: return type is not bool, got {result!r}")
    return bool(result)


def _as_doubles(value):
    if isinstance(value, bool) or not isinstance(value, int | float | dict | list):
        return value
    if isinstance(value, dict):
        return {key: _as_doubles(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_doubles(item) for item in value]
    return float(value)


def _platform_executors(platform: dict | None) -> dict:
    """The Kubernetes platform spec's per-executor configs (KubernetesExecutorConfig)."""
    kubernetes = (platform or {}).get("platforms", {}).get("kubernetes", {})
    return kubernetes.get("deploymentSpec", {}).get("executors", {})


def _resolve_parameters(task: dict, component: dict, root_values: dict) -> dict:
    """driver.go resolveInputs: values from the parent DAG or constants, then the type checks
    and conversions of handleParamTypeValidationAndConversion."""
    definitions = component.get("inputDefinitions", {}).get("parameters", {})
    values = {}
    for name, source in task.get("inputs", {}).get("parameters", {}).items():
        if "componentInputParameter" in source:
            value = root_values[source["componentInputParameter"]]
            if value is None and definitions.get(name, {}).get("isOptional"):
                continue  # a null for an optional input is left to the launcher's default
            values[name] = value
        else:
            values[name] = source["runtimeValue"]["constant"]
    for name, definition in definitions.items():
        kind = definition["parameterType"]
        if name not in values:
            if definition.get("isOptional"):
                continue
            if "defaultValue" not in definition:
                raise TaskFailed(f"neither value nor default value for parameter {name!r}")
            # 2.5 does not apply the default here: it converts the missing value, so a STRING
            # input becomes "" (the launcher then keeps it) and any other type fails.
            if kind != "STRING":
                raise TaskFailed(f"parameter {name} has unknown protobuf.Value type: <nil>")
            values[name] = ""
        elif kind == "STRING":
            values[name] = _as_text(values[name])
        elif values[name] is None:
            raise TaskFailed(f"got null for input parameter {name!r}")
        elif not _matches(values[name], kind):
            raise TaskFailed(f"input parameter {name!r} type mismatch: expect {kind}")
    return values


def _matches(value, kind: str) -> bool:
    """Whether a JSON value is the structpb kind a parameter type needs."""
    if kind.startswith("NUMBER"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    expected = {"STRING": str, "BOOLEAN": bool, "LIST": list, "STRUCT": dict}.get(kind)
    return expected is not None and isinstance(value, expected)


def _as_text(value) -> str:
    """metadata/converter.go PbValueToText: null is "", numbers are printed in full (Go's
    FormatFloat 'f', -1: no exponent), lists and structs as compact JSON."""
    if value is None or isinstance(value, str):
        return value or ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return numpy.format_float_positional(float(value), trim="-")
    return json.dumps(value, separators=(",", ":"))


def _topological(tasks: dict) -> list[str]:
    order, done = [], set()
    while len(order) < len(tasks):
        ready = sorted(n for n, t in tasks.items()
                       if n not in done and set(t.get("dependentTasks", [])) <= done)  # fmt: skip
        if not ready:
            raise UnsupportedByKubeflow(f"cycle among {sorted(set(tasks) - done)}")
        order.extend(ready)
        done.update(ready)
    return order
