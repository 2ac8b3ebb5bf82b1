"""Training backups that a re-run of the same training finds again, on the pipeline root.

A Trainer killed mid-way (node preemption, OOM, a retried pod) gets a new execution with new
artifact URIs when it runs again, so its backup cannot live in its own output folder. It lives
under `<pipeline_root>/_checkpoints/<key>/`, where the key is a hash of what defines the
training by content: the selected spans' fingerprint, the curated schema, the code of the
model and the transform (these modules' sources), and every training parameter. The same
training finds its backup; any change starts afresh.

Keras' BackupAndRestore writes the state (weights, optimizer, epoch, step, step counter) to a
local folder; this module mirrors that folder to the pipeline root through components.base.storage
(boto3 on s3://, never TensorFlow's s3:// client: shared facts in README.md "Object storage
notes"). Data files are copied first and the `checkpoint` index last, so a copy cut short
leaves the previous backup readable.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import time
from pathlib import Path

import tensorflow as tf

from components.base import storage

CHECKPOINTS_FOLDER = "_checkpoints"
INDEX_FILE = "checkpoint"  # tf.train.CheckpointManager's index: names the newest checkpoint
_STATE_FOLDER = "chief"  # where BackupAndRestore's reader looks (worker_training_state.py)
_FINAL_FOLDER, _FINAL_SUMMARY = "final", "summary.json"  # a finished training, not yet exported

_log = logging.getLogger(__name__)


def code_version(use_case_module: str | None = None) -> str:
    """SHA-256 of the training code's sources (the code a worker image runs): this package and
    the use case's package (`parameters["use_case"]`), found without importing it."""
    folders = [Path(__file__).parent]
    if use_case_module:
        spec = importlib.util.find_spec(use_case_module)
        if spec and spec.submodule_search_locations:
            folders += [Path(p) for p in spec.submodule_search_locations]
    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(folder.glob("*.py")):
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def _use_case_module(parameters: dict) -> str | None:
    from components.base.use_case import module_of

    name = parameters.get("use_case")
    return module_of(name) if name else None


# Training parameters that do not change the trained weights, so not part of the backup key.
# (checkpoint_every_steps stays in: a step backup resumed in epoch mode would skip the rest of
# its epoch.)
NOT_IN_BACKUP_KEY = (
    "checkpoint_root", "checkpoint_max_age_hours", "max_train_minutes", "tensorboard_every_steps",
    "cluster_job", "search",
)  # fmt: skip


