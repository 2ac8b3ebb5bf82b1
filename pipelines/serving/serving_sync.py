"""A local mirror of the served versions, for a model server that cannot read `s3://`.

TF Serving 2.7 and later has no S3 file system, and TensorFlow's `s3://` client is not reliable
against S3-compatible stores (README.md, "Object storage notes"). So the versions are copied to
a local folder, `<target>/<model_name>/<N>/`, and TF Serving (kubeflow/serving/, as a sidecar
running `tkp serving-sync`) or `tkp serve` reads that copy and the model config file written
beside it, `<target>/models.config`: the store's config with base_path pointing at the copy.

Order matters, because the reader polls: a version is copied into a staging folder and renamed
into place whole; the config lists a version only once it is in place; a version that left the
store (pruned) is deleted locally only when the new config no longer lists it. TF Serving refuses
a whole config whose label names a version it has not loaded yet ("Request to assign label to
version N of model M, which is not currently available for inference", server_core.cc
UpdateModelVersionLabelMap, checked before the new versions are loaded, so such a config never
converges): a label is moved only once the model server reports its new version AVAILABLE
(`available`, from `--model-server`); until then it keeps its old version, and the check runs
at every round.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from components.base import registry, serving_state, storage

_STAGING = ".staging"


@dataclass
class SyncResult:
    state: serving_state.ServingState  # the store's serving state
    versions: list[int] = field(default_factory=list)  # complete versions on the store
    copied: list[int] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    written: LocalConfig | None = None  # what the local model config file says now

    @property
    def served(self) -> int | None:
        """The stable version; None: nothing pushed yet."""
        return self.state.stable


def local_model_dir(target: Path, model_name: str) -> Path:
    return Path(target) / model_name


def local_config_path(target: Path) -> Path:
    return Path(target) / registry.MODEL_CONFIG_FILE


def label_view(state: serving_state.ServingState, label: str) -> serving_state.ServingState:
    """What a model server dedicated to `label` serves (one Deployment per label behind a
    traffic split, kubeflow/serving/): that label's version, else (no release under way, for
    `canary`) the stable one, with the labels that name it."""
    version = state.labels.get(label, state.stable)
    if version is None:
        return dataclasses.replace(state, labels={}, loaded=())
    labels = {name: v for name, v in state.labels.items() if v == version}
    return dataclasses.replace(state, labels=labels, loaded=(version,))


def sync_once(serving_model_dir: str, model_name: str, target: Path,
              available: Callable[[int], bool] | None = None,
              label: str | None = None) -> SyncResult:  # fmt: skip
    """Mirrors the complete versions under `serving_model_dir` into `target` and writes the
    local model config file: the loaded versions, and each label whose version `available` says
    the model server has loaded (without `available`, no label). With `label`, only what a
    server of that label serves (`label_view`). Raises StorageError or RegistryError (naming the
    file) when the store cannot be read or its state is broken; the local copy is then left as
    it was, so a reader keeps serving what it served."""
    target = Path(target)
    models = local_model_dir(target, model_name)
    _forget_other_source(target, models, serving_model_dir)
    complete = registry.complete_versions(serving_model_dir)
    state = serving_state.read(serving_model_dir, model_name)
    served = label_view(state, label) if label else state
    result = SyncResult(state=state, versions=sorted(complete))
    wanted = set(served.loaded) if label else set(complete)
    for version, source in sorted(complete.items()):
        if version in wanted and not (models / str(version) / "saved_model.pb").exists():
            _copy_version(source, models / str(version), target / _STAGING)
            result.copied.append(version)
    # TF Serving acts on a new config file only at its next poll, but on a version folder that
    # went within a second: a version leaves the disk only once the file in force, the one
    # before this round's, no longer listed it either.
    listed_before = _local_config(target)[1]
    written = write_local_config(target, model_name, served, available, hold=bool(label))
    result.written = written
    kept = wanted | written.versions | listed_before
    for path in sorted(models.iterdir()) if models.exists() and served.loaded else []:
        number = int(path.name) if path.name.isdigit() else None
        if number is not None and number not in kept:
            shutil.rmtree(path, ignore_errors=True)
            result.deleted.append(number)
    return result


@dataclass
class LocalConfig:
    labels: dict[str, int] = field(default_factory=dict)  # the labels written
    versions: set[int] = field(default_factory=set)  # the versions listed
    withheld: dict[str, int] = field(default_factory=dict)  # labels waiting for their version

    def describe(self) -> str:
        written = ", ".join(f"{k} -> {v}" for k, v in sorted(self.labels.items())) or "none"
        waiting = "".join(f"; {k} -> {v} once TF Serving has loaded {v}"
                          for k, v in sorted(self.withheld.items()))  # fmt: skip
        return f"labels {written}{waiting}"


def _local_config(target: Path) -> tuple[dict[str, int], set[int]]:
    """The labels and the versions the local model config file lists (none: no file yet)."""
    from google.protobuf import text_format
    from tensorflow_serving.config import model_server_config_pb2

    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(local_config_path(target).read_text(), config)
    except (OSError, text_format.ParseError):
        return {}, set()
    entries = config.model_config_list.config
    labels = {k: v for entry in entries for k, v in entry.version_labels.items()}
    return labels, {v for entry in entries for v in entry.model_version_policy.specific.versions}


def write_local_config(target: Path, model_name: str, state: serving_state.ServingState,
                       available: Callable[[int], bool] | None,
                       hold: bool = False) -> LocalConfig:  # fmt: skip
    """Writes (when it changes) the model config file TF Serving reads: the state's loaded
    versions and its labels, each label moved only once `available` says TF Serving has loaded
    its new version. Until then the label keeps the version the file gave it (listed too), as
    serving_config.md's two-step move says, so it never disappears meanwhile; a new label waits
    the same way. A label already naming its version stays, whatever TF Serving answers (a
    restarted one accepts every label at start with --allow_version_labels_for_unavailable_models
    and is still loading; one that does not answer for a round changes nothing). Without
    `available` (before TF Serving runs: the init container), no label is written. `hold` (a
    server of one label, whose version changes): the labels it served stay, with their
    versions, until TF Serving has loaded every version it is to serve."""
    if not state.loaded:
        return LocalConfig()
    before = _local_config(target)[0] if available is not None else {}
    out = LocalConfig(versions=set(state.loaded))
    if hold and before and not all(available(v) for v in state.loaded):
        for label, version in before.items():
            if label not in state.labels:
                out.labels[label] = version
                out.versions.add(version)
    for label, version in sorted(state.labels.items()):
        if before.get(label) == version or (available is not None and available(version)):
            out.labels[label] = version
            continue
        out.withheld[label] = version
        old = before.get(label)
        if old is not None:
            out.labels[label] = old
            out.versions.add(old)
    models = local_model_dir(target, model_name)
    text = serving_state.model_config_text(str(models), model_name, out.labels, out.versions)
    path = local_config_path(target)
    if not path.exists() or path.read_text() != text:
        storage.write_bytes(str(path), text.encode())
    return out


def store_state(serving_model_dir: str, client) -> tuple | None:
    """What a sync would see, summed up cheaply: the model config file's ETag, each version
    whose saved_model.pb exists (with its ETag) and the newest serving state's name, from one
    delimited listing, one HEAD per version and one listing of new states, on one reused boto3
    client. A full sync lists through Beam, which builds a new S3
    client per listing (about 0.3 s of CPU each, 2-3 s a sync): polled every few seconds, that
    would take a core from the requests. None for a path that is not `s3://` (always synced)."""
    if not serving_model_dir.startswith("s3://"):
        return None
    bucket, prefix = storage.split_s3(serving_model_dir.rstrip("/") + "/")
    try:
        return _store_state(client, bucket, prefix)
    except Exception as e:  # botocore's connection and client errors
        raise storage.StorageError(
            f"cannot read {serving_model_dir}: {e}. Check that the object store at "
            f"{os.environ.get('AWS_ENDPOINT_URL_S3') or 'AWS S3'} runs, that the bucket {bucket!r} "
            "exists, and that AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY are set."
        ) from e


def state_after_sync(serving_model_dir: str, client, before: tuple | None) -> tuple | None:
    """What a poller may remember after a sync that started from the probe `before`: `before`
    only if the store still shows it. A change between the probe and the sync (a push's model
    config landing) would otherwise be remembered as the older state; a rollback that writes
    back a byte-identical older config (same ETag) then matches it, and is never synced."""
    if before is None or store_state(serving_model_dir, client) != before:
        return None
    return before


def _store_state(client, bucket: str, prefix: str) -> tuple:
    from botocore.exceptions import ClientError

    config_tag, numbers = None, []
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=prefix, Delimiter="/"
    )
    for page in pages:
        for item in page.get("Contents", []):
            if item["Key"] == prefix + registry.MODEL_CONFIG_FILE:
                config_tag = item["ETag"]
        for common in page.get("CommonPrefixes", []):
            name = common["Prefix"][len(prefix) : -1]
            numbers += [int(name)] if name.isdigit() else []
    versions = []
    newest = _newest_state_key(client, bucket, prefix)
    for number in sorted(numbers):
        try:
            head = client.head_object(Bucket=bucket, Key=f"{prefix}{number}/saved_model.pb")
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                continue
            raise
        versions.append((number, head["ETag"]))
    return config_tag, tuple(versions), newest


_NEWEST_STATE: dict[tuple[str, str], str] = {}  # (bucket, prefix): the newest state key seen


def _newest_state_key(client, bucket: str, prefix: str) -> tuple[str, str]:
    """The key and ETag of the newest serving state (components/base/serving_state.py).
    Generation names only grow, so the listing starts after the newest one seen: one short
    request a poll, and one HEAD."""
    log = prefix + serving_state.LOG_FOLDER + "/"
    newest = _NEWEST_STATE.get((bucket, prefix), "")
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Prefix=log, StartAfter=newest or log
    )
    for page in pages:
        for item in page.get("Contents", []):
            newest = max(newest, item["Key"])
    _NEWEST_STATE[(bucket, prefix)] = newest
    if not newest:
        return "", ""
    # Its ETag too: a state is written once, but a person may still edit one by hand.
    return newest, client.head_object(Bucket=bucket, Key=newest)["ETag"]


def _forget_other_source(target: Path, models: Path, serving_model_dir: str) -> None:
    """Empties a copy made from another store or folder: version numbers are only unique
    within one serving directory, so a copy of another's version 1 must not pass for this one."""
    source = f"{os.environ.get('AWS_ENDPOINT_URL_S3', '')} {serving_model_dir}"
    marker = target / ".source"
    if marker.exists() and marker.read_text() != source:
        shutil.rmtree(models, ignore_errors=True)
        local_config_path(target).unlink(missing_ok=True)
    target.mkdir(parents=True, exist_ok=True)
    marker.write_text(source)


