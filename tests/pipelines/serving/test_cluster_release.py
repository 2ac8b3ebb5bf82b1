"""A release on a cluster (pipelines/serving/cluster_release.py) as kubeflow/serving/tf-serving.yaml
and kubeflow/watch-cronjob.yaml ship it: the two Deployments' pods, the VirtualService, the
watch's Role, and `watch`'s release check, against SeaweedFS.

The boundary: no Kubernetes, Istio or TF Serving can run here. The API server and kubelet are
tests/stand_ins/kube_api.py (the pods' IPs on loopback, readiness probed as the kubelet does),
Istio's API and the mesh's routing tests/stand_ins/istio.py, and each pod's TF Serving is
`tkp serve --label <track>` on the pod's IP and port 8501, with TF Serving's metrics
(pipelines/serving/metrics.py writes `request_count` and `request_latency` as TF Serving's
exporter does), fed from the store as the track's sync sidecar feeds TF Serving
(serving_sync.label_view). A fault drill (`--fault-drill`) makes a canary fail.
"""

from __future__ import annotations

import base64
import itertools
import json
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml

from components.base import serving_state
from components.base.config import PipelineConfig
from components.base.use_case import load as load_use_case
from components.training.export import SERVING_SIGNATURE
from pipelines.serving import cluster, cluster_release
from pipelines.serving.samples import row_to_example
from pipelines.watch import ReleaseJudge
from tests.pipelines.serving.served import frame_rows, judge_until, push
from tests.stand_ins.istio import Mesh
from tests.stand_ins.kube_api import KubeApi

REPO = Path(__file__).parents[3]
SHIPPED_NAME = "taxi-tips"
NAMESPACE = "team-a"


def _documents(path: Path, model: str) -> list[dict]:
    """A manifest for `model`, renamed as kubeflow/README.md says (every `taxi-tips`)."""
    return [d for d in yaml.safe_load_all(path.read_text().replace(SHIPPED_NAME, model)) if d]


def _role_rules(cronjob: list[dict]) -> set[tuple]:
    """The Role's rules as the stand-in's RBAC reads them, resourceNames kept."""
    (role,) = [d for d in cronjob if d["kind"] == "Role"]
    rules = set()
    for rule in role["rules"]:
        for group, resource, verb in itertools.product(
            rule["apiGroups"], rule["resources"], rule["verbs"]
        ):
            names = rule.get("resourceNames")
            rules |= {(group, resource, verb, n) for n in names} if names else {
                (group, resource, verb)}  # fmt: skip
    return rules


