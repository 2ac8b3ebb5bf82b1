"""What differs between the Kubeflow Pipelines backends the harness plays (kfp_harness.py,
kfp_launcher.py, kfp_containers.py): one switch per rule, each citing the file of
kubeflow/pipelines (backend/src/v2 unless named) and the tag it follows, and for Argo the
argo-workflows release that tag deploys. The harness reads these switches where it plays the
rule; nothing else of it differs between versions.

Tags: 2.5.0 (Argo v3.5.14), 2.16.1 (Argo v3.7.3; what Kubeflow's Community Distribution
26.03.1 installs) and 2.17.0 (Argo v4.0.5; the newest tag, July 2026). What of the newer
backends is not played is listed in kubeflow/README.md, "How this is tested without a cluster".
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class KfpBackend:
    tag: str
    argo: str
    # The ExecutorInput's outputs.outputFile. 2.5.0: the constant /tmp/kfp_outputs/
    # output_metadata.json (component/launcher_v2.go OutputMetadataFilepath). 2.15.0+:
    # `<local task root>/output_metadata.json`, the task root being `<pipeline root>/<pipeline>/
    # <run>/<task key>/<uuid>` on the /s3 emptyDir (driver/driver.go provisionOutputs).
    output_file_in_task_root: bool
    # 2.15.0+: each output RuntimeArtifact carries `name: <output key>` (provisionOutputs).
    named_outputs: bool
    # 2.16.1+: the executor-logs URI ends in `-<retry index>` (executor-logs-0 without retries,
    # component/launcher_v2.go qualifyExecutorLogsURI; #13175, #13334), and since 2.16.0 the
    # log is uploaded when the step fails too (uploadOutputArtifacts).
    executor_logs_per_retry: bool
    # 2.5.0: a task with a retryPolicy gets templates `<task>-system-container-impl`, so its
    # name must be a DNS-1123 label (compiler/argocompiler/container.go
    # addContainerExecutorTemplate). 2.14.0+: shared `retry-system-container-impl` templates;
    # Argo's own rule for task names remains (`[a-zA-Z0-9][-a-zA-Z0-9]*`, workflow/validate).
    task_name_in_pod_name: bool
    # Retry backoff as Argo gets it. 2.5.0: the factor truncated to an int, maxDuration only
    # when backoffMaxDuration is set (container.go getTaskRetryStrategy). 2.14.0+: values passed
    # as template parameters, an unset one "0" (getTaskRetryParametersWithValues); Argo parses
    # the factor with intstr (a non-integer errors the node at its first retry) and a
    # maxDuration of "0" ends the node at its first failure ("Max duration limit exceeded",
    # workflow/controller/operator.go processNodeRetries).
    retry_values_as_parameters: bool
    # 2.17.0's manifests set Argo's workflowDefaults templateDefaults.retryStrategy {limit: 2,
    # retryPolicy: OnError} (manifests/kustomize/third-party/argo/base/
    # workflow-controller-configmap-patch.yaml), merged into every template (Argo v4.0.5
    # operator.go mergedTemplateDefaultsInto): a failed step (non-zero exit, OOM kill) is not
    # retried, an errored one (pod deleted) is, on every task. Earlier: Argo's OnFailure.
    retry_on_error_only: bool
    # 2.16.1+: KFP_RETRY_INDEX={{retries}} on the pods of tasks with a retryPolicy
    # (argocompiler/common.go retryIndexEnv).
    retry_index_env: bool
    # 2.16.0+: the user container runs with allowPrivilegeEscalation false, capabilities drop
    # ALL and seccomp RuntimeDefault (compiler/argocompiler/security_context.go).
    hardened_container: bool
    # 2.17.0: an input artifact's download takes objects whose key is the artifact's key or
    # starts with `<key>/`; earlier every key that string-starts with it
    # (objectstore/object_store.go DownloadBlob).
    download_exact_prefix: bool
    # 2.15.0+: the s3 provider's session carries maxRetries, 5 unless the kfp-launcher ConfigMap
    # sets it (config/s3.go ProvideSessionInfo).
    session_max_retries: bool


V2_5_0 = KfpBackend(
    tag="2.5.0", argo="v3.5.14", output_file_in_task_root=False, named_outputs=False,
    executor_logs_per_retry=False, task_name_in_pod_name=True, retry_values_as_parameters=False,
    retry_on_error_only=False, retry_index_env=False, hardened_container=False,
    download_exact_prefix=False, session_max_retries=False,
)  # fmt: skip
# What each later version changes, and nothing else.
V2_16_1 = replace(
    V2_5_0, tag="2.16.1", argo="v3.7.3", output_file_in_task_root=True, named_outputs=True,
    executor_logs_per_retry=True, task_name_in_pod_name=False, retry_values_as_parameters=True,
    retry_index_env=True, hardened_container=True, session_max_retries=True,
)  # fmt: skip
V2_17_0 = replace(
    V2_16_1, tag="2.17.0", argo="v4.0.5", retry_on_error_only=True, download_exact_prefix=True
)
VERSIONS = {backend.tag: backend for backend in (V2_5_0, V2_16_1, V2_17_0)}
NEWEST = V2_17_0
