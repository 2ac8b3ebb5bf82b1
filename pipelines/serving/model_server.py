"""`tkp serve`: the pushed versions over TF Serving's REST API, for local use and tests.

The TF Serving binary cannot be installed everywhere this project runs, so this server plays
its REST contract (paths and dispatch as `model_servers/http_rest_api_handler.cc` and
`http_rest_api_util.cc` at 2.16.1; JSON in pipelines/serving/tfs_json.py; execution in
pipelines/serving/servable.py) on FastAPI and uvicorn. Why not KServe's Python server: kserve
0.13.1, the last release that resolves with this stack, imports Ray at start-up and pins it
(`ray[serve]==2.10`), which would add Ray to every image and move google-cloud-aiplatform back 50
releases; and its v1 protocol lacks TF Serving's versions, metadata, :classify and :regress, which
would have to be written here anyway. FastAPI and uvicorn are what KServe's server is built on, and
they install with the current lock unchanged.

Like TF Serving with `--model_config_file_poll_wait_seconds`, a poller follows the serving state
(components/base/serving_state.py): it mirrors the store (pipelines/serving/serving_sync.py, as
the Kubernetes sidecar does), loads each version the state lists and replays its warm-up requests
while the loaded ones keep answering, then applies the labels (`stable`, `canary`), answered at
`/v1/models/<name>/labels/<label>`. A version that fails to load (or to warm up) is reported in the
model status and not retried while the state lists it; a label naming a version that is not
loaded is not applied (TF Serving refuses such a config whole), and the labels in force stay.
One difference from TF Serving, on purpose: a request without version or label gets `stable`,
where TF Serving takes the highest loaded version (a canary's, during a release).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

from google.protobuf import json_format
from tensorflow_serving.apis import get_model_status_pb2

from components.base.registry import RegistryError
from components.base.serving_state import CANARY, STABLE, ServingState
from pipelines.serving import serving_sync, tfs_json
from pipelines.serving.batching import BatchingParameters, BatchScheduler
from pipelines.serving.metrics import ServingMetrics
from pipelines.serving.routing import Router
from pipelines.serving.servable import Servable
from pipelines.serving.tfs_json import ServingError, invalid

_log = logging.getLogger(__name__)

# http_rest_api_util.cc kPredictionApiGegex and kModelStatusApiRegex.
PREDICTION_PATH = re.compile(r"(?i)/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/"
                             r"([^/:]+)))?:(classify|regress|predict)")  # fmt: skip
STATUS_PATH = re.compile(r"(?i)/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/"
                         r"([^/:]+)))?(?:\/(metadata))?")  # fmt: skip
_STATES = get_model_status_pb2.ModelVersionStatus.State


class ModelManager:
    """Which versions are loaded, which labels name them, which failed; the poller that changes
    them."""

    def __init__(self, model_name: str, serving_model_dir: str, cache_dir: Path,
                 poll_seconds: float, batching: BatchingParameters | None = None,
                 label: str | None = None):  # fmt: skip
        self.model_name, self.source = model_name, serving_model_dir
        # A server of one label (one Deployment per track behind a traffic split): it serves
        # what serving_sync.label_view says, and splits nothing itself.
        self.label = label
        self.cache_dir, self.poll_seconds = Path(cache_dir), poll_seconds
        self.loaded: dict[int, Servable] = {}
        self.labels: dict[str, int] = {}  # the labels in force (all of them name loaded versions)
        self.states: dict[int, tuple[int, str, str]] = {}  # version: (state, code, message)
        self._failed: set[int] = set()  # wanted versions that failed to load: not retried
        self._stop = threading.Event()
        self._client, self._last_state = None, None  # see serving_sync.store_state
        self._broken_state = None  # the store's probe when its state last failed to read
        self._labels_report = ""  # the last "Labels not applied" said
        self._thread: threading.Thread | None = None
        self.on_change = lambda line: None  # where the poller reports (the console)
        # When the store stops answering: says so once, follows the folder's store again
        # (pipelines/local/embedded_store.StoreFollower; set by the CLI, absent in tests).
        self.follower = None
        self._last_error: str | None = None  # a failed poll's report, not repeated every poll
        self.router = Router()  # the traffic split or shadow of a release, fault drills
        self.metrics = ServingMetrics()
        # --enable_batching: one pool of batch threads for every version (TF Serving's
        # SharedBatchScheduler), each version's queues in it.
        self.batcher = None
        if batching:
            self.batcher = BatchScheduler(batching, self.metrics.enable_batching())

    @property
    def current(self) -> Servable | None:
        """What an unlabelled request gets: `stable`, else (nothing labelled yet) the highest
        loaded version, TF Serving's Latest."""
        loaded = dict(self.loaded)
        version = self.labels.get(STABLE, max(loaded, default=None))
        return loaded.get(version)

    # -- the poller -----------------------------------------------------------------------------

    def poll(self) -> None:
        """One round: mirror the store, then load the versions the serving state wants and apply
        its labels. Nothing is done while the store shows the same state as last time, nor while
        it shows the same broken state (its error was reported once)."""
        if self._client is None and self.source.startswith("s3://"):
            from components.base.object_store import s3_client

            self._client = s3_client()
        probe = serving_sync.store_state(self.source, self._client)
        if probe is not None and probe in (self._last_state, self._broken_state):
            return
        try:
            result = serving_sync.sync_once(self.source, self.model_name, self.cache_dir,
                                            label=self.label)  # fmt: skip
        except RegistryError:
            self._broken_state = probe  # reported by the caller; not read again until it changes
            raise
        self._broken_state = None
        self._last_state = serving_sync.state_after_sync(self.source, self._client, probe)
        state = result.state
        self._apply(serving_sync.label_view(state, self.label) if self.label else state)

    def _apply(self, state: ServingState) -> None:
        wanted = set(state.loaded)
        self._failed &= wanted  # a failed version wanted again later is tried again
        for version in sorted(wanted - set(self.loaded) - self._failed):
            self._load(version)
        missing = {label: v for label, v in state.labels.items() if v not in self.loaded}
        if missing:
            # TF Serving refuses such a config whole (server_core.cc UpdateModelVersionLabelMap):
            # the labels in force stay, and so do the versions they name.
            kept = ", ".join(f"{k} {v}" for k, v in sorted(self.labels.items())) or "none"
            names = ", ".join(f"{k} -> {v}" for k, v in sorted(missing.items()))
            report = f"Labels not applied ({names}: not loaded); the labels in force stay ({kept})."
            if report != self._labels_report:  # once, also where every poll syncs (not s3://)
                self.on_change(report)
            self._labels_report = report
            wanted |= set(self.labels.values())
        elif state.labels != self.labels:
            self._labels_report = ""
            self.labels = dict(state.labels)
            self.on_change(f"Serving {state.describe()}.")
        in_force = (not self.label and state.release
                    and self.labels.get(CANARY) == state.release["canary"])  # fmt: skip
        self.router.release = state.release if in_force else None
        for version in sorted(set(self.loaded) - wanted - set(self.labels.values())):
            self.loaded.pop(version).unload()
            self.states[version] = (_STATES.END, "OK", "")

    def _load(self, version: int) -> None:
        self.states[version] = (_STATES.LOADING, "OK", "")
        started = time.monotonic()
        path = serving_sync.local_model_dir(self.cache_dir, self.model_name) / str(version)
        servable = None
        try:
            servable = Servable(self.model_name, version, path, self.batcher)
            warmed = servable.warm_up()
        except Exception as e:  # a broken SavedModel raises many kinds of errors
            if servable is not None:
                servable.unload()
            self._failed.add(version)
            code, message = _load_error(e)
            self.states[version] = (_STATES.END, code, message)
            current = self.current
            kept = f"version {current.version} keeps serving" if current else "nothing serves"
            self.on_change(f"Version {version} failed to load ({message}); {kept}.")
            _log.exception("version %s failed to load", version)
            return
        self.loaded[version] = servable  # one dict entry: no request waits
        self.states[version] = (_STATES.AVAILABLE, "OK", "")
        self.on_change(f"Version {version} serves (loaded and warmed up with {warmed} requests "
                       f"in {time.monotonic() - started:.1f} s).")  # fmt: skip

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="model-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.router.stop()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.batcher is not None:
            self.batcher.stop()

    def keeps(self) -> str:
        """What requests get meanwhile, for the follower's message."""
        current = self.current
        if current is None:
            return "nothing serves yet"
        return f"version {current.version} keeps answering from its local copy"

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self._poll_following()
            except Exception as e:  # the store may be away for a while: keep serving, retry
                _log.exception("poll failed")
                if self.follower is not None and self.follower.lost:
                    continue  # the follower said it once
                report = f"Could not read the served versions ({e}); {self.keeps()}; retrying."
                if report != self._last_error:  # said once, not at every poll
                    self.on_change(report)
                self._last_error = report
            else:
                if self._broken_state is not None:
                    continue  # the same broken state, skipped: nothing has recovered
                if self._last_error is not None:
                    self.on_change("Reading the served versions again.")
                self._last_error = None

    def _poll_following(self) -> None:
        try:
            self.poll()
        except Exception as error:
            if self.follower is None or not self.follower.failed(error):
                raise
            self._client, self._last_state = None, None  # another endpoint: read everything
            self.poll()
        if self.follower is not None:
            self.follower.answered()

    # -- what requests see ----------------------------------------------------------------------

    def _check_model(self, name: str, what: str) -> None:
        if name != self.model_name:
            raise ServingError("NOT_FOUND", f"Servable not found for request: {what}")

    def servable(self, name: str, version: int | None, label: str | None,
                 seen: dict | None = None) -> Servable:  # fmt: skip
        """The version a request names, or its label's (server_core.cc GetModelVersionForLabel:
        an unknown label, also one of an unknown model, is a 400), or for neither the one the
        release's routing picks (`stable` outside a release). `seen` (an inference request's)
        learns the version and label that answer, and whether a shadow copy is due; a fault
        drill on that version acts here."""
        # One view of both: the poller may move labels and unload versions meanwhile (a
        # Servable taken here keeps answering after it is unloaded).
        labels, loaded = dict(self.labels), dict(self.loaded)
        if seen is not None and not label and version is None and name == self.model_name:
            label = seen.get("force_label")
            gone = label is not None and (label not in labels or labels[label] not in loaded)
            if gone:  # a shadow copy whose canary went
                raise ServingError("NOT_FOUND", "the canary is gone: the copy is dropped")
            if label is None:
                label, seen["shadow"] = self.router.routed_version()
            if label not in labels or labels[label] not in loaded:
                label = None  # nothing labelled yet, or a canary just unloaded: `stable`'s
                if STABLE in labels and labels[STABLE] in loaded:
                    label = STABLE
        if label:
            labels = labels if name == self.model_name else {}
            if label not in labels:
                raise invalid(f"Unrecognized servable version label: {label}")
            version = labels[label]
        what = f"Specific({name}, {version})" if version is not None else f"Latest({name})"
        self._check_model(name, what)
        if version is None:  # TF Serving's Latest: no label applies yet
            version = labels.get(STABLE, max(loaded, default=None))
        servable = loaded.get(version)
        if servable is None:
            raise ServingError("NOT_FOUND", f"Servable not found for request: {what}")
        if seen is not None:
            seen["version"], seen["label"] = servable.version, _label_of(labels, servable.version)
            self.router.apply_drill(servable.version)
        return servable

    def status(self, name: str, version: int | None) -> dict:
        """GetModelStatusImpl: every version this server knows of, or the one asked for."""
        # A copy: the poller adds versions while a request reads them.
        known = {v: s for v, s in dict(self.states).items() if name == self.model_name}
        if version is not None:
            if version not in known:
                raise ServingError("NOT_FOUND", f"Could not find version {version} of "
                                   f"model {name}")  # fmt: skip
            known = {version: known[version]}
        if not known:
            raise ServingError("NOT_FOUND", f"Could not find any versions of model {name}")
        response = get_model_status_pb2.GetModelStatusResponse()
        for number, (state, code, message) in sorted(known.items(), reverse=True):
            entry = response.model_version_status.add(version=number, state=state)
            entry.status.error_code = _error_code(code)
            entry.status.error_message = message
        return json_format.MessageToDict(response, including_default_value_fields=True)


