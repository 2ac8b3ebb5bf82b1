"""The baseline step: the last pushed version, or a marker saying there is none."""

from __future__ import annotations

from tfx.types import standard_artifacts

from components.steps.baseline import (
    BASELINE_VERSION_KEY,
    NO_BASELINE,
    NO_BASELINE_FILE,
    LatestPushedModelExecutor,
)


def _run(serving_root, tmp_path):
    baseline = standard_artifacts.Model()
    baseline.uri = str(tmp_path / "baseline_model")
    LatestPushedModelExecutor().Do(
        {"model": []},
        {"baseline_model": [baseline]},
        {"serving_root": str(serving_root), "model_name": "taxi-tips"},
    )
    return baseline


def test_without_a_pushed_version_the_artifact_still_holds_a_file_saying_so(tmp_path):
    baseline = _run(tmp_path / "serving", tmp_path)
    assert baseline.get_int_custom_property(BASELINE_VERSION_KEY) == NO_BASELINE
    marker = tmp_path / "baseline_model" / NO_BASELINE_FILE
    assert "No version was pushed under" in marker.read_text()


def test_the_highest_complete_version_is_copied(tmp_path):
    serving = tmp_path / "serving" / "taxi-tips"
    for version in (1, 2):
        (serving / str(version) / "variables").mkdir(parents=True)
        (serving / str(version) / "saved_model.pb").write_bytes(b"v%d" % version)
    (serving / "3").mkdir()  # half-written: no saved_model.pb yet
    baseline = _run(tmp_path / "serving", tmp_path)
    assert baseline.get_int_custom_property(BASELINE_VERSION_KEY) == 2
    copied = list((tmp_path / "baseline_model").rglob("saved_model.pb"))
    assert [p.read_bytes() for p in copied] == [b"v2"]
