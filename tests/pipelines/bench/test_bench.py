"""`tkp bench`: every part runs on tiny data and its report says what it measured; the Beam
options the README gives for Flink, Spark and Dataflow are options Beam's own parser knows; and
the pipeline's Beam steps run through Beam's portable Job API (its local job service, the API
that Flink's and Spark's job servers implement)."""

from __future__ import annotations

import json
import re

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from components.base.config import REPO_ROOT, PipelineConfig, parse_assignments
from components.steps.beam_dependencies import workers_are_local
from pipelines.bench import bench_report
from pipelines.bench.suite import PARTS, TINY
from pipelines.local import run_phases
from tests.pipelines import cli_process


def _readme_beam_options() -> list[list[str]]:
    readme = (REPO_ROOT / "README.md").read_text()
    block = readme.split("<!-- beam-options:", 1)[1].split("```", 2)[1]
    lines = [line for line in block.splitlines() if line.startswith("--")]
    return [PipelineConfig.load(parse_assignments([f"beam_args={line}"])).beam_args
            for line in lines]  # fmt: skip


def test_the_readme_beam_options_are_known_to_beams_parser():
    option_sets = _readme_beam_options()
    runners = set()
    for flags in option_sets:
        parsed = PipelineOptions(flags=flags).get_all_options(retain_unknown_options=False)
        for flag in flags:
            name, _, value = flag[2:].partition("=")
            known = parsed.get(name)
            assert known is not None, f"{flag}: not a Beam option"
            assert value in (str(known), json.dumps(known)) or value in known, flag
        runners.add(parsed.get("runner") or "DirectRunner")
    assert {"DirectRunner", "PortableRunner", "DataflowRunner"} <= runners
    # TFX stages its own package for remote workers only (components/steps/beam_dependencies.py).
    local = [workers_are_local(list(flags)) for flags in option_sets]
    assert local == [True, True, True, True, False]  # Flink, Spark: EXTERNAL, the step image
    assert workers_are_local(["--runner=PortableRunner", "--environment_type=LOOPBACK"])


