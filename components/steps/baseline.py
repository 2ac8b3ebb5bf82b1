"""The served model, found in the serving directory rather than by a Resolver node.

Open-source Kubeflow Pipelines rejects TFX's resolver tasks, so the Evaluator's baseline is found
by an ordinary step: the version that TF Serving serves, as the model config file beside the
versions pins it (components/base/registry.py; the highest version when there is none). After a
rollback that is not the highest number. Its files are copied into this step's Model artifact,
so the Evaluator reads a normal local or pipeline-root artifact under every runner.

The artifact also carries the quality index of the served version and the best one among the
registry's versions (QUALITY_KEY, BEST_QUALITY_KEY), for the Evaluator's check that quality does
not slide over a chain of pushes (components/steps/evaluation.py).
"""

from __future__ import annotations

import logging
from typing import Any

from tfx import types
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.types import artifact_utils, component_spec, standard_artifacts
from tfx.utils import path_utils

from components.base import registry, serving_state, storage
from components.base.config import check_run_parameters

_log = logging.getLogger(__name__)

BASELINE_VERSION_KEY = "baseline_version"
NO_BASELINE = -1
NO_BASELINE_FILE = "NO_BASELINE.txt"
QUALITY_KEY = "quality_index"
BEST_QUALITY_KEY = "best_quality_index"
BEST_VERSION_KEY = "best_version"
serving_model_dir = registry.versions_dir


def serving_parameters(exec_properties: dict) -> dict:
    """The run parameters that locate the served model, for `check_run_parameters`."""
    return {name: exec_properties[name] for name in ("serving_root", "model_name")}


class LatestPushedModelExecutor(base_executor.BaseExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        baseline = artifact_utils.get_single_instance(output_dict["baseline_model"])
        check_run_parameters("LatestPushedModel", serving_parameters(exec_properties))
        versions_dir = serving_model_dir(
            exec_properties["serving_root"], exec_properties["model_name"]
        )
        version = serving_state.read(versions_dir, exec_properties["model_name"]).stable
        if version is None:
            _log.info("No pushed model yet: the candidate is evaluated without a baseline.")
            baseline.set_int_custom_property(BASELINE_VERSION_KEY, NO_BASELINE)
            # Every artifact this pipeline passes on holds a file: on Kubeflow an empty one is
            # indistinguishable from one whose files were deleted
            # (pipelines/kubeflow/kfp_entrypoint.py).
            message = f"No version was pushed under {versions_dir} yet.\n"
            storage.write_bytes(storage.join(baseline.uri, NO_BASELINE_FILE), message.encode())
            return
        source = storage.join(versions_dir, str(version))
        count = storage.copy_tree(source, path_utils.serving_model_path(baseline.uri))
        _log.info("Baseline: served version %d (%d files) from %s", version, count, source)
        baseline.set_int_custom_property(BASELINE_VERSION_KEY, version)
        baseline.set_string_custom_property("source_uri", source)
        # The best along the served version's lineage (the baselines it beat): a version rolled
        # back from is not in it, so a rollback does not leave an unreachable bar behind.
        records = registry.records(versions_dir)
        chain = registry.lineage(versions_dir, version)
        quality = {v: (records.get(v) or {}).get(QUALITY_KEY, 0.0) for v in chain}
        best = max(chain, key=lambda v: quality[v])
        baseline.set_float_custom_property(QUALITY_KEY, quality[version])
        baseline.set_float_custom_property(BEST_QUALITY_KEY, quality[best])
        baseline.set_int_custom_property(BEST_VERSION_KEY, best)


class LatestPushedModelSpec(types.ComponentSpec):
    PARAMETERS = {
        "serving_root": component_spec.ExecutionParameter(type=str),
        "model_name": component_spec.ExecutionParameter(type=str),
    }
    # The candidate is an input only to order this step after training and to re-run it for each
    # new candidate; its files are not read.
    INPUTS = {"model": component_spec.ChannelParameter(type=standard_artifacts.Model)}
    OUTPUTS = {"baseline_model": component_spec.ChannelParameter(type=standard_artifacts.Model)}


class LatestPushedModel(base_component.BaseComponent):
    SPEC_CLASS = LatestPushedModelSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(LatestPushedModelExecutor)

    def __init__(self, model: types.BaseChannel, serving_root: str | Any, model_name: str | Any):
        super().__init__(
            spec=LatestPushedModelSpec(
                model=model,
                serving_root=serving_root,
                model_name=model_name,
                baseline_model=types.Channel(type=standard_artifacts.Model),
            )
        )