def _copy_version(source: str, destination: Path, staging_root: Path) -> None:
    staging = staging_root / f"{destination.name}-{uuid.uuid4().hex[:8]}"
    try:
        storage.copy_tree(source, str(staging), last="saved_model.pb")
        destination.parent.mkdir(parents=True, exist_ok=True)
        if destination.exists():  # a copy that died before saved_model.pb: replace it
            shutil.rmtree(destination)
        staging.rename(destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def version_state(url: str, model_name: str, version: int, host: str | None = None,
                  timeout: float = 5) -> str:  # fmt: skip
    """ "AVAILABLE" when TF Serving at `url` answers that `version` is (GET
    /v1/models/<name>/versions/N), else what it or the network said instead. `host`: the Host
    header (a pod asked at its IP under a Service's name)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/models/{model_name}/versions/{version}",
        headers={"Host": host} if host else {},
    )  # fmt: skip
    # No proxy: the model server is this pod's or the cluster's (an HTTP_PROXY would swallow it).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as answer:
            statuses = json.loads(answer.read()).get("model_version_status", [])
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code}: {e.read()[:200].decode(errors='replace')}"
    except (OSError, ValueError) as e:
        return f"no answer ({e})"
    states = {s.get("state") for s in statuses}
    return "AVAILABLE" if "AVAILABLE" in states else "/".join(sorted(states)) or "unknown"


def model_server_loaded(url: str, model_name: str) -> Callable[[int], bool]:
    """Whether TF Serving at `url` reports a version AVAILABLE; any failure to ask counts as
    not loaded (a label moving there waits for the next round)."""
    return lambda version: version_state(url, model_name, version) == "AVAILABLE"


def run(serving_model_dir: str, model_name: str, target: Path, interval: float | None,
        say: Callable[[str], None], model_server: str | None = None,
        label: str | None = None) -> int:  # fmt: skip
    """`tkp serving-sync`: once (interval None; an error is the exit status, for an init
    container), or every `interval` seconds until stopped (an error is logged and retried: the
    reader keeps serving the last good copy meanwhile). `model_server`: the TF Serving whose
    loaded versions decide when a label is written (without it, no label is). `label`: mirror
    only what a server of that label serves (`label_view`)."""
    available = model_server_loaded(model_server, model_name) if model_server else None
    client, last_state, result, said = None, None, None, ""
    while True:
        started = time.monotonic()
        try:
            if client is None and serving_model_dir.startswith("s3://"):
                from components.base.object_store import s3_client

                client = s3_client()
            state = store_state(serving_model_dir, client)
            if state is not None and state == last_state:
                # The store is as it was; TF Serving may not be (a version loaded, a restart
                # that forgot every label): the labels are checked at every round.
                if available is not None:
                    served = label_view(result.state, label) if label else result.state
                    labels = write_local_config(target, model_name, served, available,
                                                hold=bool(label))  # fmt: skip
                    said = _say_labels(labels, said, say)
                time.sleep(interval)
                continue
            result = sync_once(serving_model_dir, model_name, target, available, label)
            last_state = state_after_sync(serving_model_dir, client, state)
        except Exception as e:  # StorageError, RegistryError, OSError: all retried
            if interval is None:
                raise
            say(f"serving-sync: {e} (retrying in {interval:g} s; the last copy stays served)")
        else:
            if result.copied or result.deleted or interval is None:
                say(
                    f"serving-sync: {result.state.describe()}; copied {result.copied or '-'}, "
                    f"deleted {result.deleted or '-'} ({time.monotonic() - started:.1f} s)"
                )
            if available is not None:
                said = _say_labels(result.written, said, say)
        if interval is None:
            return 0
        time.sleep(interval)


def _say_labels(labels: LocalConfig, said: str, say: Callable[[str], None]) -> str:
    """Says which labels TF Serving was given, once per change."""
    line = f"serving-sync: {labels.describe()}"
    if line != said:
        say(line)
    return line
