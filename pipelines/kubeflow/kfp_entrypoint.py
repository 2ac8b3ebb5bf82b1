"""Container entry point of every step on Kubeflow: TFX's executor entry point on local files.

The Kubeflow Pipelines v2 launcher downloads each input artifact from the pipeline root to a
local path (`s3://b/k` to `/s3/b/k`, `gs://` to `/gcs/`, `minio://` to `/minio/`) before the step,
and uploads the output artifacts from their local paths after it. TFX's own entry point ignores
those paths and reads and writes the remote URIs through TensorFlow's file system, whose `s3://`
client hangs or returns wrong data against SeaweedFS and MinIO-style servers, and whose
tensorflow-io plugin aborts the process at exit (README.md, "Object storage notes"). This wrapper
points the executor at the launcher's local copies instead and restores the remote URIs in what
the step reports, so ML Metadata and the next steps see the object-store URIs.

Usage (as compiled into the spec): python -m pipelines.kubeflow.kfp_entrypoint <TFX entry point
args>
"""

from __future__ import annotations

import json
import logging
import os
import sys

from components.base.config import ConfigError, check_run_parameters
from components.base.errors import ActionableError
from components.base.launcher_paths import PIPELINE_FOLDER_ENV, local_path
from pipelines.kubeflow.tfx_v2_executor import EXECUTOR_FLAG, INPUTS_SPEC_FLAG, INVOCATION_FLAG

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

EXECUTOR_STARTS = "starts: imports done"
# A run parameter added by pipelines/kubeflow/kubeflow_runner.py: Beam options as a JSON list of
# strings.
BEAM_ARGS_PARAMETER = "beam_args"
# Outputs the backend adds to every task for its own use, not the step's: with PUBLISH_LOGS on
# (the default) the driver adds `executor-logs` (kubeflow/pipelines 2.5 backend/src/v2/driver/
# driver.go provisionOutputs) and the launcher creates it as a file and writes the step's output
# into it (component/launcher_v2.go getLogWriter). TFX knows neither the output nor its type.
LAUNCHER_OUTPUTS = frozenset({"executor-logs"})


class MissingInputError(ActionableError, FileNotFoundError):
    """An input artifact has no files where the launcher put its local copy."""


def prepare(executor_input: dict, local_root: str | None = None) -> dict[str, str]:
    """Everything done to the launcher's ExecutorInput before TFX sees it (in place): the
    launcher's own outputs removed, artifacts pointed at their local copies. Returns local
    path -> remote URI."""
    drop_launcher_outputs(executor_input)
    return localize(executor_input, local_root)


def pipeline_folder(executor_input: dict) -> str | None:
    """`<pipeline root>/<pipeline name>` from an output URI, which the 2.5 driver builds as
    `<pipeline root>/<pipeline name>/<run id>/<task>/<salt>/<output>` (driver.go
    provisionOutputs, metadata/client.go GenerateOutputURI and the run root of GetPipeline)."""
    for artifacts in executor_input.get("outputs", {}).get("artifacts", {}).values():
        for artifact in artifacts.get("artifacts", []):
            parts = artifact.get("uri", "").rsplit("/", 4)
            if len(parts) == 5 and "://" in parts[0]:
                return parts[0]
    return None


def drop_launcher_outputs(executor_input: dict) -> None:
    """Removes the backend's own outputs (LAUNCHER_OUTPUTS) from the ExecutorInput, so that TFX
    sees only the step's declared outputs and never touches the launcher's log file."""
    outputs = executor_input.get("outputs", {}).get("artifacts", {})
    for name in LAUNCHER_OUTPUTS & set(outputs):
        del outputs[name]


def localize(executor_input: dict, local_root: str | None = None) -> dict[str, str]:
    """Rewrites artifact URIs in an ExecutorInput dict to local paths (in place); returns
    local path -> remote URI. Output folders are created, as TFX's local launcher does.

    An input with nothing at its local path is an error here, before TFX reads it: every
    artifact this pipeline passes on holds files, so an empty one was deleted from the object
    store after its producer ran (a cache hit hands on an earlier run's URI as it is) or was
    never uploaded."""
    remote_of: dict[str, str] = {}
    for section in ("inputs", "outputs"):
        for name, artifacts in executor_input.get(section, {}).get("artifacts", {}).items():
            for artifact in artifacts.get("artifacts", []):
                uri = artifact.get("uri", "")
                path = local_path(uri, local_root)
                if section == "inputs" and path is None and uri.startswith("/"):
                    path = uri  # a step reported a local path: nothing was uploaded
                if path is None:
                    continue
                if section == "inputs" and not os.path.exists(path):
                    raise MissingInputError(
                        f"input artifact {name!r} has no files at {uri}. Either "
                        "they were deleted after the step that made them ran (a retried old "
                        "run, or a step served from Kubeflow's cache, hands on earlier outputs "
                        "as they are): start a new run, in which every step of this pipeline "
                        "makes its outputs afresh. Or that step did not upload its output, a "
                        "bug in it: see its log."
                    )
                remote_of[path] = uri
                artifact["uri"] = path
                if section == "outputs":
                    os.makedirs(path, exist_ok=True)
    return remote_of