def _pod(deployment: dict, work: Path, serving_root: str, drills: list[str]) -> dict:
    """The Deployment's pod as its ReplicaSet makes it, its TF Serving played by `tkp serve`
    with the track's label (the sync sidecar's `--label`), on the pod's IP."""
    template = deployment["spec"]["template"]
    tf_serving, *_ = template["spec"]["containers"]
    sync = template["spec"]["containers"][1]
    track = sync["command"][sync["command"].index("--label") + 1]
    env = [v for v in sync["env"] if v["name"] != "PIPELINE_WORK_DIR"] + [
        {"name": "PIPELINE_WORK_DIR", "value": str(work)},
        {"name": "PIPELINE_SERVING_ROOT", "value": serving_root},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    command = ["tkp", "serve", "--label", track, "--host", "$(POD_IP)", "--port", "8501",
               "--poll-seconds", "0.5"]  # fmt: skip
    for drill in drills:
        command += ["--fault-drill", drill]
    container = {key: tf_serving[key] for key in ("name", "image", "ports", "readinessProbe",
                                                  "securityContext", "resources")}  # fmt: skip
    metadata = dict(template["metadata"], name=f"{deployment['metadata']['name']}-0")
    spec = {"securityContext": template["spec"]["securityContext"],
            "containers": [dict(container, command=command, env=env)]}  # fmt: skip
    return {"metadata": metadata, "spec": spec}


class MeshTraffic:
    """A client in the mesh sending :predict requests to the model's Service in a loop; what
    each Service answered is kept."""

    def __init__(self, mesh: Mesh, host: str, path: str, body: bytes) -> None:
        self.mesh, self.host, self.path, self.body = mesh, host, path, body
        self.answers: list[tuple[str, int]] = []  # (the Service that answered, status)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            status, _, service = self.mesh.send(self.host, 8501, self.path, self.body)
            self.answers.append((service, status))
            time.sleep(0.01)

    def by(self, service: str) -> list[int]:
        return [status for answered_by, status in list(self.answers) if answered_by == service]

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def _weights(api: KubeApi, name: str) -> list[tuple[int, int, bool]]:
    """Each route's (stable weight, canary weight, mirrored) in the stored VirtualService."""
    (virtual_service,) = api.objects_of("virtualservices")
    return [(r["route"][0]["weight"], r["route"][1]["weight"], "mirror" in r)
            for r in virtual_service["spec"]["http"]]  # fmt: skip


def test_a_cluster_release_moves_traffic_judges_on_tf_serving_metrics_and_aborts_a_failing_canary(
    object_store, tabular_use_case_model, tmp_path, monkeypatch
):
    fn_args, eval_frame = tabular_use_case_model.fn_args, tabular_use_case_model.eval_frame
    model = tabular_use_case_model.model_name
    bucket = object_store.new_bucket("cluster-release")
    folder = f"s3://{bucket}/serving/{model}"
    examples = tabular_use_case_model.to_examples(eval_frame.head(8), with_label=False)
    push(folder, model, fn_args.serving_model_dir, 1, examples)

    serving = _documents(REPO / "kubeflow" / "serving" / "tf-serving.yaml", model)
    cronjob = _documents(REPO / "kubeflow" / "watch-cronjob.yaml", model)
    secret = {"AWS_ENDPOINT_URL_S3": object_store.endpoint, "AWS_REGION": "us-east-1",
              "AWS_ACCESS_KEY_ID": "any", "AWS_SECRET_ACCESS_KEY": "any"}  # fmt: skip
    # Only what the watch's Role allows (a 403 otherwise).
    (tmp_path / "kube").mkdir()
    api = KubeApi(tmp_path / "kube", NAMESPACE, {"tfx-pipeline-s3": secret},
                  rbac=_role_rules(cronjob))  # fmt: skip
    traffic = None
    try:
        mesh = Mesh(api, [d for d in serving if d["kind"] == "Service"])
        (virtual_service,) = [d for d in serving if d["kind"] == "VirtualService"]
        api.create(mesh.resource, virtual_service, NAMESPACE, "Strict")
        pods = []
        for deployment in [d for d in serving if d["kind"] == "Deployment"]:
            work = tmp_path / deployment["metadata"]["name"]
            manifest = _pod(deployment, work, f"s3://{bucket}/serving", ["3:0.5", "4:1.0"])
            pods.append(api.add_pod(manifest, {}, f"ReplicaSet/{deployment['metadata']['name']}",
                                    "FailedCreate"))  # fmt: skip
        assert all(pods), api.events  # admitted by Pod Security's restricted level
        judge_until(lambda: all(p.ready() for p in pods), "both tracks' pods ready")

        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
        config = PipelineConfig.load({
            "use_case": tabular_use_case_model.name, "serving_root": f"s3://{bucket}/serving",
            "release_mode": "canary", "canary_percent": "30", "release_min_requests": "40",
            "release_min_minutes": "0", "release_router": "istio",
            # Two pods, a client and the judge share two cores: a p99 over 40 requests is noise
            # here (the latency rule is tested in tests/base/test_live_release.py).
            "release_max_p99_ratio": "10",
        }, environ={})  # fmt: skip
        judge = ReleaseJudge(config)
        name = cluster.service(model)
        # Each pod asked at its IP under the headless Service's name (mTLS in a mesh).
        (canary_pod,) = cluster.Cluster(model).pods("canary")
        dashed = canary_pod.ip.replace(".", "-")
        assert canary_pod.host == f"{dashed}.{name}-pods.{NAMESPACE}.svc.cluster.local:8501"
        rows = frame_rows(eval_frame.head(2))
        use_case = load_use_case(tabular_use_case_model.name)
        instances = [{"b64": base64.b64encode(row_to_example(r, use_case)).decode()}
                     for r in rows]  # fmt: skip
        body = json.dumps({"signature_name": SERVING_SIGNATURE, "instances": instances}).encode()
        traffic = MeshTraffic(mesh, name, f"/v1/models/{model}:predict", body)
        assert judge() is None and _weights(api, name) == [(100, 0, False)] * 2

        # A canary with a 30 % share, promoted on its pods' TF Serving metrics.
        push(folder, model, fn_args.serving_model_dir, 2, examples, config.release_policy())
        shares = set()
        judge_until(lambda: shares.add(tuple(_weights(api, name))) or not
               serving_state.read(folder, model).release, "the first verdict", judge)  # fmt: skip
        assert ((70, 30, False), (70, 30, False)) in shares  # both ports split
        state = serving_state.read(folder, model)
        assert (state.labels, state.change["what"]) == ({"stable": 2}, "promotion"), state.change
        figures = state.change["figures"]
        assert figures["canary"]["requests"] >= 40 and figures["canary"]["error_rate"] == 0
        assert figures["stable"]["requests"] > 0
        # Measured on the canary's warm-up rows sent to both tracks: versions 1 and 2 are the
        # same model here, so the same predictions.
        assert figures["prediction_shift"] == 0.0
        assert 200 in traffic.by(f"{name}-canary")  # the canary answered clients
        # The routes go back once the stable pod serves version 2 (the canary pod does too).
        judge_until(lambda: _weights(api, name) == [(100, 0, False)] * 2, "the routes back", judge)

        # The next canary fails half its requests (the drill): aborted, its share taken back.
        before = len(traffic.answers)
        push(folder, model, fn_args.serving_model_dir, 3, examples, config.release_policy())
        judge_until(lambda: not serving_state.read(folder, model).release, "the abort", judge)
        state = serving_state.read(folder, model)
        assert (state.labels, state.change["what"]) == ({"stable": 2}, "abort")
        assert state.change["figures"]["canary"]["error_rate"] >= 0.3
        assert "error rate" in state.change["why"]
        assert _weights(api, name) == [(100, 0, False)] * 2
        assert 500 in [s for _, s in traffic.answers[before:]]  # clients met it while it ran

        # A shadow canary failing every copy: clients only ever get stable's answers.
        shadow = {**config.release_policy(), "mode": "shadow"}
        before = len(traffic.answers)
        push(folder, model, fn_args.serving_model_dir, 4, examples, shadow)
        mirrored = set()
        judge_until(lambda: mirrored.add(tuple(_weights(api, name))) or not
               serving_state.read(folder, model).release, "the shadow's abort", judge)  # fmt: skip
        assert ((100, 0, True), (100, 0, True)) in mirrored
        state = serving_state.read(folder, model)
        assert (state.labels, state.change["what"]) == ({"stable": 2}, "abort")
        assert state.change["figures"]["canary"]["error_rate"] == 1.0
        assert {s for s, _ in traffic.answers[before:]} == {f"{name}-stable"}
    finally:
        if traffic:
            traffic.stop()
        api.close()
    # Stable never failed a client, through every release.
    answered_by_stable = traffic.by(f"{name}-stable")
    assert answered_by_stable and set(answered_by_stable) == {200}
    assert ("", "pods", "list") in api.requests  # and nothing beyond the Role (else a 403)
    whats = [s.change["what"] for s in serving_state.history(folder)]
    assert whats == ["push", "canary", "promotion", "canary", "abort", "canary", "abort"]


def test_tf_serving_figures_count_inference_answers_and_errors_and_a_restart_starts_over():
    from pipelines.serving.metrics import ServingMetrics

    served = ServingMetrics()  # writes TF Serving's request_count and request_latency as it does
    for seconds in (0.002, 0.003, 0.004):
        served.count_request("m", "OK", "predict", seconds)
    served.count_request("m", "OK", "", 0.001)  # a readiness probe's GET: not an answer
    served.count_request("m", "INVALID_ARGUMENT", "predict", 0.001)
    served.count_request("other", "OK", "classify", 0.5)
    text = served.exposition().decode()
    assert ':tensorflow:serving:request_latency_bucket{model_name="m",API="predict",' \
        'entrypoint="REST",le="10"} 0' in text  # fmt: skip
    figures = cluster.tf_serving_figures(text, "m")
    assert (figures.requests, figures.errors) == (4, 1)
    # gRPC answers, as TF Serving records them (prediction_service_impl.cc), count too.
    for _ in range(5):
        served.tf_latency.observe(("m", "Predict", "GRPC"), 2000.0)
    grpc = cluster.tf_serving_figures(served.exposition().decode(), "m")
    assert (grpc.requests, grpc.errors) == (4 + 5, 1)
    # In the bucket that holds 4 ms (3.57 to 6.43 ms), not the other model's 500 ms.
    assert 3.57 < figures.p99_ms < 6.43
    later = cluster.tf_serving_figures(text.replace("} 3\n", "} 7\n"), "m")
    grown = cluster_release.growth(later, figures)
    assert (grown.requests, grown.errors) == (later.requests - 4, 0)
    restarted = cluster.tf_serving_figures(ServingMetrics().exposition().decode(), "m")
    assert cluster_release.growth(restarted, figures) is restarted  # counters went back


def test_the_cluster_calls_refused_say_what_to_apply(tmp_path, monkeypatch):
    from tests.stand_ins import istio

    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config either
    with pytest.raises(cluster.ClusterUnavailable, match="no Kubernetes API"):
        cluster.Cluster("m")
    for rbac, expected in (
        (set(), "cannot get virtualservices in namespace team-a \\(403\\).*Role"),
        # Another object than the Role's resourceNames allows.
        ({("networking.istio.io", "virtualservices", "get", "tfx-other-serving")}, "\\(403\\)"),
    ):
        api = KubeApi(tmp_path, NAMESPACE, {}, rbac=rbac)
        try:
            istio.Mesh(api, [])
            monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
            with pytest.raises(cluster.ClusterUnavailable, match=expected):
                cluster.Cluster("m").routes()
        finally:
            api.close()
    api = KubeApi(tmp_path, NAMESPACE, {})  # no Istio: no VirtualService to move
    try:
        monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig))
        assert cluster.Cluster("m").routes() is None
    finally:
        api.close()


