"""What the Tuner and the Trainer step both read from their inputs before training.

- the class names ExampleGen found in the data (an image use case's classes come from its
  folders, so the model's output layer is sized by the data, not by the config);
- a folder on the store named by what defines a training (the selected spans' fingerprint, the
  curated schema, the code and the settings: components/training/checkpoints.py
  `training_key`), so a re-run of the same training finds its earlier work (the Trainer's
  backup, the Tuner's trials) and a changed one starts afresh.
"""

from __future__ import annotations

import json
import os

from tfx.types import artifact_utils
from tfx.utils import io_utils

from components.base import storage
from components.base.launcher_paths import PIPELINE_FOLDER_ENV
from components.steps.span_selection import read_selection
from components.steps.step_outputs import CLASS_NAMES_KEY


def with_class_names(input_dict, custom_config: dict) -> dict:
    """custom_config with `class_names` from the `raw_examples` input, when the step has one."""
    if not input_dict.get("raw_examples"):
        return custom_config
    raw = artifact_utils.get_single_instance(input_dict["raw_examples"])
    names = json.loads(raw.get_string_custom_property(CLASS_NAMES_KEY) or "null")
    return {**custom_config, "class_names": names}


def keyed_folder(input_dict, custom_config: dict, extra: dict, configured_root: str,
                 subfolder: str, what: str) -> str:  # fmt: skip
    """`<root>/<key>`: the key from the `selection` and `schema` inputs, `custom_config` (less
    what does not change the trained weights) and `extra`. The root is `subfolder` of the run's
    own pipeline folder on Kubeflow (a run may set it apart from the compiled one:
    pipelines/kubeflow/kfp_entrypoint.py), else `configured_root`. Folders under the root
    untouched for checkpoint_max_age_hours, except this one, are removed (`what` names them)."""
    from components.training import checkpoints

    selection = read_selection(artifact_utils.get_single_instance(input_dict["selection"]))
    schema_dir = artifact_utils.get_single_uri(input_dict["schema"])
    schema = storage.read_bytes(io_utils.get_only_uri_in_dir(schema_dir))
    parameters = {k: v for k, v in custom_config.items() if k not in checkpoints.NOT_IN_BACKUP_KEY}
    parameters.update(extra)
    key = checkpoints.training_key(selection["fingerprint"], schema, parameters)
    folder = os.environ.get(PIPELINE_FOLDER_ENV)
    root = storage.join(folder, subfolder) if folder else configured_root
    max_age = float(custom_config.get("checkpoint_max_age_hours", 72))
    checkpoints.remove_abandoned(root, max_age, keep=key, what=what)
    return storage.join(root, key)