def training_key(data_fingerprint: str, schema: bytes, parameters: dict) -> str:
    """The backup key of a training: same data, schema, code and parameters -> same key."""
    identity = {
        "data": data_fingerprint,
        "schema": hashlib.sha256(schema).hexdigest(),
        "code": code_version(_use_case_module(parameters)),
        "parameters": parameters,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


class TrainingBackup:
    """A local BackupAndRestore folder and its copy at `remote_dir` on the pipeline root."""

    def __init__(self, remote_dir: str, local_dir: str, writer: bool):
        self.remote_dir = remote_dir
        self.local_dir = local_dir
        self.writer = writer  # only the chief uploads; every worker downloads

    @property
    def _local_state(self) -> str:
        return os.path.join(self.local_dir, _STATE_FOLDER)

    @property
    def _remote_state(self) -> str:
        return storage.join(self.remote_dir, _STATE_FOLDER)

    def download(self) -> bool:
        """Copies the remote backup into the local folder; False when there is none (or only
        an index whose files are gone: then training starts afresh)."""
        index = storage.join(self._remote_state, INDEX_FILE)
        if not storage.list_files(index):
            return False
        index_text = storage.read_bytes(index)
        newest = _newest_prefix(index_text.decode())
        paths = storage.list_files(storage.join(self._remote_state, f"{newest}.*"))
        if not any(p.endswith(".index") for p in paths):
            _log.warning("Backup %s names %s, which is not there: starting afresh",
                         self.remote_dir, newest)  # fmt: skip
            return False
        os.makedirs(self._local_state, exist_ok=True)
        for path in paths:
            name = path.rsplit("/", 1)[-1]
            Path(self._local_state, name).write_bytes(storage.read_bytes(path))
        Path(self._local_state, INDEX_FILE).write_bytes(index_text)
        return True

    def save_final(self, model, summary: dict) -> None:
        """Backs up the weights to export and the training summary: a Trainer killed after
        training (in the export) exports these on its retry instead of training on."""
        if not self.writer:
            return
        folder = os.path.join(self.local_dir, _FINAL_FOLDER)
        model.save_weights(os.path.join(folder, "weights"))
        for name in sorted(os.listdir(folder)):
            data = Path(folder, name).read_bytes()
            storage.write_bytes(storage.join(self.remote_dir, _FINAL_FOLDER, name), data)
        summary_file = storage.join(self.remote_dir, _FINAL_FOLDER, _FINAL_SUMMARY)
        storage.write_bytes(summary_file, json.dumps(summary).encode())  # last: complete

    def load_final(self, model) -> dict | None:
        """The summary of a finished training, its weights loaded into `model`; else None."""
        remote = storage.join(self.remote_dir, _FINAL_FOLDER)
        if not storage.list_files(storage.join(remote, _FINAL_SUMMARY)):
            return None
        folder = os.path.join(self.local_dir, _FINAL_FOLDER)
        os.makedirs(folder, exist_ok=True)
        for path in storage.list_files(storage.join(remote, "*")):
            Path(folder, path.rsplit("/", 1)[-1]).write_bytes(storage.read_bytes(path))
        model.load_weights(os.path.join(folder, "weights"))
        summary = json.loads(Path(folder, _FINAL_SUMMARY).read_text())
        return dict(summary, resumed=True)

    def upload(self) -> None:
        """Mirrors the local backup: data files, then the index, then stale files go."""
        if not self.writer or not os.path.exists(os.path.join(self._local_state, INDEX_FILE)):
            return
        names = sorted(os.listdir(self._local_state))
        before = set(storage.list_files(storage.join(self._remote_state, "*")))
        for name in [n for n in names if n != INDEX_FILE] + [INDEX_FILE]:
            data = Path(self._local_state, name).read_bytes()
            storage.write_bytes(storage.join(self._remote_state, name), data)
        current = {storage.join(self._remote_state, n) for n in names}
        storage.delete_files(sorted(before - current))

    def delete_remote(self) -> None:
        if self.writer:
            storage.delete_tree(self.remote_dir)


def _newest_prefix(index_text: str) -> str:
    """`ckpt-7` from a CheckpointManager index (`model_checkpoint_path: "ckpt-7"`)."""
    for line in index_text.splitlines():
        if line.startswith("model_checkpoint_path:"):
            return os.path.basename(line.split(":", 1)[1].strip().strip('"'))
    raise ValueError(f"no model_checkpoint_path in checkpoint index: {index_text!r}")


class StoreBackedBackup(tf.keras.callbacks.BackupAndRestore):
    """BackupAndRestore that backs up every epoch and, when `every_steps`, every that many
    steps too (Keras does one or the other), and mirrors each backup to the pipeline root."""

    def __init__(self, backup: TrainingBackup, every_steps: int = 0):
        super().__init__(
            backup.local_dir, save_freq=every_steps or "epoch", delete_checkpoint=False
        )
        self.backup = backup
        self._saved_at_batch = None
        # Keras lists the strategies it tested; one device is the default strategy's case with
        # an explicit device, and its checkpoints are the same.
        self._supported_strategies += (tf.distribute.OneDeviceStrategy,)

    def _backup(self, epoch, batch=0):
        super()._backup(epoch=epoch, batch=batch)
        self._saved_at_batch = (epoch, batch)
        self.backup.upload()

    def on_epoch_end(self, epoch, logs=None):
        if self.save_freq == "epoch":
            return super().on_epoch_end(epoch, logs)
        # Step mode: the epoch's last step index is in the state already (on_train_batch_begin),
        # so a resume starts at the next epoch; skip when a step backup just wrote it.
        last = int(self._training_state._ckpt_saved_batch.numpy())
        if self._saved_at_batch != (epoch, last):
            self._backup(epoch=epoch, batch=last)


def remove_abandoned(
    root: str, max_age_hours: float, keep: str, what: str = "training backup"
) -> list[str]:
    """Deletes backups under `root` whose newest file is older than `max_age_hours` (a training
    that never finished and was not run again), except `keep`; also used for other folders of
    abandoned trainings (`what` names them in the log). Returns the deleted folders."""
    newest: dict[str, float] = {}
    for info in storage.list_file_infos(storage.join(root, "**")):
        key = info.path[len(root.rstrip("/")) + 1 :].split("/", 1)[0]
        newest[key] = max(newest.get(key, 0.0), info.mtime)
    cutoff = time.time() - max_age_hours * 3600
    removed = []
    for key, mtime in sorted(newest.items()):
        if key != keep and mtime < cutoff:
            storage.delete_tree(storage.join(root, key))
            removed.append(key)
            _log.info("Removed abandoned %s %s (untouched since %s)", what, key,
                      time.strftime("%Y-%m-%d %H:%M", time.gmtime(mtime)))  # fmt: skip
    return removed
