"""Tests of pipelines/kubeflow/kfp_client.py: cron normalization, endpoint checks,
submit/schedule/pause.

The KFP API server cannot run here (no Kubernetes): tests/stand_ins/kfp_api_stand_in.py stands in
for it, with the server's own rules (kfp_api_rules.py) for KFP 2.5.0, 2.16.1 and 2.17.0. These
tests check what our code sends (and that nothing is sent when a local check fails), and show
each rule the stand-in plays refusing what the server would refuse.
"""

from __future__ import annotations

import json
import re
import socket
import time

import kfp
import kfp_server_api
import pytest
import yaml

from components.base.errors import ActionableError
from pipelines.kubeflow import kfp_client
from pipelines.kubeflow.kfp_client import KubeflowError
from tests.stand_ins.kfp_api_stand_in import API, SPEC, FakeKfpApi


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch, tmp_path):
    # kfp.Client reads (and may write) a context file under ~/.config/kfp; keep it in tmp_path.
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    fake = FakeKfpApi()
    yield fake
    fake.close()


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
    ((pipeline_id, pipeline),) = api.pipelines.items()
    assert pipeline["display_name"] == "taxi-tips"  # named as compiled
    assert run["pipeline_version_reference"] == {
        "pipeline_id": pipeline_id,
        "pipeline_version_id": pipeline["versions"][0]["pipeline_version_id"],
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
    pipeline = api.pipelines[job["pipeline_version_reference"]["pipeline_id"]]
    assert pipeline["display_name"] == "taxi-tips"
    assert api.requests[0][1] == f"{API}/healthz"

    with pytest.raises(KubeflowError, match="'nightly' already exists .*id job-1.*--replace"):
        kfp_client.schedule(api.endpoint, package, "0 3 * * *", {}, job_name="nightly")
    assert len(api.bodies("POST", f"{API}/recurringruns")) == 1


def test_schedule_replace_moves_the_recurring_run_without_two_ever_enabled(
    api: FakeKfpApi, package: str, tmp_path
) -> None:
    kfp_client.schedule(api.endpoint, package, "0 2 * * *", {}, job_name="nightly")
    newer = tmp_path / "newer.yaml"  # a new commit's spec: another pipeline version
    newer.write_text(SPEC.replace("sdkVersion: tfx-1.16.0", "sdkVersion: tfx-1.16.0\n# new"))
    del api.requests[:]

    job_id = kfp_client.schedule(
        api.endpoint, str(newer), "0 3 * * *", {}, job_name="nightly", replace=True
    )
    assert job_id == "job-2"
    changes = [p for p in api.paths() if p.startswith(("POST", "DELETE"))]
    assert changes[-3:] == [
        f"POST {API}/recurringruns/job-1:disable",  # the old one stops first ...
        f"POST {API}/recurringruns",  # ... the new one starts ...
        f"DELETE {API}/recurringruns/job-1",  # ... and the old one goes
    ]
    (job,) = api.recurring_runs
    assert (job["recurring_run_id"], job["mode"], job["display_name"]) == ("job-2", "ENABLE",
                                                                           "nightly")  # fmt: skip
    assert job["trigger"] == {"cron_schedule": {"cron": "0 0 3 * * *"}}
    reference = job["pipeline_version_reference"]
    (version,) = [v for v in api.pipelines[reference["pipeline_id"]]["versions"]
                  if v["pipeline_version_id"] == reference["pipeline_version_id"]]  # fmt: skip
    assert version["display_name"].startswith("taxi-tips-")  # the new upload, not the first


def test_schedule_replace_that_fails_to_create_resumes_the_old_one(
    api: FakeKfpApi, package: str
) -> None:
    kfp_client.schedule(api.endpoint, package, "0 2 * * *", {}, job_name="nightly")
    api.refuse_recurring_run = True
    with pytest.raises(KubeflowError, match="scheduling .* HTTP 500"):
        kfp_client.schedule(api.endpoint, package, "0 3 * * *", {}, job_name="nightly",
                            replace=True)  # fmt: skip
    (job,) = api.recurring_runs
    assert (job["recurring_run_id"], job["mode"]) == ("job-1", "ENABLE")
    assert api.paths()[-2:] == [
        f"POST {API}/recurringruns",
        f"POST {API}/recurringruns/job-1:enable",
    ]


def test_the_newest_version_is_always_the_package_submitted_last(
    api: FakeKfpApi, package: str, tmp_path
) -> None:
    """What `tkp watch --endpoint` and the UI's Create run take: a revert (A, B, A) runs A."""
    other = tmp_path / "other.yaml"
    other.write_text(SPEC.replace("defaultValue: 0.75", "defaultValue: 0.8"))
    for sent in (package, str(other), package, str(other), str(other)):
        kfp_client.submit(api.endpoint, sent, {})
        ((pipeline_id, pipeline),) = api.pipelines.items()
        newest = pipeline["versions"][-1]
        assert newest["spec"]["root"] == yaml.safe_load(open(sent).read().split("---")[0])["root"]
        assert api.bodies("POST", f"{API}/runs")[-1]["pipeline_version_reference"] == {
            "pipeline_id": pipeline_id, "pipeline_version_id": newest["pipeline_version_id"],
        }  # fmt: skip
    # A, B, A (its hash name is new), B again (its hash name is taken: the time is added), B.
    names = [version["display_name"] for version in pipeline["versions"]]
    assert len(names) == 4 and names[0] == "taxi-tips"
    assert re.fullmatch(rf"{names[1]}-\d{{8}}-\d{{6}}", names[3]), names

    # A run of the newest version, no package: as the watcher submits one span.
    run_id = kfp_client.submit_newest(
        api.endpoint, "taxi-tips", {"span": 3, "data_root": "s3://b/d"}
    )
    run = api.bodies("POST", f"{API}/runs")[-1]
    assert run_id == "run-6"  # the stand-in numbers the runs it created
    assert run["pipeline_version_reference"]["pipeline_version_id"] == newest["pipeline_version_id"]
    assert run["runtime_config"]["parameters"] == {"span": 3, "data_root": "s3://b/d"}
    sent = len(api.requests)
    with pytest.raises(KubeflowError, match="span must be -1"):
        kfp_client.submit_newest(api.endpoint, "taxi-tips", {"span": -4})
    assert len(api.requests) == sent  # refused before any request
    with pytest.raises(KubeflowError, match="no pipeline 'image-classes' .* `make submit`"):
        kfp_client.submit_newest(api.endpoint, "image-classes", {"span": 0})
    assert len(api.bodies("POST", f"{API}/runs")) == 6


def test_a_projected_service_account_token_is_read_at_each_client(
    api: FakeKfpApi, package: str, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """The CronJob's token: a file the kubelet rotates (kubeflow/watch-cronjob.yaml)."""
    token = tmp_path / "token"
    token.write_text("projected-1\n")
    monkeypatch.delenv("KFP_TOKEN", raising=False)
    monkeypatch.setenv(kfp_client.TOKEN_PATH_ENV, str(token))
    kfp_client.submit(api.endpoint, package, {})
    assert set(api.authorization) == {"Bearer projected-1"}
    token.write_text("projected-2\n")  # rotated
    del api.authorization[:]
    kfp_client.submit_newest(api.endpoint, "taxi-tips", {})
    assert set(api.authorization) == {"Bearer projected-2"}
    api.healthz_status = 401
    with pytest.raises(KubeflowError, match=f"the token in {token} was sent but not accepted"):
        kfp_client.submit(api.endpoint, package, {})
    monkeypatch.setenv("KFP_TOKEN", "from-ci")  # KFP_TOKEN wins over the file
    with pytest.raises(KubeflowError, match="KFP_TOKEN was sent but not accepted"):
        kfp_client.submit(api.endpoint, package, {})
    monkeypatch.delenv("KFP_TOKEN")
    token.unlink()
    with pytest.raises(KubeflowError, match=f"KF_PIPELINES_SA_TOKEN_PATH={token}: cannot read"):
        kfp_client.submit(api.endpoint, package, {})


def test_a_token_goes_with_every_request_and_a_refusal_says_what_to_set(
    api: FakeKfpApi, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    api.healthz_status = 401
    with pytest.raises(KubeflowError, match="HTTP 401.*set KFP_TOKEN"):
        kfp_client.submit(api.endpoint, package, {})
    monkeypatch.setenv("KFP_TOKEN", "s3cr3t-token")
    with pytest.raises(KubeflowError, match="KFP_TOKEN was sent but not accepted") as refused:
        kfp_client.submit(api.endpoint, package, {})
    assert "s3cr3t-token" not in str(refused.value)

    api.healthz_status = 200
    del api.authorization[:]
    kfp_client.submit(api.endpoint, package, {})
    assert len(api.authorization) > 4
    assert set(api.authorization) == {"Bearer s3cr3t-token"}


def test_pause_and_resume(api: FakeKfpApi) -> None:
    api.add_recurring_run("n")  # job-1
    kfp_client.pause(api.endpoint, "job-1")
    assert api.recurring_run("job-1")["mode"] == "DISABLE"
    kfp_client.resume(api.endpoint, "job-1")
    assert api.recurring_run("job-1")["mode"] == "ENABLE"
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


def test_the_token_does_not_follow_a_redirect_to_a_login_page(
    api: FakeKfpApi, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    login_page = FakeKfpApi()
    try:
        api.redirect_to = f"{login_page.endpoint}/dex/auth"
        monkeypatch.setenv("KFP_TOKEN", "s3cr3t-token")
        with pytest.raises(KubeflowError, match=r"redirected \(HTTP 302\).*https://HOST/pipeline"):
            kfp_client.submit(api.endpoint, package, {})
        assert login_page.requests == []  # neither the token nor anything else went there
    finally:
        login_page.close()


def test_multi_user_kubeflow_needs_the_profile_namespace(
    package: str, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    monkeypatch.setattr(kfp_client, "_POD_NAMESPACE", tmp_path / "not-in-a-pod")
    api = FakeKfpApi(multi_user=True)
    try:
        with pytest.raises(KubeflowError, match="multi-user.*--namespace or KFP_NAMESPACE"):
            kfp_client.submit(api.endpoint, package, {})
        assert api.paths() == [f"GET {API}/healthz"]  # nothing uploaded

        monkeypatch.setenv("KFP_NAMESPACE", "kubeflow-user-example-com")
        assert kfp_client.submit(api.endpoint, package, {}) == "run-1"
        (experiment,) = api.bodies("POST", f"{API}/experiments")
        assert experiment["namespace"] == "kubeflow-user-example-com"
    finally:
        api.close()


def test_schedule_replace_keeps_a_paused_schedule_paused_and_its_parameters(
    api: FakeKfpApi, package: str
) -> None:
    kfp_client.schedule(api.endpoint, package, "0 2 * * *", {"min_auc": "0.8", "span": "-1"},
                        job_name="nightly")  # fmt: skip
    kfp_client.pause(api.endpoint, "job-1")
    del api.requests[:]
    kfp_client.schedule(api.endpoint, package, "0 3 * * *", {"span": "-1"}, job_name="nightly",
                        replace=True)  # fmt: skip
    (job,) = api.recurring_runs
    assert (job["recurring_run_id"], job["mode"]) == ("job-2", "DISABLE")
    assert job["runtime_config"]["parameters"] == {"min_auc": 0.8, "span": -1}
    assert f"POST {API}/recurringruns/job-1:disable" not in api.paths()  # it was paused already


def test_schedule_replace_drops_parameters_the_new_spec_no_longer_has(
    api: FakeKfpApi, package: str, tmp_path
) -> None:
    api.add_recurring_run("nightly", parameters={"span": 3.0, "renamed_away": "x"})
    said: list[str] = []
    kfp_client.schedule(api.endpoint, package, "0 2 * * *", {}, job_name="nightly",
                        replace=True, say=said.append)  # fmt: skip
    (job,) = api.recurring_runs
    assert job["runtime_config"]["parameters"] == {"span": 3}  # 3.0 read back, an integer again
    assert said == [f"Not kept from recurring run 'nightly': ['renamed_away'] (not parameters of "
                    f"{package})"]  # fmt: skip


# ------------------------------------------------------------ the API server's own rules, played


VERSIONS = ["2.5.0", "2.16.1", "2.17.0"]


@pytest.fixture(params=VERSIONS)
def server(request, monkeypatch: pytest.MonkeyPatch, tmp_path):
    """The stand-in as the API server of each supported KFP version."""
    monkeypatch.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    fake = FakeKfpApi(version=request.param)
    yield fake
    fake.close()


def _sdk(server: FakeKfpApi) -> kfp.Client:
    return kfp.Client(host=server.endpoint)


def test_run_parameters_are_checked_as_validate_pipeline_job_inputs_does(server, package):
    """The server refuses "3" for an integer: the product sends the spec's types."""
    kfp_client.submit(server.endpoint, package, {"span": "3", "min_auc": "0.8"})
    (run,) = server.runs
    assert run["runtime_config"]["parameters"] == {"span": 3, "min_auc": 0.8}
    client = _sdk(server)
    reference = run["pipeline_version_reference"]
    refused = {
        "span": "input parameter span requires type double or integer, but the parameter value "
                "is not of number value type",
        "typo": "parameter(s) provided are not required by pipeline: typo",
    }  # fmt: skip
    for name, message in refused.items():
        with pytest.raises(kfp_server_api.ApiException) as raised:
            client.run_pipeline(run["experiment_id"], "raw", params={name: "3"},
                                pipeline_id=reference["pipeline_id"],
                                version_id=reference["pipeline_version_id"])  # fmt: skip
        body = json.loads(raised.value.body)
        assert raised.value.status == 400 and body["code"] == 3
        assert body["message"] == ("Failed to create a new run: Failed to generate the "
                                   f"ExecutionSpec: invalid pipeline job inputs: Invalid input "
                                   f"error: {message}")  # fmt: skip
        assert ("error" in body) == (server.version == "2.5.0")  # the gateway's shape
    with pytest.raises(KubeflowError, match=r"unknown parameter\(s\) \['typo'\]"):
        kfp_client.submit(server.endpoint, package, {"typo": "3"})  # refused before any upload
    assert len(server.runs) == 1


@pytest.mark.parametrize("guard", ["parameter types", "cron check", "pipeline lookup"])
def test_each_server_rule_catches_the_product_without_its_guard(server, package, monkeypatch,
                                                                 guard):  # fmt: skip
    """The product checks first what the server would refuse; without each check, the server's
    rule (played by the stand-in) refuses what the product sends, and the product says so."""
    if guard == "parameter types":
        monkeypatch.setattr(kfp_client, "_typed_parameters", lambda package, given: given)
        call = lambda: kfp_client.submit(server.endpoint, package, {"span": "3"})  # noqa: E731
        refused = "HTTP 400.*input parameter span requires type double or integer"
    elif guard == "cron check":
        monkeypatch.setattr(kfp_client, "normalize_cron", lambda cron: cron)
        call = lambda: kfp_client.schedule(  # noqa: E731
            server.endpoint, package, "0 0 2 * * 7", {}, job_name="nightly", say=lambda _: None
        )
        refused = r"HTTP 400.*End of range \(7\) above maximum \(6\)"
    else:  # an upload of a pipeline that exists, instead of a version of it
        kfp_client.submit(server.endpoint, package, {})
        monkeypatch.setattr(kfp.Client, "get_pipeline_id", lambda self, name: None)
        call = lambda: kfp_client.submit(server.endpoint, package, {})  # noqa: E731
        refused = "HTTP 409"
    with pytest.raises(KubeflowError, match=refused):
        call()


def test_a_pipeline_or_version_name_that_exists_is_refused_and_the_product_reuses_it(
    server, package
):
    kfp_client.submit(server.endpoint, package, {})
    kfp_client.submit(server.endpoint, package, {})  # the same package: nothing uploaded again
    assert len(server.pipelines) == 1 and len(server.runs) == 2
    ((pipeline_id, pipeline),) = server.pipelines.items()
    client = _sdk(server)
    with pytest.raises(kfp_server_api.ApiException) as raised:
        client.upload_pipeline(package, "taxi-tips")
    assert raised.value.status == 409
    version = pipeline["versions"][-1]["display_name"]
    with pytest.raises(kfp_server_api.ApiException) as raised:
        client.upload_pipeline_version(package, version, pipeline_id=pipeline_id)
    assert raised.value.status == 409
    with pytest.raises(kfp_server_api.ApiException) as raised:
        client.upload_pipeline_version(package, "v9", pipeline_id="no-such-pipeline")
    assert raised.value.status == 400
    # Two pipelines sharing a display name (2.16+ allows it): named, not a traceback.
    server.pipelines["pipeline-99"] = dict(pipeline, versions=[])
    with pytest.raises(KubeflowError, match="Multiple pipelines with the name: taxi-tips found"):
        kfp_client.submit(server.endpoint, package, {})


def test_an_invalid_spec_is_refused_at_upload(server, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPEC.replace("name: taxi-tips", "name: Taxi_Tips"))
    with pytest.raises(kfp_server_api.ApiException) as raised:
        _sdk(server).upload_pipeline(str(bad), "bad")
    assert raised.value.status == (400 if server.version == "2.17.0" else 500)
    if server.version != "2.16.1":  # 2.16.1 keeps the reason in its log
        assert "must contain only lowercase alphanumeric characters" in raised.value.body
    bad.write_text(SPEC.replace("sdkVersion", "sdkVersoin"))  # an unknown field
    with pytest.raises(kfp_server_api.ApiException):
        _sdk(server).upload_pipeline(str(bad), "bad")
    assert not server.pipelines


def test_an_experiment_is_reused_by_name_and_a_duplicate_is_refused(server, package):
    kfp_client.submit(server.endpoint, package, {})
    kfp_client.submit(server.endpoint, package, {}, experiment="taxi-tips")
    assert len(server.experiments) == 1 and len(server.bodies("POST", f"{API}/experiments")) == 1
    with pytest.raises(kfp_server_api.ApiException) as raised:  # what a race would meet
        _sdk(server)._experiment_api.create_experiment(
            body=kfp_server_api.V2beta1Experiment(display_name="taxi-tips")
        )
    assert raised.value.status == 409
    assert "The name taxi-tips already exists" in json.loads(raised.value.body)["message"]


@pytest.mark.parametrize(
    "cron",
    ["0 2 * * *", "30 0 2 * * *", "*/15 9-17 * JAN-MAR,dec MON-FRI", "0 0 12 ? * sun",
     "5/10 0-23/2 1,15 * ?", "0 0 * * 1-5", "59 23 31 12 6"],
)  # fmt: skip
def test_every_cron_the_product_accepts_is_one_robfig_cron_parses(cron: str) -> None:
    from tests.stand_ins import kfp_api_rules

    kfp_api_rules.parse_cron(kfp_client.normalize_cron(cron))  # raises if KFP would refuse it


def test_a_schedule_is_checked_as_to_model_job_does(server, package):
    job = kfp_client.schedule(server.endpoint, package, "0 2 * * *", {}, job_name="nightly")
    (created,) = server.recurring_runs
    assert created["recurring_run_id"] == job and created["status"] == "ENABLED"
    client = _sdk(server)
    reference = created["pipeline_version_reference"]
    common = dict(pipeline_id=reference["pipeline_id"], version_id=reference["pipeline_version_id"])
    refused = [
        ({"cron_expression": "0 2 * *"}, "Expected 5 to 6 fields, found 4: 0 2 * *"),
        ({"cron_expression": "0 0 2 * * 7"}, "End of range (7) above maximum (6): 7"),
        ({"cron_expression": "0 0 2 * * *", "max_concurrency": 11},
         "Max concurrency of a recurring run must be at least 1 and at most 10. Received 11"),
        ({"cron_expression": "0 0 2 * * *", "params": {"span": "3"}},
         "input parameter span requires type double or integer"),
    ]  # fmt: skip
    for arguments, message in refused:
        with pytest.raises(kfp_server_api.ApiException) as raised:
            client.create_recurring_run(created["experiment_id"], "raw", **common, **arguments)
        assert raised.value.status == 400 and message in raised.value.body
    assert len(server.recurring_runs) == 1
    with pytest.raises(
        KubeflowError, match="day-of-week field '7'"
    ):  # the product: before any call
        kfp_client.schedule(server.endpoint, package, "0 2 * * 7", {}, job_name="other")
