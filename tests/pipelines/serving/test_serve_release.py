"""`tkp serve` during a release (components/base/release.py): the labels answer as TF Serving's
do (http_rest_api_handler.cc, server_core.cc GetModelVersionForLabel), a request without one gets
`stable`, a canary that fails to load leaves the labels in force, and `stable` never stops
answering while labels move. On the session's model of each tabular use case."""

from __future__ import annotations

import requests

from components.base import release, serving_state, storage
from components.base.config import PipelineConfig
from pipelines.serving import metrics, serving_sync
from pipelines.serving.routing import Router
from pipelines.serving.serving_client import ServingClient
from pipelines.watch import ReleaseJudge
from tests.pipelines.serving.served import frame_rows, judge_until, push, serving
from tests.pipelines.serving.test_serve_reload import Traffic, wait_until


def _get(url: str, path: str) -> tuple[int, dict]:
    response = requests.get(url + path, timeout=30)
    return response.status_code, response.json()


def test_labels_answer_during_a_release_and_stable_never_stops(
    object_store, tabular_use_case_model, tmp_path
):
    fn_args, eval_frame = tabular_use_case_model.fn_args, tabular_use_case_model.eval_frame
    model = tabular_use_case_model.model_name
    folder = f"s3://{object_store.new_bucket('release')}/serving/{model}"
    examples = tabular_use_case_model.to_examples(eval_frame.head(8), with_label=False)
    push(folder, model, fn_args.serving_model_dir, 1, examples)
    with serving(model, folder, tmp_path / "cache") as server:
        manager, said, url = server.manager, server.said, server.url
        client = ServingClient(url, model, use_case=tabular_use_case_model.name)
        traffic = Traffic(client, frame_rows(eval_frame.head(4)))  # unlabelled: stable
        try:
            push(folder, model, fn_args.serving_model_dir, 2, examples, mode="canary")
            wait_until(lambda: "Serving stable 1, canary 2 (loaded: 1, 2)." in said, "the canary")
            available = serving_sync.model_server_loaded(url, model)  # what the sidecar asks
            assert available(2) and not available(9)
            versions = [client.serving_version(label) for label in (None, "stable", "canary")]
            assert versions == [1, 1, 2]
            assert client.metadata(version=2)["model_spec"]["version"] == "2"
            rows = frame_rows(eval_frame.head(3))
            assert len(client.predict_examples(rows, label="canary")) == 3
            assert requests.post(url + f"/v1/models/{model}/labels/nope:predict",
                                 json={"instances": [1]}, timeout=30).json() == {
                "error": "Unrecognized servable version label: nope"}  # fmt: skip
            # GET status ignores the label (get_model_status_impl.cc): every version, any label.
            status, body = _get(url, f"/v1/models/{model}/labels/nope")
            assert status == 200 and [s["version"] for s in body["model_version_status"]] == [
                "2", "1"]  # fmt: skip

            # A canary that cannot load: the labels in force stay, and so does version 2.
            storage.copy_tree(f"{folder}/1", f"{folder}/3")
            storage.write_bytes(f"{folder}/3/saved_model.pb", b"not a SavedModel")
            release.release_pushed(folder, model, 3, 1, "canary", why="a broken push")
            expected = ("Labels not applied (canary -> 3: not loaded); the labels in force stay "
                        "(canary 2, stable 1).")  # fmt: skip
            wait_until(lambda: expected in said, "the canary's failure")
            assert client.serving_version("canary") == 2

            release.end_release(folder, model, "abort", "it does not load")
            wait_until(lambda: manager.labels == {"stable": 1}, "the abort")
            push(folder, model, fn_args.serving_model_dir, 4, examples, mode="canary")
            wait_until(lambda: manager.labels.get("canary") == 4, "the next canary")
            release.end_release(folder, model, "promote", "looks good")
            wait_until(lambda: manager.labels == {"stable": 4}, "the promotion")
            assert client.serving_version() == 4
            answered = traffic.answered
            wait_until(lambda: traffic.answered > answered + 3, "answers after the promotion")
        finally:
            traffic.stop()
    assert traffic.failures == []
    state = serving_state.read(folder, model)
    assert (state.labels, state.loaded) == ({"stable": 4}, (1, 4))  # 1 kept for a rollback


def test_the_canary_gets_its_share_of_unlabelled_requests_spread_evenly():
    router = Router()
    router.release = {"mode": "canary", "policy": {"canary_percent": 30}}
    picks = [router.routed_version()[0] for _ in range(100)]
    assert picks.count("canary") == 30 and "canary" in picks[:4]  # spread, not bunched
    router.release = {"mode": "shadow", "policy": {"canary_percent": 30}}
    assert {router.routed_version() for _ in range(10)} == {("stable", True)}
    router.release = None
    assert router.routed_version() == ("stable", False)
    router.stop()


