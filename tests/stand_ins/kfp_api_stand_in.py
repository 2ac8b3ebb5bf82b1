"""A stand-in for the Kubeflow Pipelines API server (v2beta1 REST), which cannot run here (no
Kubernetes).

`FakeKfpApi` is a loopback HTTP server that records every request kfp.Client (SDK 2.5) makes,
with its Authorization header, and answers as the API server at `version` (2.5.0, 2.16.1 or
2.17.0) does for the calls this project makes, with the rules in kfp_api_rules.py:
- healthz; pipelines listed by display name; an upload validated as a spec (template.New), a
  name that exists refused with 409 (pipelines are unique per name and namespace, versions per
  pipeline: pipeline_store.go), an unknown pipeline id refused with 400;
- experiments kept, listed by display name in their namespace (so kfp.Client reuses one by
  name), a duplicate name refused with 409, no namespace in multi-user mode refused with 400
  for the list and the creation (experiment_server.go canAccessExperiment);
- runs and recurring runs: the experiment and the pipeline version must exist (else 404 / 500),
  the parameters pass validatePipelineJobInputs; recurring runs also toModelJob's checks (max
  concurrency 1-10, a cron robfig/cron v1.2.0 parses, an interval of at least 1 s); listed by
  experiment and display name; enable, disable and delete by id (404 if unknown);
- errors in the gateway's shape of that version (kfp_api_rules.error_body) and the upload
  handler's; an empty list is `{}` (EmitDefaults off), as the server writes it.
Not played, so refused where a request would need it: filters other than display_name EQUALS
(400), pagination (one page), the Kubernetes-native pipeline store, authorization reviews,
run state. Used by tests/pipelines/kubeflow/test_kfp_client.py and test_ci_recipe.py.
"""

from __future__ import annotations

import itertools
import json
import threading
import urllib.parse
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

from tests.stand_ins import kfp_api_rules as rules

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
INVALID, NOT_FOUND, ALREADY_EXISTS, INTERNAL = 3, 5, 6, 13
_HTTP = {INVALID: 400, NOT_FOUND: 404, ALREADY_EXISTS: 409, INTERNAL: 500}


class _Refused(Exception):
    def __init__(self, code: int, message: str, detail: str | None = None):
        super().__init__(message)
        self.code, self.message, self.detail = code, message, detail or message


