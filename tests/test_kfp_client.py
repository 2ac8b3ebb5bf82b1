"""Tests of pipelines/kfp_client.py: cron normalization, endpoint checks, submit/schedule/pause.

`FakeKfpApi` is a stand-in for the KFP API server, which cannot run here (no Kubernetes): a
loopback HTTP server that records every request kfp.Client makes and answers the minimal JSON of
the v2beta1 REST API (healthz, pipelines, uploads, experiments, runs, recurring runs). It checks
what our code sends (and that nothing is sent when a local check fails), not KFP's behaviour.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import kfp
import pytest

from pipelines import kfp_client
from pipelines.errors import ActionableError
from pipelines.kfp_client import KubeflowError

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

    def __init__(self, healthz_status: int = 200) -> None:
        self.requests: list[tuple[str, str, dict, object]] = []
        self.healthz_status = healthz_status
        self.pipelines: dict[str, list[dict]] = {}  # display name -> versions
        self.recurring_runs: list[dict] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep pytest output clean
                pass

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def _answer(self, method: str) -> None:
                url = urllib.parse.urlsplit(self.path)
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body: object = json.loads(raw) if raw else None
                except ValueError:
                    body = raw  # multipart upload
                query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
                fake.requests.append((method, url.path, query, body))
                status, answer = fake.respond(method, url.path, query, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
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
            return self.healthz_status, {"multi_user": False}
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
        if path == f"{API}/experiments":
            experiment = {"experiment_id": "exp-1", "display_name": "taxi-tips"}
            return 200, ({"experiments": []} if method == "GET" else experiment)
        if path == f"{API}/runs":
            return 200, {"run_id": "run-1"}
        if path == f"{API}/recurringruns" and method == "GET":
            same = [r for r in self.recurring_runs if r["display_name"] == name]
            return 200, {"recurringRuns": same}  # sic: that field is camelCase in the API
        if path == f"{API}/recurringruns":
            self.recurring_runs.append({**body, "recurring_run_id": "job-1"})
            return 200, self.recurring_runs[-1]
        if path in (f"{API}/recurringruns/job-1:enable", f"{API}/recurringruns/job-1:disable"):
            return 200, {}
        return 404, {"error": "not found", "code": 5}

    def paths(self) -> list[str]:
        return [f"{method} {path}" for method, path, _, _ in self.requests]

    def bodies(self, method: str, path: str) -> list:
        return [body for m, p, _, body in self.requests if (m, p) == (method, path)]


def _filtered_name(query: dict) -> str | None:
    if "filter" not in query:
        return None
    return json.loads(query["filter"])["predicates"][0]["stringValue"]


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch, tmp_path):
    # kfp.Client reads (and may write) a context file under ~/.config/kfp; keep it in tmp_path.
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    fake = FakeKfpApi()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture
def package(tmp_path) -> str:
    path = tmp_path / "pipeline.yaml"
    path.write_text(SPEC)
    return str(path)


# ----------------------------------------------------------------------------- normalize_cron


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("0 2 * * *", "0 0 2 * * *"),
        ("30 0 2 * * *", "30 0 2 * * *"),
        ("*/15 9-17 * JAN-MAR,dec MON-FRI", "0 */15 9-17 * JAN-MAR,dec MON-FRI"),
        ("0 0 12 ? * sun", "0 0 12 ? * sun"),
        ("5/10 0-23/2 1,15 * ?", "0 5/10 0-23/2 1,15 * ?"),
        ("  0   2 * * 0 ", "0 0 2 * * 0"),
    ],
)
def test_normalize_cron_accepts_5_and_6_fields(expression: str, expected: str) -> None:
    assert kfp_client.normalize_cron(expression) == expected


@pytest.mark.parametrize(
    ("expression", "field"),
    [
        ("61 * * * *", "minute field '61'"),
        ("0 24 * * *", "hour field '24'"),
        ("0 2 0 * *", "day-of-month field '0'"),
        ("0 2 * 13 *", "month field '13'"),
        ("0 2 * * 7", "day-of-week field '7'"),
        ("0 2 * * MON-XYZ", "day-of-week field 'MON-XYZ'"),
        ("60 0 2 * * *", "second field '60'"),
        ("*/0 * * * *", "minute field '*/0'"),
        ("0 5-2 * * *", "hour field '5-2'"),
        ("1,,2 * * * *", "minute field '1,,2'"),
        ("? 2 * * *", "minute field '?'"),
        ("0 2 * JANUARY *", "month field 'JANUARY'"),
        ("0 2 * * *,", "day-of-week field '*,'"),
        ("0 2 * *", "4 fields"),
        ("@daily", "1 fields"),
    ],
)
def test_normalize_cron_names_the_bad_field(expression: str, field: str) -> None:
    with pytest.raises(KubeflowError) as raised:
        kfp_client.normalize_cron(expression)
    assert field in str(raised.value)
    assert '"0 2 * * *" (nightly at 02:00)' in str(raised.value)
    assert isinstance(raised.value, ActionableError)


# ----------------------------------------------------------------------------- check_endpoint


def test_check_endpoint_closed_port_fails_fast_and_says_what_to_do() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(KubeflowError) as raised:
        kfp_client.check_endpoint(f"http://127.0.0.1:{port}", timeout_s=3)
    assert time.monotonic() - started < 10
    message = str(raised.value)
    assert f"http://127.0.0.1:{port}" in message
    assert "kubectl port-forward -n kubeflow svc/ml-pipeline-ui 8080:80" in message
    assert "KFP_ENDPOINT" in message


def test_check_endpoint_accepts_a_healthy_server(api: FakeKfpApi) -> None:
    kfp_client.check_endpoint(api.endpoint + "/")
    assert api.paths() == [f"GET {API}/healthz"]


def test_check_endpoint_rejects_an_error_status_and_a_missing_scheme(api: FakeKfpApi) -> None:
    api.healthz_status = 503
    with pytest.raises(KubeflowError, match="gave 503"):
        kfp_client.check_endpoint(api.endpoint)
    with pytest.raises(KubeflowError, match="needs a scheme"):
        kfp_client.check_endpoint(api.endpoint.removeprefix("http://"))


# ----------------------------------------------------------------------------- local checks first


def test_unknown_parameter_fails_after_healthz_only(api: FakeKfpApi, package: str) -> None:
    with pytest.raises(KubeflowError) as raised:
        kfp_client.submit(api.endpoint, package, {"spn": "3"})
    assert "['spn']" in str(raised.value)
    assert "['beam_args', 'data_root', 'min_auc', 'span']" in str(raised.value)
    with pytest.raises(KubeflowError, match="span='three' is not a valid NUMBER_INTEGER"):
        kfp_client.schedule(api.endpoint, package, "0 2 * * *", {"span": "three"})
    assert api.paths() == [f"GET {API}/healthz"] * 2


def test_parameter_breaking_a_pipeline_rule_is_refused_before_submitting(
    api: FakeKfpApi, package: str
) -> None:
    with pytest.raises(KubeflowError, match=r"min_auc must be between 0 and 1, got 5\.0"):
        kfp_client.submit(api.endpoint, package, {"min_auc": "5", "span": "0"})
    with pytest.raises(KubeflowError, match="span must be -1"):
        kfp_client.schedule(api.endpoint, package, "0 2 * * *", {"span": "-4"})
    with pytest.raises(KubeflowError, match="beam_args must be Beam options"):
        kfp_client.submit(api.endpoint, package, {"beam_args": '["direct_num_workers=2"]'})
    assert api.paths() == [f"GET {API}/healthz"] * 3


def test_bad_cron_fails_before_any_request(api: FakeKfpApi, package: str) -> None:
    with pytest.raises(KubeflowError, match="hour field '25'"):
        kfp_client.schedule(api.endpoint, package, "0 25 * * *", {})
    assert api.requests == []


def test_not_a_spec_is_named(api: FakeKfpApi, tmp_path) -> None:
    missing = str(tmp_path / "nothing.yaml")
    with pytest.raises(KubeflowError, match="nothing.yaml is not a compiled pipeline spec"):
        kfp_client.submit(api.endpoint, missing, {"span": "3"})


# ----------------------------------------------------------------------------- success paths


def test_submit_uploads_once_and_starts_a_run_with_typed_parameters(
    api: FakeKfpApi, package: str
) -> None:
    params = {"span": "3", "min_auc": "0.8", "beam_args": '["--direct_num_workers=2"]'}
    assert kfp_client.submit(api.endpoint, package, params) == "run-1"
    (run,) = api.bodies("POST", f"{API}/runs")
    assert run["runtime_config"]["parameters"] == {
        "span": 3,
        "min_auc": 0.8,
        "beam_args": '["--direct_num_workers=2"]',
    }
    assert run["pipeline_version_reference"] == {
        "pipeline_id": "taxi-tips",
        "pipeline_version_id": "v0",
    }
    assert run["experiment_id"] == "exp-1"
    assert run["display_name"].startswith("taxi-tips ")
    assert "pipeline_spec" not in run  # the run uses the uploaded version, as a UI run would

    # The same package again reuses the pipeline; a first version under the hash name is added once.
    kfp_client.submit(api.endpoint, package, {})
    kfp_client.submit(api.endpoint, package, {})
    assert api.paths().count(f"POST {API}/pipelines/upload") == 1
    assert api.paths().count(f"POST {API}/pipelines/upload_version") == 1
    assert len(api.bodies("POST", f"{API}/runs")) == 3


def test_schedule_creates_a_single_concurrency_no_catchup_cron_job(
    api: FakeKfpApi, package: str
) -> None:
    job_id = kfp_client.schedule(
        api.endpoint, package, "0 2 * * *", {"span": "-1"}, job_name="nightly"
    )
    assert job_id == "job-1"
    (job,) = api.bodies("POST", f"{API}/recurringruns")
    assert int(job["max_concurrency"]) == 1
    assert job["no_catchup"] is True
    assert job["trigger"] == {"cron_schedule": {"cron": "0 0 2 * * *"}}
    assert job["mode"] == "ENABLE"
    assert job["display_name"] == "nightly"
    assert job["runtime_config"]["parameters"] == {"span": -1}
    assert job["pipeline_version_reference"]["pipeline_id"] == "taxi-tips"
    assert api.requests[0][1] == f"{API}/healthz"

    with pytest.raises(KubeflowError, match="'nightly' already exists .*id job-1"):
        kfp_client.schedule(api.endpoint, package, "0 3 * * *", {}, job_name="nightly")
    assert len(api.bodies("POST", f"{API}/recurringruns")) == 1


def test_pause_and_resume(api: FakeKfpApi) -> None:
    kfp_client.pause(api.endpoint, "job-1")
    kfp_client.resume(api.endpoint, "job-1")
    # healthz twice per call: our check, then kfp.Client's own (single-user detection)
    assert api.paths() == [
        f"GET {API}/healthz",
        f"GET {API}/healthz",
        f"POST {API}/recurringruns/job-1:disable",
        f"GET {API}/healthz",
        f"GET {API}/healthz",
        f"POST {API}/recurringruns/job-1:enable",
    ]
    with pytest.raises(KubeflowError, match="pausing recurring run nope: HTTP 404"):
        kfp_client.pause(api.endpoint, "nope")
