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

Like TF Serving with `--model_config_file_poll_wait_seconds`, a poller follows the model
config file: it mirrors the store (pipelines/serving/serving_sync.py, as the Kubernetes sidecar
does), loads the pinned version and replays its warm-up requests while the current version keeps
answering, then switches. A version that fails to load (or to warm up) is reported in the model
status and not retried while it stays pinned; the current one keeps serving.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

from google.protobuf import json_format
from tensorflow_serving.apis import get_model_status_pb2

from pipelines.serving import serving_sync, tfs_json
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
    """Which version serves, which loads, which failed; the poller that changes it."""

    def __init__(self, model_name: str, serving_model_dir: str, cache_dir: Path,
                 poll_seconds: float):  # fmt: skip
        self.model_name, self.source = model_name, serving_model_dir
        self.cache_dir, self.poll_seconds = Path(cache_dir), poll_seconds
        self.current: Servable | None = None
        self.states: dict[int, tuple[int, str, str]] = {}  # version: (state, code, message)
        self._failed: int | None = None  # the pinned version that failed to load
        self._stop = threading.Event()
        self._client, self._last_state = None, None  # see serving_sync.store_state
        self._thread: threading.Thread | None = None
        self.on_change = lambda line: None  # where the poller reports (the console)
        # When the store stops answering: says so once, follows the folder's store again
        # (pipelines/local/embedded_store.StoreFollower; set by the CLI, absent in tests).
        self.follower = None
        self._last_error: str | None = None  # a failed poll's report, not repeated every poll

    # -- the poller -----------------------------------------------------------------------------

    def poll(self) -> None:
        """One round: mirror the store, then load the pinned version if it is new. Nothing is
        done while the store shows the same config file and versions as last time."""
        if self._client is None and self.source.startswith("s3://"):
            from components.base.object_store import s3_client

            self._client = s3_client()
        state = serving_sync.store_state(self.source, self._client)
        if state is not None and state == self._last_state:
            return
        result = serving_sync.sync_once(self.source, self.model_name, self.cache_dir)
        self._last_state = serving_sync.state_after_sync(self.source, self._client, state)
        wanted = result.served
        if wanted != self._failed:
            self._failed = None  # pinned again later, a failed version is tried again
        if wanted is None or wanted == self._failed:
            return
        if self.current is not None and self.current.version == wanted:
            return
        self.states[wanted] = (_STATES.LOADING, "OK", "")
        started = time.monotonic()
        path = serving_sync.local_model_dir(self.cache_dir, self.model_name) / str(wanted)
        try:
            servable = Servable(self.model_name, wanted, path)
            warmed = servable.warm_up()
        except Exception as e:  # a broken SavedModel raises many kinds of errors
            self._failed = wanted
            code, message = _load_error(e)
            self.states[wanted] = (_STATES.END, code, message)
            kept = f"version {self.current.version} keeps serving" if self.current else (
                "nothing serves")  # fmt: skip
            self.on_change(f"Version {wanted} failed to load ({message}); {kept}.")
            _log.exception("version %s failed to load", wanted)
            return
        previous, self.current = self.current, servable  # one reference swap: no request waits
        self.states[wanted] = (_STATES.AVAILABLE, "OK", "")
        if previous is not None:
            self.states[previous.version] = (_STATES.END, "OK", "")
        self.on_change(f"Version {wanted} serves (loaded and warmed up with {warmed} requests "
                       f"in {time.monotonic() - started:.1f} s).")  # fmt: skip

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="model-poller", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def keeps(self) -> str:
        """What requests get meanwhile, for the follower's message."""
        if self.current is None:
            return "nothing serves yet"
        return f"version {self.current.version} keeps answering from its local copy"

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

    def servable(self, name: str, version: int | None, label: str | None) -> Servable:
        if label:  # no labels are configured (server_core.cc GetModelVersionForLabel)
            raise invalid(f"Unrecognized servable version label: {label}")
        what = f"Specific({name}, {version})" if version is not None else f"Latest({name})"
        self._check_model(name, what)
        current = self.current
        if current is None or (version is not None and version != current.version):
            raise ServingError("NOT_FOUND", f"Servable not found for request: {what}")
        return current

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


def _load_error(error: Exception) -> tuple[str, str]:
    """The code and message a failed load reports in the model status."""
    import tensorflow as tf
    from google.protobuf.message import DecodeError

    if isinstance(error, ServingError):
        return error.code, error.message
    if isinstance(error, tf.errors.OpError):
        from pipelines.serving.servable import _code_name

        return _code_name(error), error.message.strip()
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
    failure answers in TF Serving's shape, an unexpected one as a 500 (its traceback logged)."""
    try:
        return 200, _dispatch(manager, method, path, body)
    except ServingError as e:
        return e.http_status, {"error": e.message}
    except Exception as e:  # a bug here or an odd model: still {"error": ...}, never HTML
        _log.exception("request %s %s failed", method, path)
        return 500, {"error": f"{type(e).__name__}: {e}"}


def _version(text: str | None) -> int | None:
    if not text:
        return None
    if not text.isascii() or int(text) >= 2**63:
        raise invalid(f"Failed to convert version: {text} to numeric.")
    return int(text)


def _dispatch(manager: ModelManager, method: str, path: str, body: bytes) -> dict:
    """The checks in TF Serving's order: the path, then the body (for :predict up to the
    signature, which needs the servable), then the servable."""
    malformed = invalid(f"Malformed request: {method} {path}")
    if method == "POST":
        match = PREDICTION_PATH.fullmatch(path)
        if not match or match.group(4) not in ("predict", "classify", "regress"):
            raise malformed
        name, version, label, api = match.groups()
        version = _version(version)
        if version is not None and label:
            raise invalid(f"Both model version ({version}) and model version label ({label}) "
                          "cannot be supplied.")  # fmt: skip
        doc = tfs_json.parse(body)
        if api == "predict":
            signature = tfs_json.signature_name(doc)
            servable = manager.servable(name, version, label)
            request, form = tfs_json.predict_request(doc, servable.input_types(signature))
            return tfs_json.predict_response(servable.predict(request), form)
        request = tfs_json.examples_request(doc, api)
        servable = manager.servable(name, version, label)
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
