"""A stand-in for the Kubeflow Pipelines API server, which cannot run here (no Kubernetes).

`FakeKfpApi` is a loopback HTTP server that records every request kfp.Client (SDK 2.5) makes,
with its Authorization header, and answers the minimal JSON of the v2beta1 REST API (healthz,
pipelines, uploads, experiments, runs, recurring runs and their enable/disable/delete). It
checks what our code sends, not KFP's behaviour. Used by
tests/pipelines/kubeflow/test_kfp_client.py and
tests/pipelines/kubeflow/test_ci_recipe.py.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API = "/apis/v2beta1"

SPEC = """\
pipelineInfo:
  name: taxi-tips
schemaVersion: 2.1.0
sdkVersion: tfx-1.16.0
deploymentSpec:
  executors: {}
components: {}
root:
  dag:
    tasks: {}
  inputDefinitions:
    parameters:
      span: {parameterType: NUMBER_INTEGER, defaultValue: -1}
      min_auc: {parameterType: NUMBER_DOUBLE, defaultValue: 0.75}
      data_root: {parameterType: STRING, defaultValue: s3://tfx-pipeline/data/taxi-trips}
      beam_args: {parameterType: STRING, defaultValue: '[]'}
---
platforms:
  kubernetes:
    deploymentSpec:
      executors: {}
"""


class FakeKfpApi:
    """Records (method, path, query, body) and keeps just enough state for the client's calls."""

    def __init__(self, healthz_status: int = 200, multi_user: bool = False) -> None:
        self.requests: list[tuple[str, str, dict, object]] = []
        self.authorization: list[str | None] = []  # each request's Authorization header
        self.healthz_status = healthz_status
        self.multi_user = multi_user  # then, as KFP 2.5: an experiment needs a namespace
        self.redirect_to: str | None = None  # healthz answers 302 to this URL (a login page)
        self.pipelines: dict[str, list[dict]] = {}  # display name -> versions
        self.uploads: list[bytes] = []  # the packages uploaded, in order
        self.recurring_runs: list[dict] = []
        self.refuse_recurring_run = False  # answer the next recurring-run creation with 500
        self.created = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def do_DELETE(self) -> None:
                self._answer("DELETE")

            def _answer(self, method: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body: object = json.loads(raw) if raw else None
                except ValueError:
                    body = raw  # multipart upload
                query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
                fake.requests.append((method, url.path, query, body))
                fake.authorization.append(self.headers.get("Authorization"))
                if isinstance(body, bytes):
                    fake.uploads.append(body)
                status, answer = fake.respond(method, url.path, query, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                if fake.redirect_to and url.path.endswith("/healthz"):
                    self.send_header("Location", fake.redirect_to)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        # A short poll interval makes shutdown() at teardown quick.
        serve = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        serve.start()

    def respond(self, method: str, path: str, query: dict, body: object) -> tuple[int, dict]:
        name = _filtered_name(query)
        if path == f"{API}/healthz":
            return (302 if self.redirect_to else self.healthz_status), {
                "multi_user": self.multi_user
            }
        if path == f"{API}/pipelines" and method == "GET":
            found = [{"pipeline_id": name, "display_name": name}] if name in self.pipelines else []
            return 200, {"pipelines": found}
        if path == f"{API}/pipelines/upload":
            pipeline = query["name"]
            self.pipelines[pipeline] = [{"pipeline_id": pipeline, "pipeline_version_id": "v0"}]
            return 200, {"pipeline_id": pipeline, "display_name": pipeline}
        if path == f"{API}/pipelines/upload_version":
            version = {"pipeline_id": query["pipelineid"], "pipeline_version_id": query["name"]}
            self.pipelines[query["pipelineid"]].append(version)
            return 200, version
        if path.startswith(f"{API}/pipelines/") and path.endswith("/versions"):
            versions = self.pipelines[path.split("/")[-2]]
            if name:
                versions = [v for v in versions if v["pipeline_version_id"] == name]
            return 200, {"pipeline_versions": versions}
        if path == f"{API}/experiments" and method == "POST" and self.multi_user:
            if not body.get("namespace"):  # apiserver/server/experiment_server.go, 2.5.0
                message = "An experiment cannot have an empty namespace in multi-user mode"
                return 400, {"error": message, "code": 3}
        if path == f"{API}/experiments":
            experiment = {"experiment_id": "exp-1", "display_name": "taxi-tips"}
            return 200, ({"experiments": []} if method == "GET" else experiment)
        if path == f"{API}/runs":
            return 200, {"run_id": "run-1"}
        if path == f"{API}/recurringruns" and method == "GET":
            same = [r for r in self.recurring_runs if r["display_name"] == name]
            return 200, {"recurringRuns": same}  # sic: that field is camelCase in the API
        if path == f"{API}/recurringruns":
            if self.refuse_recurring_run:
                self.refuse_recurring_run = False
                return 500, {"error": "stand-in refuses", "code": 13}
            self.created += 1
            self.recurring_runs.append({**body, "recurring_run_id": f"job-{self.created}"})
            return 200, self.recurring_runs[-1]
        job_id, _, action = path.removeprefix(f"{API}/recurringruns/").partition(":")
        job = self.recurring_run(job_id) if path.startswith(f"{API}/recurringruns/") else None
        if job is not None and action in ("enable", "disable") and method == "POST":
            job["mode"] = action.upper()
            return 200, {}
        if job is not None and not action and method == "DELETE":
            self.recurring_runs.remove(job)
            return 200, {}
        return 404, {"error": "not found", "code": 5}

    def recurring_run(self, job_id: str) -> dict | None:
        return next((r for r in self.recurring_runs if r["recurring_run_id"] == job_id), None)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def paths(self) -> list[str]:
        return [f"{method} {path}" for method, path, _, _ in self.requests]

    def bodies(self, method: str, path: str) -> list:
        return [body for m, p, _, body in self.requests if (m, p) == (method, path)]


def _filtered_name(query: dict) -> str | None:
    if "filter" not in query:
        return None
    return json.loads(query["filter"])["predicates"][0]["stringValue"]
