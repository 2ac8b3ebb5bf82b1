"""`watch` (pipelines/watch.py): one run per new complete span, recorded in the object store.

Against the real SeaweedFS server. The boundary is the trigger: the tests inject a callable that
records which spans it was asked to run, because the full pipeline run (local runner, KFP spec)
is exercised by test_pipeline_e2e.py and test_kubeflow_spec.py. The CLI test submits to
`FakeKfpApi` (tests/stand_ins/kfp_api_stand_in.py), a stand-in for the KFP API server, which cannot
run here.
"""

from __future__ import annotations

import json
import socket
import time

import pytest
import yaml

from components.base import storage
from components.base.config import REPO_ROOT, PipelineConfig, check_values
from components.base.object_store import s3_client
from pipelines import data, watch
from pipelines.cli import build_parser
from pipelines.kubeflow import kfp_client
from pipelines.kubeflow.kfp_client import KubeflowError
from tests.pipelines import cli_process
from tests.stand_ins.kfp_api_stand_in import API, SPEC, FakeKfpApi

CRONJOB = REPO_ROOT / "kubeflow" / "watch-cronjob.yaml"


class Recorder:
    """A trigger that records the spans it is asked to run; `fail` spans raise."""

    def __init__(self, fail: tuple[int, ...] = ()) -> None:
        self.calls: list[int] = []
        self.fail = set(fail)

    def __call__(self, span: int) -> str:
        self.calls.append(span)
        if span in self.fail:
            raise RuntimeError(f"the run of span {span} broke")
        return f"run-{span}"


@pytest.fixture
def config(object_store) -> PipelineConfig:
    bucket = object_store.new_bucket("watch")
    return PipelineConfig(data_root=f"s3://{bucket}/data", serving_root=f"s3://{bucket}/serving")


def _span(config: PipelineConfig, span: int, marker: bool = True) -> None:
    data.write_span(config.data_root, span, 20, marker="_SUCCESS" if marker else "")


def _record(watcher: watch.Watcher, span: int) -> dict:
    return json.loads(storage.read_bytes(watcher.record_path(span)))


def test_a_span_without_the_marker_never_triggers_until_the_marker_lands(config, capsys):
    _span(config, 0, marker=False)
    trigger = Recorder()
    watcher = watch.Watcher(config, trigger, "local")

    assert watcher.poll().new == [] and watcher.poll().new == []
    assert trigger.calls == []
    out = capsys.readouterr().out
    assert "poll 1: spans [] complete, [0] waiting for _SUCCESS, nothing new" in out

    storage.write_bytes(data.span_dir(config.data_root, 0) + "/_SUCCESS", b"")
    assert watcher.poll().triggered == {0: "run-0"}
    assert trigger.calls == [0]
    record = _record(watcher, 0)
    assert record["state"] == "triggered" and record["run"] == "run-0" and record["how"] == "local"
    assert record["span"] == 0 and record["when"].endswith("Z")


def test_new_complete_spans_run_once_each_oldest_first_also_after_a_restart(config, capsys):
    _span(config, 0)
    trigger = Recorder()
    watcher = watch.Watcher(config, trigger, "kfp http://kfp")
    watcher.poll()
    _span(config, 1)
    _span(config, 2)
    _span(config, 3, marker=False)

    result = watcher.poll()

    assert result.triggered == {1: "run-1", 2: "run-2"}
    assert trigger.calls == [0, 1, 2]
    assert "poll 2: spans [0, 1, 2] complete, [3] waiting for _SUCCESS, [1, 2] new" in (
        capsys.readouterr().out
    )
    assert watcher.poll().new == []
    assert "poll 3: spans [0, 1, 2] complete, [3] waiting for _SUCCESS, nothing new" in (
        capsys.readouterr().out
    )
    assert watcher.poll().new == []
    assert capsys.readouterr().out == ""  # nothing changed since the last poll: quiet
    restarted = watch.Watcher(config, trigger, "kfp http://kfp")  # a new process, same records
    assert restarted.poll().new == []
    assert trigger.calls == [0, 1, 2]
    assert [_record(restarted, s)["state"] for s in (0, 1, 2)] == ["triggered"] * 3
    assert _record(restarted, 2)["how"] == "kfp http://kfp"