def test_bench_tiny_runs_every_part_and_reports_it(tmp_path):
    report = tmp_path / "report"
    bench = cli_process.run(tmp_path, "bench", "--tiny", "--repeats", "1", "--skip", "beam",
                            "--report-dir", str(report), timeout=1800)  # fmt: skip
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    results = json.loads((report / "results.json").read_text())
    run = results["end_to_end"]["1000"]
    assert set(run["rows_per_second"]) == {"ExampleGen", "StatisticsGen", "Transform", "Evaluator"}
    assert run["training"]["steps"] == 40 and run["training"]["examples_per_second"] > 0
    assert all(step["seconds"] > 0 and step["ran"] for step in run["steps"].values())
    assert run["steps"]["Trainer"]["peak_gb"] > 0.2  # TensorFlow alone takes more
    assert 0 < run["rows_read"]["Evaluator"] < run["rows_read"]["ExampleGen"] == 1000
    default = results["default_run"]
    # bench.TINY's gate refuses no model (it once kept the default max_auc_drop=0.01, and a
    # 40-step model fell 0.016 below the one before it): both runs push, whatever the training.
    assert {"min_auc": "0", "min_accuracy": "0", "max_auc_drop": "1"}.items() <= TINY.items()
    assert default["first_pushed"] and default["new_span_pushed"]
    assert default["nothing_new_fraction"] < 0.5
    assert set(results["stock"]["steps"]) >= {"CsvExampleGen", "Transform", "Evaluator"}
    assert results["stock"]["pushed"]
    assert results["startup"]["bare_import_tensorflow"]["seconds"] > 0
    assert results["startup"]["steps"]
    assert results["trainer_input"] and results["serving"]
    markdown = (report / "results.md").read_text()
    for heading in ("## The aims", "## End to end", "## The default run",
                    "## Ours against stock TFX", "## The images use case", "## Before and after",
                    "## What bounds the Evaluator",
                    "## Kubeflow step start-up", "## Trainer input and serving"):  # fmt: skip
        assert heading in markdown
    assert "## Beam runners" not in markdown  # skipped parts are not made up
    assert (report / "time-per-step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.search(r"commit [0-9a-f]{7}", markdown)
    assert "RunReport" in markdown.split("## The aims")[0]  # the DAG it measured, every step
    assert "largest costs (this run)" in markdown
    assert "× bare before" in markdown
    assert f"before ({results['before']['commit']}, this run)" in markdown  # the aims' column
    _check_derived_figures(results)
    _check_every_number_is_measured(markdown, results)


def _close(stated: float, computed: float, tolerance: float = 1e-6) -> bool:
    return abs(stated - computed) <= tolerance * max(1.0, abs(computed))


def _check_derived_figures(results: dict) -> None:
    """Every ratio and throughput, recomputed from the raw seconds and counts."""
    runs = results["end_to_end"]
    for run in runs.values():
        for step, rate in run["rows_per_second"].items():
            assert _close(rate, run["rows_read"][step] / run["steps"][step]["seconds"]), step
        training = run["training"]
        assert _close(training["examples_per_second"], training["steps"]
                      * training["global_batch"] / run["steps"]["Trainer"]["seconds"])  # fmt: skip
    small, large = results["cost_per_row_ratio"]["sizes"]
    a, b = runs[str(large)], runs[str(small)]
    for step, ratio in results["cost_per_row_ratio"]["by_step"].items():
        if step == "data steps":
            continue
        per_row = [r["steps"][step]["seconds"] / r["rows_read"][step] for r in (a, b)]
        assert _close(ratio, per_row[0] / per_row[1]), step
    default = results["default_run"]
    assert default["nothing_new_wall_seconds"] in default["nothing_new_runs"]
    assert _close(default["nothing_new_fraction"],
                  default["nothing_new_wall_seconds"] / default["first_wall_seconds"])  # fmt: skip
    # Each run with nothing new after a run was answered from that run's record, the store not
    # started; the run without the record started it to check.
    assert all(default["nothing_new_recalled"]), default["nothing_new_recalled"]
    assert default["nothing_new_recalled_runs"] == len(default["nothing_new_runs"])
    assert "object store start" not in default["nothing_new_phases"]
    assert default["nothing_new_checked_phases"]["object store start"] > 0
    for which in ("first", "nothing_new", "nothing_new_checked"):
        accounted = default[f"{which}_accounting"]
        parts = accounted["parts"]
        assert _close(sum(parts.values()), default[f"{which}_wall_seconds"]), which
        # Phases do not overlap, and exit is what is left: small (a phase that misses work, such
        # as an import between two phases, fails this), never negative beyond the resolution of
        # the process's start time (the kernel counts it in whole clock ticks).
        tick = run_phases.clock_tick_seconds()
        small = max(2.0, 0.05 * accounted["wall_seconds"])
        assert -tick <= parts[bench_report.UNACCOUNTED] < small, parts
        assert parts["process start and CLI imports"] > 0
    first = default["first_accounting"]["parts"]
    assert _close(first["step Trainer"], default["first_steps"]["Trainer"]["seconds"])
    assert first[bench_report.BETWEEN_STEPS] >= 0
    compared = results["stock_comparison"]
    assert compared["training_steps"] == {"ours": 40, "stock": 40, "equal": True}
    for row in compared["steps"].values():
        if row["ratio"] is not None:
            assert _close(row["ratio"], row["ours"] / row["stock"])
            assert min(row["ours"], row["stock"]) >= bench_report.RATIO_FLOOR_SECONDS
    assert compared["steps"]["Trainer"]["ratio"] is not None
    stated = [row["ratio"] for row in compared["steps"].values() if row["ratio"] is not None]
    assert compared["ratio_range"] == [min(stated), max(stated)]
    bare = results["startup"]["bare_import_tensorflow"]["seconds"]
    for name, step in results["startup"]["steps"].items():
        assert _close(step["ratio"], step["seconds"] / bare, tolerance=0.01), name
    for images in results["images"]["end_to_end"].values():  # two sizes, as for rows
        for step, rate in images["rows_per_second"].items():
            assert _close(rate, images["rows_read"][step] / images["steps"][step]["seconds"])
        training, trainer = images["training"], images["steps"]["Trainer"]["seconds"]
        assert training["steps"] == 40
        rate = training["steps"] * training["global_batch"] / trainer
        assert _close(training["examples_per_second"], rate)
    bound = results["evaluator"]  # the largest run's eval split, each variant measured
    assert bound["eval_rows"] == runs["1000"]["rows_read"]["Evaluator"] > 0
    assert bound["step_seconds"] == runs["1000"]["steps"]["Evaluator"]["seconds"]
    assert len(bound["variants"]) == 4
    for variant in bound["variants"].values():
        assert _close(variant["eval_rows_per_second"], bound["eval_rows"] / variant["seconds"])
    # The before side: the same 1,000 rows on an older commit, run in this bench run.
    compared = results["before_after"]["1000"]
    before, after = results["before"]["runs"]["1000"], runs["1000"]
    assert _close(compared["wall"]["ratio"], after["wall_seconds"] / before["wall_seconds"])
    for step, row in compared["steps"].items():
        assert row["before"] == before["steps"][step]["seconds"], step
        if row["ratio"] is not None:
            assert _close(row["ratio"], after["steps"][step]["seconds"] / row["before"]), step
    again = results["before_after"]["nothing new"]
    assert again["before"] == results["before"]["nothing_new"]["wall_seconds"]
    assert _close(again["ratio"], default["nothing_new_wall_seconds"] / again["before"])
    assert again["after_checked"] == default["nothing_new_checked_wall_seconds"]
    assert _close(again["ratio_checked"], again["after_checked"] / again["before"])
    assert _close(
        default["nothing_new_checked_fraction"],
        default["nothing_new_checked_wall_seconds"] / default["first_wall_seconds"],
    )
    rate = compared["rows_per_second"]["ExampleGen"]
    assert _close(rate["before"], 1000 / before["steps"]["ExampleGen"]["seconds"])
    aims = {aim["aim"]: aim for aim in results["aims"]}
    made = aims["first make run, wall seconds"]
    assert made["figure"] == default["first_wall_seconds"]
    assert made["met"] == (made["figure"] <= made["limit"])
    worst = max(s["ratio"] for s in results["startup"]["steps"].values())
    started = aims["Kubeflow step start-up over bare import tensorflow (each step)"]
    assert started["figure"] == worst
    # Start-up before: the before commit's spec and code, each over its own rounds' bare import.
    then = results["startup"]["before"]
    assert then["commit"] == results["before"]["commit"] and then["steps"]
    for name, step in then["steps"].items():
        bare_then = then["bare_import_tensorflow"]["seconds"]
        assert _close(step["ratio"], step["seconds"] / bare_then, tolerance=0.01), name
    assert started["before"] == max(s["ratio"] for s in then["steps"].values())
    # --tiny's before side runs 1,000 rows alone: no before figure for the 2,000-row default run
    # (nor its run with nothing new), none for cost per row, none at 1M rows.
    assert [aim["aim"] for aim in results["aims"] if aim["before"] is not None] == [
        "Kubeflow step start-up over bare import tensorflow (each step)"
    ]
    # A tiny run has no 1M rows: that aim says "not measured", not a figure from elsewhere.
    assert aims["ExampleGen rows/s at 1,000,000 rows or more"]["figure"] is None
    evaluated = aims["Evaluator eval rows/s at 1,000,000 rows (about 200,000 eval rows) or more"]
    assert evaluated["figure"] is None and evaluated["largest_costs"] == []
    # What stands in an aim's way is the run's own largest costs, largest first.
    parts = default["first_accounting"]["parts"]
    largest = sorted(parts.values(), reverse=True)[:3]
    assert [cost[1] for cost in made["largest_costs"][:3]] == [round(v, 2) for v in largest]
    assert all(parts[name] == pytest.approx(value, abs=0.01)
               for name, value, _ in made["largest_costs"][:3])  # fmt: skip
    # Then what no start-up cut removes: the steps together, and stock TFX's at equal work.
    together = sum(step["seconds"] for step in default["first_steps"].values())
    theirs = sum(step["seconds"] for step in results["stock"]["steps"].values())
    assert made["largest_costs"][3:] == [
        ["the steps together", round(together, 2), "s"],
        [bench_report.STOCK_STEPS_COST, round(theirs, 2), "s"],
    ]
    slowest = max(
        results["startup"]["steps"], key=lambda n: results["startup"]["steps"][n]["ratio"]
    )
    beyond = results["startup"]["steps"][slowest]["imports_beyond_bare"]
    assert [cost[0] for cost in started["largest_costs"]] == [
        f"{slowest}: import {package} beyond the bare import's" for package in list(beyond)[:3]
    ]


def _numbers(value) -> list[float]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int | float):
        return [float(value)]
    if isinstance(value, dict):
        return [n for v in value.values() for n in _numbers(v)] + [
            float(k) for k in value if re.fullmatch(r"\d+", str(k))
        ]
    if isinstance(value, list):
        return [n for v in value for n in _numbers(v)]
    return []


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)] + [str(k) for k in value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def _check_every_number_is_measured(markdown: str, results: dict) -> None:
    """Each number in results.md is one of results.json's numbers as the report rounds it (a
    number typed by hand into the report fails), text from results.json aside (the machine's
    name, the step names, the settings' JSON)."""
    known = _numbers(results)
    text = markdown.replace(json.dumps(results.get("settings", {})), " ")
    for string in sorted(set(_strings(results)), key=len, reverse=True):
        if len(string) > 3:
            text = text.replace(string, " ")
    text = re.sub(r"[\w./-]*\.(png|py|json|md)\b|`[^`]*`|\d+-of-\d+", " ", text)
    for match in re.finditer(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)(%?)", text):
        token, percent = match.group(1).replace(",", ""), match.group(2)
        decimals = len(token.split(".")[1]) if "." in token else 0
        scale = 100 if percent else 1
        assert any(f"{n * scale:.{decimals}f}" == token for n in known), (
            f"results.md states {match.group(0)!r} (…{text[max(0, match.start() - 80):match.end()]}"
            "), which is no figure of results.json"
        )


@pytest.mark.parametrize("mode", ["portable-job-api-loopback"])
def test_the_beam_steps_run_through_the_portable_job_api(tmp_path, mode):
    report = tmp_path / "report"
    bench = cli_process.run(
        tmp_path, "bench", "--tiny", "--repeats", "1", "--report-dir", str(report),
        "--skip", ",".join(part for part in PARTS if part != "beam"),
        "--beam-modes", mode, timeout=900,
    )  # fmt: skip
    assert bench.returncode == 0, bench.stdout[-3000:] + bench.stderr[-3000:]
    seconds = json.loads((report / "results.json").read_text())["beam"]["modes"][mode]
    assert seconds["StatisticsGen"] > 0 and seconds["Transform"] > 0
