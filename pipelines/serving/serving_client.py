"""A client of TF Serving's REST API: the same requests work against real TF Serving
(kubeflow/serving/) and `tkp serve`.

Rows are raw CSV rows (column name to text, as a span's CSV holds them). Each call shows
one way in: :predict with base64 tf.Examples (`serving_default`), :predict with plain JSON
values (`raw_features`), :classify and :regress with tf.Examples written as JSON objects.
"""

from __future__ import annotations

import base64
from typing import Any

import requests
from tensorflow_metadata.proto.v0 import schema_pb2

from components.base.config import FIELDS
from components.base.use_case import UseCase
from components.base.use_case import load as load_use_case
from components.training.export import (
    CLASSIFY_SIGNATURE,
    RAW_SIGNATURE,
    REGRESS_SIGNATURE,
    SERVING_SIGNATURE,
)


class ServingRequestError(RuntimeError):
    """A request the server refused: its HTTP status and TF Serving's error message."""

    def __init__(self, status: int, message: str, url: str):
        super().__init__(f"{url} answered {status}: {message}")
        self.status, self.message = status, message


def _typed(row: dict[str, str], use_case: UseCase) -> dict[str, Any]:
    """Feature values with the schema's types; the label and empty cells left out."""
    from pipelines.serving.samples import feature_types

    types, typed = feature_types(use_case.schema_path), {}
    for key, text in row.items():
        if key == use_case.label_key or text in ("", None):
            continue
        kind = types.get(key)
        # A FLOAT column stays a JSON float (12.0, not 12), so TF Serving parses a float_list.
        typed[key] = float(text) if kind == schema_pb2.FLOAT else (
            int(text) if kind == schema_pb2.INT else text)  # fmt: skip
    return typed


class ServingClient:
    """Rows are turned into requests with the use case's schema (types) and label (left out)."""

    def __init__(
        self,
        base_url: str,
        model_name: str,
        timeout: float = 30.0,
        use_case: str = FIELDS["use_case"].default,
    ):
        self.base_url, self.model_name, self.timeout = base_url.rstrip("/"), model_name, timeout
        self.use_case = load_use_case(use_case)
        self.session = requests.Session()  # keep-alive: one connection per client

    def url(self, version: int | None = None, suffix: str = "", label: str | None = None) -> str:
        """The model's path, for one `version` or `label` (`stable`, `canary`) or neither."""
        path = f"{self.base_url}/v1/models/{self.model_name}"
        if label is not None:
            return f"{path}/labels/{label}{suffix}"
        return path + (f"/versions/{version}" if version is not None else "") + suffix

    def _call(self, method: str, url: str, body: dict | None = None) -> dict:
        response = self.session.request(method, url, json=body, timeout=self.timeout)
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": response.text}
        if response.status_code != 200:
            raise ServingRequestError(response.status_code, payload.get("error", ""), url)
        return payload

    def status(self, version: int | None = None) -> list[dict]:
        """`model_version_status`: each version's state (AVAILABLE, LOADING, END) and error."""
        return self._call("GET", self.url(version))["model_version_status"]

    def serving_version(self, label: str | None = None) -> int | None:
        """The version that answers a request without a version (or with `label`), from its
        metadata; None while nothing answers (also while the server is not up yet)."""
        try:
            return int(self.metadata(label=label)["model_spec"]["version"])
        except (ServingRequestError, requests.ConnectionError):
            return None

    def metadata(self, version: int | None = None, label: str | None = None) -> dict:
        return self._call("GET", self.url(version, "/metadata", label))

    def predict(self, body: dict, version: int | None = None, label: str | None = None) -> dict:
        return self._call("POST", self.url(version, ":predict", label), body)

    def predict_examples(self, rows: list[dict[str, str]], version: int | None = None,
                         label: str | None = None) -> list:  # fmt: skip
        """The positive class's probability per row, sent as base64 serialized tf.Examples
        (the TFX convention)."""
        from pipelines.serving.samples import row_to_example

        instances = [
            {"b64": base64.b64encode(row_to_example(r, self.use_case)).decode()} for r in rows
        ]
        body = {"signature_name": SERVING_SIGNATURE, "instances": instances}
        return [p[0] for p in self.predict(body, version, label)["predictions"]]

    def predict_raw(self, rows: list[dict[str, str]], version: int | None = None) -> list:
        """The positive class's probability per row, sent as plain JSON values; every feature is
        sent, a missing optional one as "" or 0 (what the raw_features signature reads as
        missing)."""
        from pipelines.serving.samples import feature_types

        types = feature_types(self.use_case.schema_path)
        instances = []
        for row in rows:
            typed = _typed(row, self.use_case)
            for key, kind in types.items():
                if key != self.use_case.label_key and key not in typed:
                    typed[key] = "" if kind == schema_pb2.BYTES else 0
            instances.append(typed)
        body = {"signature_name": RAW_SIGNATURE, "instances": instances}
        return [p[0] for p in self.predict(body, version)["predictions"]]

    def classify(self, rows: list[dict[str, str]], version: int | None = None) -> list:
        """[[label, score], ...] per row."""
        body = {
            "signature_name": CLASSIFY_SIGNATURE,
            "examples": [_typed(r, self.use_case) for r in rows],
        }
        return self._call("POST", self.url(version, ":classify"), body)["results"]

    def regress(self, rows: list[dict[str, str]], version: int | None = None) -> list:
        """The positive class's probability per row through :regress (the `regress` signature)."""
        body = {
            "signature_name": REGRESS_SIGNATURE,
            "examples": [_typed(r, self.use_case) for r in rows],
        }
        return self._call("POST", self.url(version, ":regress"), body)["results"]