class FakeKfpApi:
    """Records (method, path, query, body) and keeps the state the client's calls touch."""

    def __init__(self, healthz_status: int = 200, multi_user: bool = False,
                 version: str = "2.5.0") -> None:  # fmt: skip
        self.version = version
        self.requests: list[tuple[str, str, dict, object]] = []
        self.authorization: list[str | None] = []  # each request's Authorization header
        self.healthz_status = healthz_status
        self.multi_user = multi_user  # then an experiment needs a namespace
        self.redirect_to: str | None = None  # healthz answers 302 to this URL (a login page)
        self.pipelines: dict[str, dict] = {}  # id -> {display_name, namespace, versions}
        self.uploads: list[bytes] = []  # the packages uploaded, in order
        self.experiments: dict[str, dict] = {}  # id -> {display_name, namespace}
        self.runs: list[dict] = []
        self.recurring_runs: list[dict] = []
        self.refuse_recurring_run = False  # answer the next recurring-run creation with 500
        self._ids = itertools.count(1)
        self._jobs = itertools.count(1)
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
                content_type = self.headers.get("Content-Type", "")
                body: object = None
                if content_type.startswith("multipart/form-data"):
                    body = _upload(content_type, raw)
                    fake.uploads.append(raw)
                elif raw:
                    body = json.loads(raw)
                query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
                fake.requests.append((method, url.path, query, body))
                fake.authorization.append(self.headers.get("Authorization"))
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

    # -- routing -------------------------------------------------------------------------------

    def respond(self, method: str, path: str, query: dict, body) -> tuple[int, dict]:
        if path == f"{API}/healthz":
            return (302 if self.redirect_to else self.healthz_status), {
                "multi_user": self.multi_user
            }
        if path in (f"{API}/pipelines/upload", f"{API}/pipelines/upload_version"):
            return self._upload(path.endswith("upload_version"), query, body)
        try:
            return 200, self._call(method, path, query, body)
        except _Refused as refused:
            return _HTTP[refused.code], rules.error_body(
                self.version, refused.code, refused.message, refused.detail
            )

    def _call(self, method: str, path: str, query: dict, body) -> dict:
        route = path.removeprefix(API)
        if route == "/pipelines" and method == "GET":
            name = _filtered_name(query)
            return _listed("pipelines", [
                {"pipeline_id": pid, "display_name": p["display_name"]}
                for pid, p in self.pipelines.items() if name in (None, p["display_name"])
            ])  # fmt: skip
        if route.startswith("/pipelines/") and route.endswith("/versions") and method == "GET":
            pipeline = self.pipelines.get(route.split("/")[2])
            if pipeline is None:
                raise _Refused(NOT_FOUND, f"Pipeline {route.split('/')[2]} not found")
            name = _filtered_name(query)
            versions = [v for v in pipeline["versions"] if name in (None, v["display_name"])]
            if query.get("sort_by") == "created_at desc":
                versions = versions[::-1]
            return _listed("pipeline_versions", [_public(v) for v in versions])
        if route == "/experiments":
            return self._experiments(method, query, body)
        if route == "/runs" and method == "POST":
            self._check_job(body, "Failed to create a new run", "Failed to generate the "
                            "ExecutionSpec", "Failed to create a run due to error fetching "
                            "manifest")  # fmt: skip
            run = {**body, "run_id": f"run-{len(self.runs) + 1}"}
            self.runs.append(run)
            return run
        if route == "/recurringruns":
            return self._recurring_runs(method, query, body)
        if route.startswith("/recurringruns/"):
            job_id, _, action = route.removeprefix("/recurringruns/").partition(":")
            job = self.recurring_run(job_id)
            if job is None:
                raise _Refused(NOT_FOUND, f"Failed to {action or 'delete'} a recurring run: "
                               f"ResourceNotFoundError: Job {job_id} not found",
                               f"Job {job_id} not found")  # fmt: skip
            if action in ("enable", "disable") and method == "POST":
                job["mode"] = action.upper()
                job["status"] = "ENABLED" if action == "enable" else "DISABLED"
                return {}
            if not action and method == "DELETE":
                self.recurring_runs.remove(job)
                return {}
        raise _Refused(NOT_FOUND, f"{method} {path} is not served by the stand-in")

    # -- pipelines -----------------------------------------------------------------------------

    def _upload(self, version_upload: bool, query: dict, upload) -> tuple[int, dict]:
        """pipeline_upload_server.go uploadPipeline / uploadPipelineVersion."""
        what = "a pipeline version" if version_upload else "a pipeline and a pipeline version"
        newer = rules.at_least(self.version, "2.16.0")
        if not isinstance(upload, bytes):
            return 400, rules.upload_error(
                f"Failed to create {what}"
                if newer
                else "Failed to read pipeline from file: no uploadfile"
            )
        try:
            spec = rules.validate_spec(list(yaml.safe_load_all(upload)))
        except (rules.InvalidInput, yaml.YAMLError) as error:
            # Refused by the resource manager: 500 until 2.17.0 answers 400 with the reason.
            if rules.at_least(self.version, "2.17.0"):
                return 400, rules.upload_error(str(error))
            return 500, rules.upload_error(f"Failed to create {what}" + ("" if newer else
                                                                        f": {error}"))  # fmt: skip
        name = query.get("name") or spec["pipelineInfo"]["name"]
        if version_upload:
            pipeline = self.pipelines.get(query.get("pipelineid", ""))
            if pipeline is None:
                return 400, rules.upload_error(
                    "Failed to create a pipeline version" if newer else "Failed to create a "
                    "pipeline version due to error reading namespace: Failed to get namespace "
                    f"for pipeline id {query.get('pipelineid')}")  # fmt: skip
            if any(v["display_name"] == name for v in pipeline["versions"]):
                return 409, rules.upload_error(
                    "Failed to create a pipeline version"
                    if newer
                    else "Failed to create a "
                    "pipeline version. The pipeline already exists.: Failed to create pipeline "
                    "version in PipelineStore: Already exist error: Failed to create a new "
                    f"pipeline version. The name {name} already exist. Specify a new name"
                )
            version = self._version(query["pipelineid"], name, spec)
            return 200, _public(version)
        if any(p["display_name"] == name and p["namespace"] == "" for p in self.pipelines.values()):
            return 409, rules.upload_error(
                f"Failed to create {what}" if newer else f"Failed to create {what}. The "
                f"pipeline already exists.: Failed to create {what}: Already exist error: Failed "
                f"to create a new pipeline. The name {name} already exists. Please specify a "
                "new name")  # fmt: skip
        pipeline_id = f"pipeline-{next(self._ids)}"
        self.pipelines[pipeline_id] = {"display_name": name, "namespace": "", "versions": []}
        self._version(pipeline_id, name, spec)
        return 200, {"pipeline_id": pipeline_id, "display_name": name}

    def _version(self, pipeline_id: str, name: str, spec: dict) -> dict:
        version = {"pipeline_id": pipeline_id, "pipeline_version_id": f"version-{next(self._ids)}",
                   "display_name": name, "spec": spec}  # fmt: skip
        self.pipelines[pipeline_id]["versions"].append(version)
        return version

    def _spec_of(self, reference: dict) -> dict | None:
        pipeline = self.pipelines.get(reference.get("pipeline_id", ""))
        for version in pipeline["versions"] if pipeline else []:
            if version["pipeline_version_id"] == reference.get("pipeline_version_id"):
                return version["spec"]
        return None

    # -- experiments ---------------------------------------------------------------------------

    def _namespace(self, namespace: str | None, prefix: str) -> str:
        """resource_manager.go ReplaceNamespace; experiment_server.go canAccessExperiment."""
        if not self.multi_user:
            return ""
        if namespace in (None, "", "-"):
            detail = "An experiment cannot have an empty namespace in multi-user mode"
            raise _Refused(INVALID, f"{prefix}: Invalid input error: {detail}", detail)
        return namespace

    def _experiments(self, method: str, query: dict, body) -> dict:
        if method == "GET":
            namespace = self._namespace(query.get("namespace"), "List experiments failed: "
                                        "Failed to authorize with API")  # fmt: skip
            name = _filtered_name(query)
            return _listed("experiments", [
                {"experiment_id": eid, **e} for eid, e in self.experiments.items()
                if e["namespace"] == namespace and name in (None, e["display_name"])
            ])  # fmt: skip
        namespace = self._namespace(body.get("namespace"), "Failed to create a experiment: "
                                    "Failed to authorize the request")  # fmt: skip
        name = body.get("display_name", "")
        if any(e == {"display_name": name, "namespace": namespace}
               for e in self.experiments.values()):  # fmt: skip
            detail = (f"Failed to create a new experiment. The name {name} already exists. "
                      "Please specify a new name")  # fmt: skip
            raise _Refused(ALREADY_EXISTS, "Failed to create a experiment: Already exist "
                           f"error: {detail}", detail)  # fmt: skip
        experiment_id = f"exp-{len(self.experiments) + 1}"
        self.experiments[experiment_id] = {"display_name": name, "namespace": namespace}
        return {"experiment_id": experiment_id, **self.experiments[experiment_id]}

    # -- runs and recurring runs ---------------------------------------------------------------

    def _check_job(self, body: dict, *prefixes: str) -> None:
        """The checks a run and a recurring run share: experiment, version, parameters."""
        first, second, manifest = prefixes
        if body.get("experiment_id") not in self.experiments:
            detail = f"Experiment {body.get('experiment_id')} not found"
            raise _Refused(NOT_FOUND, f"{first}: ResourceNotFoundError: {detail}", detail)
        spec = self._spec_of(body.get("pipeline_version_reference") or {})
        if spec is None:
            raise _Refused(INTERNAL, f"{first}: InternalServerError: {manifest}",
                           "Internal Server Error")  # fmt: skip
        parameters = (body.get("runtime_config") or {}).get("parameters") or {}
        try:
            rules.validate_job_inputs(spec, parameters, self.version)
        except rules.InvalidInput as error:
            raise _Refused(INVALID, f"{first}: {second}: invalid pipeline job inputs: Invalid "
                           f"input error: {error}", str(error)) from None  # fmt: skip

    def _recurring_runs(self, method: str, query: dict, body) -> dict:
        if method == "GET":
            name = _filtered_name(query)
            experiment = query.get("experiment_id")
            return _listed("recurringRuns", [  # sic: camelCase in the proto
                r for r in self.recurring_runs
                if name in (None, r["display_name"]) and experiment in (None, r["experiment_id"])
            ])  # fmt: skip
        if self.refuse_recurring_run:
            self.refuse_recurring_run = False
            raise _Refused(INTERNAL, "stand-in refuses", "Internal Server Error")
        try:
            rules.check_recurring_run(body)
        except rules.InvalidInput as error:
            raise _Refused(INVALID, "Failed to create a recurring run due to conversion error: "
                           f"Invalid input error: {error}", str(error)) from None  # fmt: skip
        self._check_job(body, "Failed to create a recurring run", "Failed to create a recurring "
                        "run during scheduled workflow creation", "Failed to create a recurring "
                        "run with an invalid pipeline spec manifest")  # fmt: skip
        job = {**body, "recurring_run_id": f"job-{next(self._jobs)}",
               "status": "ENABLED" if body.get("mode") == "ENABLE" else "DISABLED"}  # fmt: skip
        self.recurring_runs.append(job)
        return job

    # -- for tests -----------------------------------------------------------------------------

    def add_recurring_run(self, name: str, mode: str = "ENABLE", parameters: dict | None = None,
                          experiment: str = "taxi-tips") -> dict:  # fmt: skip
        """A recurring run made earlier (by someone else, or an older deploy), in `experiment`."""
        experiment_id = next((eid for eid, e in self.experiments.items()
                              if e["display_name"] == experiment), None)  # fmt: skip
        if experiment_id is None:
            experiment_id = f"exp-{len(self.experiments) + 1}"
            self.experiments[experiment_id] = {"display_name": experiment, "namespace": ""}
        job = {"recurring_run_id": f"job-{next(self._jobs)}", "display_name": name,
               "experiment_id": experiment_id, "mode": mode,
               "runtime_config": {"parameters": parameters or {}}}  # fmt: skip
        self.recurring_runs.append(job)
        return job

    def recurring_run(self, job_id: str) -> dict | None:
        return next((r for r in self.recurring_runs if r["recurring_run_id"] == job_id), None)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def paths(self) -> list[str]:
        return [f"{method} {path}" for method, path, _, _ in self.requests]

    def bodies(self, method: str, path: str) -> list:
        return [body for m, p, _, body in self.requests if (m, p) == (method, path)]


def _public(version: dict) -> dict:
    return {k: v for k, v in version.items() if k != "spec"}


def _listed(field: str, items: list) -> dict:
    """EmitDefaults/EmitUnpopulated off: an empty list is `{}`."""
    return {field: items, "total_size": len(items)} if items else {}


def _filtered_name(query: dict) -> str | None:
    """The display_name EQUALS predicate the SDK and this project send; any other filter is
    refused rather than ignored."""
    if "filter" not in query:
        return None
    predicates = json.loads(query["filter"]).get("predicates", [])
    if (len(predicates) != 1 or predicates[0].get("key") != "display_name"
            or predicates[0].get("operation") not in (1, "EQUALS")):  # fmt: skip
        raise _Refused(INVALID, f"the stand-in plays only a display_name EQUALS filter: {query}")
    return predicates[0].get("stringValue", predicates[0].get("string_value"))


def _upload(content_type: str, raw: bytes) -> bytes | None:
    """The `uploadfile` part of a multipart upload."""
    message = BytesParser(policy=HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + raw
    )
    for part in message.iter_parts():
        if part.get_param("name", header="content-disposition") == "uploadfile":
            return part.get_payload(decode=True)
    return None