def _label_of(labels: dict[str, int], version: int) -> str:
    return next((k for k, v in sorted(labels.items()) if v == version), "")


def _load_error(error: Exception) -> tuple[str, str]:
    """The code and message a failed load reports in the model status."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    if isinstance(error, ServingError):
        return error.code, error.message
    if isinstance(error, tf.errors.OpError):
        return tfs_json.code_name(error), error.message.strip()
    if isinstance(error, DecodeError):  # saved_model.pb is not a SavedModel
        return "DATA_LOSS", f"Can't parse saved_model.pb as binary proto: {error}"
    return "UNKNOWN", f"{type(error).__name__}: {error}"


def _error_code(name: str) -> int:
    from tensorflow_serving.apis import status_pb2

    return (
        status_pb2.StatusProto.DESCRIPTOR.fields_by_name["error_code"]
        .enum_type.values_by_name[name]
        .number
    )


def handle(manager: ModelManager, method: str, path: str, body: bytes) -> tuple[int, dict]:
    """HttpRestApiHandler::ProcessRequest: (HTTP status, JSON body) for one request. Every
    failure answers in TF Serving's shape, an unexpected one as a 500 (its traceback logged).
    Each request is counted as TF Serving counts it, an inference request's answer is recorded
    for its version; in shadow mode its copy is then answered by the canary in the
    background."""
    seen: dict = {}
    started = time.perf_counter()
    status, payload = _answer(manager, method, path, body, seen)
    manager.metrics.count_request(_model_in(path), seen.get("status", "OK"), seen.get("api", ""),
                                  time.perf_counter() - started)  # fmt: skip
    if seen.get("shadow"):
        copy = {"force_label": CANARY}
        if not manager.router.shadow(lambda: _answer(manager, method, path, body, copy)):
            manager.metrics.shadow_dropped.labels(manager.model_name).inc()
    return status, payload


def _model_in(path: str) -> str:
    match = PREDICTION_PATH.fullmatch(path) or STATUS_PATH.fullmatch(path)
    return (match.group(1) or "") if match else ""


def _answer(manager: ModelManager, method: str, path: str, body: bytes,
            seen: dict) -> tuple[int, dict]:  # fmt: skip
    started = time.perf_counter()
    try:
        status, payload = 200, _dispatch(manager, method, path, body, seen)
    except ServingError as e:
        status, payload, seen["status"] = e.http_status, {"error": e.message}, e.code
    except Exception as e:  # a bug here or an odd model: still {"error": ...}, never HTML
        _log.exception("request %s %s failed", method, path)
        status, payload = 500, {"error": f"{type(e).__name__}: {e}"}
        seen["status"] = "INTERNAL"
    if method == "POST":
        manager.metrics.record(manager.model_name, seen.get("version"), seen.get("label", ""),
                               status, time.perf_counter() - started, payload)  # fmt: skip
    return status, payload


def _version(text: str | None) -> int | None:
    if not text:
        return None
    if not text.isascii() or int(text) >= 2**63:
        raise invalid(f"Failed to convert version: {text} to numeric.")
    return int(text)


def _dispatch(manager: ModelManager, method: str, path: str, body: bytes, seen: dict) -> dict:
    """The checks in TF Serving's order: the path, then the body (for :predict up to the
    signature, which needs the servable), then the servable."""
    malformed = invalid(f"Malformed request: {method} {path}")
    if method == "POST":
        match = PREDICTION_PATH.fullmatch(path)
        if not match or match.group(4) not in ("predict", "classify", "regress"):
            raise malformed
        name, version, label, api = match.groups()
        seen["api"] = api
        version = _version(version)
        if version is not None and label:
            raise invalid(f"Both model version ({version}) and model version label ({label}) "
                          "cannot be supplied.")  # fmt: skip
        doc = tfs_json.parse(body)
        if api == "predict":
            signature = tfs_json.signature_name(doc)
            servable = manager.servable(name, version, label, seen)
            request, form = tfs_json.predict_request(doc, servable.input_types(signature))
            return tfs_json.predict_response(servable.predict(request), form)
        request = tfs_json.examples_request(doc, api)
        servable = manager.servable(name, version, label, seen)
        if api == "classify":
            return tfs_json.classify_response(servable.classify(request))
        return tfs_json.regress_response(servable.regress(request))
    match = STATUS_PATH.fullmatch(path) if method == "GET" else None
    if not match:
        raise malformed
    name, version, label, subresource = match.groups()
    version = _version(version)
    if not name:
        raise invalid("Missing model name in request.")
    if subresource == "metadata":
        metadata = manager.servable(name, version, label).metadata()
        spec = json_format.MessageToDict(metadata.model_spec, True, True)
        signatures = get_signature_map(metadata)
        return {"model_spec": spec, "metadata": {"signature_def": signatures}}
    # GetModelStatusImpl reads only the version: a label lists every version.
    return manager.status(name, version)


def get_signature_map(metadata) -> dict:
    from tensorflow_serving.apis import get_model_metadata_pb2

    signatures = get_model_metadata_pb2.SignatureDefMap()
    metadata.metadata["signature_def"].Unpack(signatures)
    return json_format.MessageToDict(signatures, True, True)
