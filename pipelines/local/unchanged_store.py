"""A run with nothing new, answered without starting the embedded store when its folder shows
that nothing can have changed since a run found the same.

The embedded SeaweedFS is the only writer of its folder, and it runs only while a command holds
it. When a run ends by stopping it (no other command used it, it was not kept), the folder's
files (names, sizes, modification times) stand for everything the store holds: the data, the
registry, the serving state. The run records what a run with its config would answer to "is
there anything new?" beside that stamp; the next run with the same config, the same code, no
store running and the same stamp answers the same without starting SeaweedFS (about 3 s of the
4 s such a run took, measured by `tkp bench`). Anything that touched the store since (an upload,
a rollback, a promotion, any command that started it) changed the folder, and the run checks
as before. A configured store (AWS_ENDPOINT_URL_S3) has other writers, and data or a serving
folder outside the store change without it: never recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from components.base.config import PipelineConfig

RECORD_NAME = "nothing-new.json"  # beside the store's folder, in the work folder
# The code that decides "nothing new": a change to it must not reuse an answer it gave.
_DECIDING_MODULES = ("components.base.spans", "components.base.registry",
                     "components.base.serving_state", "components.base.storage",
                     "components.base.path_globs", "pipelines.local.local_runner")  # fmt: skip


def folder_stamp(data_dir: Path) -> str:
    """A digest of every file under the store's folder: relative path, size, mtime (ns)."""
    digest = hashlib.sha256()
    for folder, dirs, files in os.walk(data_dir):
        dirs.sort()
        for name in sorted(files):
            path = Path(folder, name)
            try:
                stat = path.stat()
            except OSError:  # removed while walking: no stamp this store could match
                continue
            digest.update(f"{path.relative_to(data_dir)}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
                          .encode())  # fmt: skip
    return digest.hexdigest()


def _key(config: PipelineConfig) -> str:
    import importlib.util

    digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True, default=str).encode())
    for module in _DECIDING_MODULES:
        digest.update(Path(importlib.util.find_spec(module).origin).read_bytes())
    return digest.hexdigest()


def _store_idle(config: PipelineConfig, data_dir: Path) -> bool:
    """No embedded store runs on the folder, none is configured elsewhere, and everything the
    check reads (the data, the serving folder) is in it: a local or gs:// root changes without
    the store."""
    from components.base.object_store import EmbeddedObjectStore, _weed_processes_on

    roots = (config.data_root, config.serving_root)
    if os.environ.get("AWS_ENDPOINT_URL_S3") or not all(r.startswith("s3://") for r in roots):
        return False
    store = EmbeddedObjectStore(data_dir)
    return store.read_pid_file() is None and not _weed_processes_on(store.data_dir)


def recall(config: PipelineConfig, data_dir: Path) -> list[str] | None:
    """The lines a run with `config` printed when it found nothing new, if the store's folder is
    as that run left it; None when this run must check."""
    record_path = data_dir.parent / RECORD_NAME
    if config.force or not record_path.exists() or not _store_idle(config, data_dir):
        return None
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        return None
    if record.get("key") != _key(config) or record.get("stamp") != folder_stamp(data_dir):
        return None
    return list(record["lines"])


def remember(config: PipelineConfig, data_dir: Path, lines: list[str]) -> None:
    """Records `lines` as this config's answer, for the store's folder as it is now (call it
    after the store stopped); a folder still in use records nothing and forgets what was."""
    record_path = data_dir.parent / RECORD_NAME
    record_path.unlink(missing_ok=True)
    if config.force or not _store_idle(config, data_dir):
        return
    record = {"key": _key(config), "stamp": folder_stamp(data_dir), "lines": lines}
    partial = record_path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(json.dumps(record))
    os.replace(partial, record_path)