class _Labels(dict):
    def __hash__(self) -> int:
        return hash(tuple(sorted(self.items())))


def _samples(text: str) -> dict:
    """(sample name, labels): value, from a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (sample.name, _Labels(sample.labels)): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _decided(judge, folder: str, model: str):
    """`watch`'s release check at each of its polls, until the release ends."""
    judge_until(lambda: not serving_state.read(folder, model).release, "the verdict", judge, 120)
    return serving_state.read(folder, model)


def test_releases_are_judged_on_live_figures_promoted_or_aborted_and_stable_never_fails(
    object_store, tabular_use_case_model, tmp_path
):
    """A canary with a 30 % share is promoted on its live figures; the next canary, failing
    half its requests by a fault drill, is aborted automatically; a shadow canary failing every
    copy never reaches a client and is aborted too. Requests at the `stable` label never fail."""
    fn_args, eval_frame = tabular_use_case_model.fn_args, tabular_use_case_model.eval_frame
    model = tabular_use_case_model.model_name
    bucket = object_store.new_bucket("live")
    examples = tabular_use_case_model.to_examples(eval_frame.head(8), with_label=False)
    rows = frame_rows(eval_frame.head(2))
    with serving(model, f"s3://{bucket}/serving/{model}", tmp_path / "cache") as server:
        config = PipelineConfig.load({
            "use_case": tabular_use_case_model.name, "serving_root": f"s3://{bucket}/serving",
            "release_mode": "canary", "canary_percent": "30", "release_min_requests": "40",
            "release_min_minutes": "0", "release_metrics_url": server.url + metrics.PATH,
            # Two client threads and the server share two cores: a p99 over 40 requests is noise
            # here (the latency rule is tested in tests/base/test_live_release.py).
            "release_max_p99_ratio": "10",
        }, environ={})  # fmt: skip
        folder, manager = config.serving_model_dir, server.manager
        push(folder, model, fn_args.serving_model_dir, 1, examples, config.release_policy())
        client = ServingClient(server.url, model, use_case=tabular_use_case_model.name)
        wait_until(lambda: client.serving_version() == 1, "version 1")
        on_stable, unlabelled = Traffic(client, rows, "stable"), Traffic(client, rows)
        judge = ReleaseJudge(config)
        try:
            push(folder, model, fn_args.serving_model_dir, 2, examples, config.release_policy())
            wait_until(lambda: manager.router.release is not None, "the release in force")
            state = _decided(judge, folder, model)
            assert (state.labels, state.change["what"]) == (
                {"stable": 2},
                "promotion",
            ), state.change
            live = state.change["figures"]
            assert live["canary"]["requests"] >= 40 and live["canary"]["error_rate"] == 0
            text = requests.get(server.url + metrics.PATH, timeout=30).text
            samples = _samples(text)
            canary = {"model_name": model, "version": "2", "label": "canary", "code": "200"}
            assert samples[("tkp_serving_requests_total", _Labels(canary))] >= 40
            # TF Serving's own counter, named as its exporter writes it (the parser adds _total).
            tf_serving = f':tensorflow:serving:request_count{{model_name="{model}",status="OK"}} '
            assert tf_serving in text
            ok = _Labels(model_name=model, status="OK")
            assert samples[(":tensorflow:serving:request_count_total", ok)] > 40

            manager.router.drill(3, error_share=0.5)  # before it can answer anything
            push(folder, model, fn_args.serving_model_dir, 3, examples, config.release_policy())
            state = _decided(judge, folder, model)
            assert (state.labels, state.change["what"]) == ({"stable": 2}, "abort")
            assert state.change["figures"]["canary"]["error_rate"] >= 0.4
            assert "error rate" in state.change["why"]

            # Once `tkp serve` has applied the abort, no unlabelled request reaches version 3.
            wait_until(lambda: manager.router.release is None and 3 not in manager.loaded,
                       "the abort applied")  # fmt: skip
            shadow = {**config.release_policy(), "mode": "shadow"}
            failed_before = len(unlabelled.failures)
            manager.router.drill(4, error_share=1.0)
            push(folder, model, fn_args.serving_model_dir, 4, examples, shadow)
            state = _decided(judge, folder, model)
            assert (state.labels, state.change["what"]) == ({"stable": 2}, "abort")
            assert state.change["figures"]["canary"]["error_rate"] == 1.0
            assert len(unlabelled.failures) == failed_before  # every client got stable's answer
        finally:
            on_stable.stop()
            unlabelled.stop()
    assert on_stable.failures == [] and on_stable.answered > 20
    whats = [s.change["what"] for s in serving_state.history(folder)]
    assert whats == ["push", "canary", "promotion", "canary", "abort", "canary", "abort"]
