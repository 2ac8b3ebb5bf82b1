"""The report's before figures and largest costs (pipelines/bench/bench_report.py) on results a
tiny bench cannot produce: the before side at the default rows and at 1M rows, parts skipped,
stock at unequal training steps. The tiny bench (test_bench.py) checks them on a real run."""

from __future__ import annotations

import copy

from pipelines.bench import bench_report

START_UP = "Kubeflow step start-up over bare import tensorflow (each step)"
FIRST = "first make run, wall seconds"
NOTHING_NEW = "nothing new, share of the first run"
EXAMPLE_GEN = "ExampleGen rows/s at 1,000,000 rows or more"
EVALUATOR = "Evaluator eval rows/s at 1,000,000 rows (about 200,000 eval rows) or more"


def _run(rows: int, wall: float, example_gen: float, evaluator: float) -> dict:
    return {"rows": rows, "wall_seconds": wall,
            "rows_per_second": {"ExampleGen": example_gen, "Evaluator": evaluator}}  # fmt: skip


def _results() -> dict:
    steps = {"ExampleGen": {"seconds": 2.0}, "Trainer": {"seconds": 10.0},
             "RunReport": {"seconds": 0.5}}  # fmt: skip
    return {
        "default_run": {"rows": 20000, "first_steps": steps, "first_wall_seconds": 40.0,
                        "first_training_steps": 100,
                        "first_accounting": {"parts": {"step Trainer": 10.0, "a": 3.0, "b": 1.0,
                                                       "c": 0.5}},
                        "nothing_new_accounting": {"parts": {"process start": 0.3}}},
        "before": {"commit": "abc1234",
                   "runs": {"20000": _run(20000, 80.0, 5000.0, 900.0),
                            "1000000": _run(1000000, 900.0, 4000.0, 800.0),
                            "2000000": _run(2000000, 1900.0, 3000.0, 850.0)},
                   "nothing_new": {"rows": 20000, "wall_seconds": 8.0}},
        "startup": {"steps": {"a": {"ratio": 1.2}},
                    "before": {"commit": "abc1234", "steps": {"a": {"ratio": 1.9},
                                                              "gone": {"ratio": 2.5}}}},
        "stock": {"steps": {"CsvExampleGen": {"seconds": 6.0}, "Trainer": {"seconds": 9.0}}},
        "stock_comparison": {"training_steps": {"ours": 100, "stock": 100, "equal": True}},
    }  # fmt: skip


def test_each_aim_gets_the_before_sides_figure_from_its_runs_of_the_same_rows():
    figures = bench_report.before_figures(_results())

    assert figures == {
        FIRST: 80.0,
        NOTHING_NEW: 8.0 / 80.0,
        EXAMPLE_GEN: 3000.0,  # the worst of its runs at 1M rows or more, as the aim takes ours
        EVALUATOR: 800.0,
        START_UP: 2.5,  # every step of its spec, one ours no longer has included
    }


def test_a_before_side_without_the_default_rows_or_a_large_run_gives_no_figure_for_them():
    results = _results()
    results["before"]["runs"] = {"1000": _run(1000, 30.0, 100.0, 50.0)}
    results["before"]["nothing_new"]["rows"] = 1000

    assert bench_report.before_figures(results) == {START_UP: 2.5}


def test_the_start_up_before_figure_stands_without_the_before_part_or_the_default_run():
    results = _results()
    del results["before"], results["default_run"]
    assert bench_report.before_figures(results) == {START_UP: 2.5}
    del results["startup"]["before"]
    assert bench_report.before_figures(results) == {}


def test_the_first_runs_costs_end_with_the_steps_together_and_stocks_at_equal_work_only():
    results = _results()
    costs = bench_report._largest_costs(results)[FIRST]
    assert costs == [["step Trainer", 10.0, "s"], ["a", 3.0, "s"], ["b", 1.0, "s"],
                     ["the steps together", 12.5, "s"],
                     [bench_report.STOCK_STEPS_COST, 15.0, "s"]]  # fmt: skip

    unequal = copy.deepcopy(results)
    unequal["stock_comparison"]["training_steps"] = {"ours": 100, "stock": 80, "equal": False}
    assert bench_report._largest_costs(unequal)[FIRST] == costs[:4]