def test_first_start_runs_only_the_newest_of_the_spans_already_there(config, capsys):
    for span in (0, 1, 2):
        _span(config, span)
    trigger = Recorder()
    watcher = watch.Watcher(config, trigger, "local")

    assert watcher.poll().triggered == {2: "run-2"}
    assert trigger.calls == [2]
    assert [_record(watcher, s)["state"] for s in (0, 1)] == ["present-before-watch"] * 2
    assert "First start: spans [0, 1] were complete before watch started" in capsys.readouterr().out


def test_a_record_left_started_is_reported_and_not_retried(config, capsys):
    _span(config, 0)
    trigger = Recorder()
    crashed = watch.Watcher(config, trigger, "local")
    crashed._write(0, watch.STARTED)  # what a crash between record and trigger leaves

    watcher = watch.Watcher(config, trigger, "local")
    assert watcher.poll().new == []
    assert trigger.calls == []
    out = capsys.readouterr().out
    assert f"record {watcher.record_path(0)}: state 'started'" in out
    assert "not retried" in out and "delete the record" in out


def test_a_failed_trigger_is_recorded_reported_not_retried_and_retried_once_deleted(config, capsys):
    _span(config, 0)
    watch.Watcher(config, Recorder(), "local").poll()
    _span(config, 1)
    _span(config, 2)
    trigger = Recorder(fail=(1,))
    watcher = watch.Watcher(config, trigger, "local")

    result = watcher.poll()

    assert result.failed == {1: "RuntimeError: the run of span 1 broke"}
    assert result.triggered == {2: "run-2"}  # one failure does not hold back the next span
    record = _record(watcher, 1)
    assert record["state"] == "failed" and "span 1 broke" in record["error"]
    assert "span 1: the run failed: RuntimeError: the run of span 1 broke" in (
        capsys.readouterr().err
    )
    watcher.poll()
    assert trigger.calls == [1, 2]
    assert "state 'failed'" not in capsys.readouterr().out  # reported once, when it happened
    restarted = watch.Watcher(config, trigger, "local")
    restarted.poll()
    assert "state 'failed'" in capsys.readouterr().out  # every new watcher reports it
    assert trigger.calls == [1, 2]

    bucket, key = storage.split_s3(restarted.record_path(1))
    s3_client().delete_object(Bucket=bucket, Key=key)
    trigger.fail.clear()
    assert restarted.poll().triggered == {1: "run-1"}


def test_an_unreachable_kfp_endpoint_writes_no_record_so_the_span_runs_later(config):
    _span(config, 0)
    trigger = Recorder()

    def down() -> None:
        raise KubeflowError("Kubeflow Pipelines API at http://kfp is not reachable")

    with pytest.raises(KubeflowError):
        watch.Watcher(config, trigger, "kfp http://kfp", ready=down).poll()
    assert trigger.calls == []
    assert not storage.list_files(watch.Watcher(config, trigger, "x").records_dir + "/*")
    assert watch.Watcher(config, trigger, "kfp http://kfp").poll().triggered == {0: "run-0"}