def test_the_virtual_service_api_refuses_what_istio_and_the_api_server_refuse(tmp_path):
    import requests

    serving = _documents(REPO / "kubeflow" / "serving" / "tf-serving.yaml", SHIPPED_NAME)
    (virtual_service,) = [d for d in serving if d["kind"] == "VirtualService"]
    api = KubeApi(tmp_path, NAMESPACE, {})
    try:
        mesh = Mesh(api, [])
        api.create(mesh.resource, virtual_service, NAMESPACE, "Strict")
        url = (f"{yaml.safe_load(api.kubeconfig.read_text())['clusters'][0]['cluster']['server']}"
               f"/apis/networking.istio.io/v1/namespaces/{NAMESPACE}/virtualservices/"
               f"{virtual_service['metadata']['name']}")  # fmt: skip
        http = virtual_service["spec"]["http"]
        negative = cluster_release.routed(http, "x", 0, False)
        negative[0]["route"][0]["weight"] = -1
        for content_type, patch, code, text in (
            ("application/strategic-merge-patch+json", {"spec": {}}, 415, "unknown format"),
            ("application/merge-patch+json", {"spec": {"http": negative}}, 403,
             'admission webhook "validation.istio.io" denied the request: configuration is '
             "invalid: weight -1 < 0"),
            ("application/merge-patch+json",
             {"spec": {"http": [dict(http[0], retries={"attempts": 2})]}},
             403, "cannot play istiod's validation of ['retries']"),
        ):  # fmt: skip
            answer = requests.patch(url, json=patch, headers={"Content-Type": content_type},
                                    timeout=30)  # fmt: skip
            assert answer.status_code == code and text in answer.json()["message"], answer.text
        # A merge patch replaces the list whole (RFC 7386), as `watch` relies on.
        shared = cluster_release.routed(http, "tfx-taxi-tips-serving", 40, False)
        answer = requests.patch(
            url,
            json={"spec": {"http": shared}},
            timeout=30,
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert answer.status_code == 200 and answer.json()["spec"]["http"] == shared
        assert answer.json()["metadata"]["generation"] == 2
    finally:
        api.close()


def _loopback_address_without_rest_port() -> str:
    """A loopback address where nothing listens on TF Serving's REST port (a `tkp serve` of the
    reader's own may hold 127.0.0.1:8501 while the tests run)."""
    for last in range(2, 255):
        address = f"127.0.0.{last}"
        with socket.socket() as probe:
            probe.settimeout(1)
            if probe.connect_ex((address, cluster.REST_PORT)) != 0:
                return address
    raise AssertionError("every loopback address answers on port 8501")


def test_a_pod_whose_metrics_cannot_be_read_is_named_and_the_release_waits():
    nothing = "http://127.0.0.1:9"  # the discard port: nothing listens
    pod = cluster.ModelServerPod(
        "tfx-m-serving-canary-0",
        "uid",
        _loopback_address_without_rest_port(),
        0,
        "h:8501",
        f"{nothing}/monitoring/prometheus/metrics",
    )
    with pytest.raises(cluster.ClusterUnavailable) as raised:
        pod.figures("m")
    message = str(raised.value)
    assert "model-server pod tfx-m-serving-canary-0 at http://127.0.0.1:9/" in message
    assert "--monitoring_config_file" in message and "stable keeps serving" in message
    assert pod.predict("m", {"instances": [1]}) == (0, None)  # 8501: nothing listens either
    assert pod.version_state("m", 1).startswith("no answer")