def add_input_types(executor_input: dict, inputs_spec: dict) -> None:
    """Gives each input artifact the type its component declares.

    The open-source driver passes upstream artifacts with an empty instanceSchema (it does not
    keep artifact types), and TFX's entry point needs the type to pick the artifact class.
    """
    declared = inputs_spec.get("artifacts", {})
    for name, artifacts in executor_input.get("inputs", {}).get("artifacts", {}).items():
        for artifact in artifacts.get("artifacts", []):
            kind = artifact.get("type") or {}
            if not kind.get("instanceSchema") and not kind.get("schemaTitle") and name in declared:
                artifact["type"] = declared[name]["artifactType"]


def take_beam_args(executor_input: dict) -> list[str]:
    """Removes the `beam_args` parameter (TFX's executors do not know it) and returns its list."""
    text = (
        executor_input.get("inputs", {}).get("parameterValues", {}).pop(BEAM_ARGS_PARAMETER, None)
    )
    return [] if text is None else beam_args_from_text(text, "this step")


def beam_args_from_text(text: str, where: str) -> list[str]:
    """The `beam_args` run parameter (a JSON list of options) as a list, checked by the config's
    rule; ConfigError otherwise. Also used by `submit` before anything is uploaded."""
    try:
        beam_args = json.loads(text)
    except json.JSONDecodeError:
        beam_args = None
    if not isinstance(beam_args, list) or not all(isinstance(a, str) for a in beam_args):
        raise ConfigError(
            f"parameter {BEAM_ARGS_PARAMETER} must be a JSON list of strings such as "
            f'["--direct_num_workers=2"], got {text!r}'
        )
    check_run_parameters(where, {BEAM_ARGS_PARAMETER: tuple(beam_args)})
    return beam_args


def restore_remote_uris(output_file: str, remote_of: dict[str, str]) -> None:
    """Puts the remote URIs back into the ExecutorOutput the step wrote: the launcher records
    whatever URI the step reports (and would skip the upload of a local one)."""
    if not os.path.exists(output_file):
        return
    with open(output_file) as f:
        executor_output = json.load(f)
    for artifacts in executor_output.get("artifacts", {}).values():
        for artifact in artifacts.get("artifacts", []):
            uri = artifact.get("uri", "")
            if uri in remote_of:
                artifact["uri"] = remote_of[uri]
    with open(output_file, "w") as f:
        json.dump(executor_output, f)


def main(argv: list[str]) -> int:
    argv = list(argv)
    position = argv.index(INVOCATION_FLAG) + 1
    executor_input = json.loads(argv[position])
    if INPUTS_SPEC_FLAG in argv:
        add_input_types(executor_input, json.loads(argv[argv.index(INPUTS_SPEC_FLAG) + 1]))
    folder = pipeline_folder(executor_input)
    if folder:
        os.environ[PIPELINE_FOLDER_ENV] = folder
    try:
        remote_of = prepare(executor_input)
        beam_args = take_beam_args(executor_input)
    except (MissingInputError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except PermissionError as error:
        print(f"error: this step runs as uid {os.getuid()} and may not use "
              f"{error.filename or 'a launcher path'} ({error.strerror}): the launcher's volumes "
              "must be writable by the image's user (kubeflow/README.md, section 1)",
              file=sys.stderr)  # fmt: skip
        return 1
    argv[position] = json.dumps(executor_input)
    argv.extend(beam_args)
    # After the checks above, which need none of it: these imports take most of the start-up.
    from pipelines.kubeflow.tfx_v2_executor import load_executor

    run = load_executor(argv)
    if "apache_beam" in sys.modules:  # a Beam step: its own Beam IO gets storage's fixes
        from components.base import storage

        storage.beam_filesystems()
    # The step's notes (components' INFO lines: spans, training progress, decisions) belong in
    # its log, which the UI shows; the libraries' imports leave the root logger at WARNING.
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger().setLevel(logging.INFO)
    # The line that ends the step's start-up (everything imported, no data read yet):
    # tests/stand_ins/kfp_containers.py and pipelines/bench/bench_startup.py time it from the start.
    executor = argv[argv.index(EXECUTOR_FLAG) + 1] if EXECUTOR_FLAG in argv else "executor"
    logging.getLogger(__name__).info("%s %s", executor, EXECUTOR_STARTS)
    run()
    restore_remote_uris(executor_input["outputs"]["outputFile"], remote_of)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