def test_run_loop_reports_later_errors_and_stops_cleanly_on_ctrl_c(config, capsys):
    _span(config, 0)
    polls, checks = [], []

    def ready() -> None:  # the KFP API is down at the second poll only
        checks.append(len(polls))
        if len(checks) == 2:
            raise KubeflowError("Kubeflow Pipelines API at http://kfp is not reachable")

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        if len(polls) == 1:
            _span(config, 1)
        if len(polls) == 3:
            raise KeyboardInterrupt

    trigger = Recorder()
    watcher = watch.Watcher(config, trigger, "kfp http://kfp", ready)
    assert watch.run(watcher, 5, once=False, sleep=sleep) == 0
    assert trigger.calls == [0, 1] and polls == [5, 5, 5]
    captured = capsys.readouterr()
    assert (
        "poll 2 failed: Kubeflow Pipelines API at http://kfp is not reachable; next poll in 5 s."
        in captured.err
    )
    assert "Stopped watching after 3 poll(s)." in captured.out
    failing = watch.Watcher(config, Recorder(fail=(2,)), "local")
    _span(config, 2)
    assert watch.run(failing, 5, once=True) == 1  # --once: a failed trigger fails the Job


def test_unreachable_store_names_the_endpoint_and_the_fix_quickly(config, monkeypatch):
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    started = time.monotonic()
    with pytest.raises(storage.StorageError) as raised:
        watch.run(watch.Watcher(config, Recorder(), "local"), 5, once=True)
    assert time.monotonic() - started < 30
    message = str(raised.value)
    assert endpoint in message and config.data_root in message
    assert "Check that the object store runs" in message and "AWS_ENDPOINT_URL_S3" in message


def test_a_data_root_without_spans_is_a_clear_error(config):
    trigger = Recorder()
    with pytest.raises(watch.WatchError) as raised:
        watch.Watcher(config, trigger, "local").poll()
    message = str(raised.value)
    assert f"no spans under {config.data_root}" in message
    assert "span-N/" in message and "_SUCCESS" in message and "add-span" in message
    assert trigger.calls == []


@pytest.fixture
def api(tmp_path):
    fake = FakeKfpApi()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def test_cli_watch_once_submits_each_new_span_to_kfp_with_its_span(config, api, tmp_path):
    _span(config, 0)
    package = tmp_path / "pipeline.yaml"
    package.write_text(SPEC)
    store = s3_client().meta.endpoint_url

    def watch_once(*extra: str, sent: tuple[str, ...] = ("--package", str(package))):
        return cli_process.run(
            tmp_path, "watch", "--once", "--endpoint", api.endpoint, *sent,
            "--set", f"data_root={config.data_root}",
            "--set", f"serving_root={config.serving_root}",
            *extra, timeout=300, AWS_ENDPOINT_URL_S3=store, HOME=str(tmp_path),
        )  # fmt: skip

    first = watch_once()
    assert first.returncode == 0, first.stdout + first.stderr
    (run,) = api.bodies("POST", f"{API}/runs")
    assert run["runtime_config"]["parameters"] == {"span": 0, "data_root": config.data_root}
    assert "span 0: triggered (kfp " in first.stdout and "run-1" in first.stdout
    assert first.stderr == ""

    _span(config, 1)
    second = watch_once()
    assert second.returncode == 0, second.stdout + second.stderr
    runs = api.bodies("POST", f"{API}/runs")
    assert [r["runtime_config"]["parameters"]["span"] for r in runs] == [0, 1]
    assert "poll 1: spans [0, 1] complete, [1] new" in second.stdout

    refused = watch_once("--interval", "1")
    assert refused.returncode == 2
    assert "watch_interval must be between 5 and 3600, got 1 (from --interval)" in refused.stderr
    assert len(api.bodies("POST", f"{API}/runs")) == 2
    secrets = [cli_process.SENTINEL_KEY_ID, cli_process.SENTINEL_SECRET]
    assert not any(s in out for s in secrets for out in (first.stdout, second.stdout))

    # Without --package (the CronJob): a run of the pipeline's newest version, which a merge's
    # `make submit` changed, with nothing given to the watcher.
    merged = tmp_path / "merged.yaml"
    merged.write_text(SPEC.replace("defaultValue: 0.75", "defaultValue: 0.8"))
    kfp_client.submit(api.endpoint, str(merged), {"span": "1"})
    _span(config, 2)
    third = watch_once(sent=())
    assert third.returncode == 0, third.stdout + third.stderr
    ((_, pipeline),) = api.pipelines.items()
    run = api.bodies("POST", f"{API}/runs")[-1]
    newest = pipeline["versions"][-1]
    assert (
        newest["spec"]["root"]["inputDefinitions"]["parameters"]["min_auc"]["defaultValue"] == 0.8
    )
    assert run["pipeline_version_reference"]["pipeline_version_id"] == newest["pipeline_version_id"]
    assert run["runtime_config"]["parameters"] == {"span": 2, "data_root": config.data_root}


def test_cli_watch_against_an_unreachable_store_exits_non_zero_naming_it(tmp_path):
    result = cli_process.run(
        tmp_path, "watch", "--once", "--endpoint", "http://127.0.0.1:9", timeout=120,
        AWS_ENDPOINT_URL_S3="http://127.0.0.1:9",
    )  # fmt: skip
    assert result.returncode == 1
    assert "error: cannot reach bucket 'tfx-pipeline'" in result.stderr
    assert "http://127.0.0.1:9" in result.stderr


def test_the_cronjob_pins_its_image_takes_credentials_from_the_secret_and_polls_once():
    documents = list(yaml.safe_load_all(CRONJOB.read_text()))
    by_kind = {doc["kind"]: doc for doc in documents}
    assert set(by_kind) == {"ServiceAccount", "Role", "RoleBinding", "CronJob"}
    binding = by_kind["RoleBinding"]  # the release's Role, for the watch's account
    assert binding["roleRef"]["name"] == by_kind["Role"]["metadata"]["name"]
    account = by_kind["ServiceAccount"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    cronjob = by_kind["CronJob"]["spec"]
    assert cronjob["concurrencyPolicy"] == "Forbid"
    assert isinstance(cronjob["startingDeadlineSeconds"], int)
    pod = cronjob["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == by_kind["ServiceAccount"]["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    defaults = PipelineConfig.load(environ={})
    assert container["image"] == defaults.cpu_image
    check_values("watch-cronjob.yaml", {"cpu_image": container["image"]})  # an exact tag

    command = container["command"]
    assert command[:3] == ["tkp", "watch", "--once"]
    args = build_parser().parse_args(command[1:])  # the CLI accepts exactly these arguments
    assert args.once and args.endpoint == "http://ml-pipeline.kubeflow.svc.cluster.local:8888"
    # No spec of its own: each run is of the pipeline's newest version, what CI uploaded last.
    assert args.package is None and args.experiment == "taxi-tips"
    # Multi-user KFP's credentials: a projected token where kfp_client reads one, rotated.
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    (token,) = [name for name, v in volumes.items() if "projected" in v]
    assert mounts[token]["mountPath"] == str(kfp_client.TOKEN_PATH.parent)
    (source,) = volumes[token]["projected"]["sources"]
    assert source["serviceAccountToken"]["path"] == kfp_client.TOKEN_PATH.name
    assert source["serviceAccountToken"]["audience"] == "pipelines.kubeflow.org"
    assert not any("configMap" in v for v in volumes.values())
    template = by_kind["CronJob"]["spec"]["jobTemplate"]["spec"]["template"]
    assert template["metadata"]["annotations"]["sidecar.istio.io/nativeSidecar"] == "true"

    env = {item["name"]: item for item in container["env"]}
    credentials = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL_S3",
                   "AWS_REGION"}  # fmt: skip
    assert {name for name in env if name.startswith("AWS_")} == credentials
    for name in credentials:
        assert "value" not in env[name]
        assert env[name]["valueFrom"]["secretKeyRef"] == {
            "name": defaults.credentials_secret,
            "key": name,
        }
    assert "envFrom" not in container
    resources = container["resources"]
    assert set(resources["requests"]) == set(resources["limits"]) == {"cpu", "memory"}
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
