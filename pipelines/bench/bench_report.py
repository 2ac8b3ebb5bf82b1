"""The bench's report: bench/results.json (everything measured, and every figure derived from
it), bench/results.md (tables a person reads, every number in them one of results.json's) and
bench/time-per-step.png (seconds per step against rows).

Nothing in the report is typed by hand: the aims' table, the accounting of a run's wall time and
the comparison with stock TFX are computed from this bench run's figures by `derive`, which
stores what it computes in results.json, and tests/pipelines/bench/test_bench.py recomputes
them from the raw seconds and counts.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from components.base.config import REPO_ROOT
from pipelines.local.run_phases import clock_tick_seconds

# Stock TFX's node ids, by the step of ours that does the same work.
STOCK_NAMES = {
    "ExampleGen": "CsvExampleGen", "StatisticsGen": "StatisticsGen",
    "CuratedSchema": "ImportSchemaGen", "ExampleValidator": "ExampleValidator",
    "Transform": "Transform", "Trainer": "Trainer",
    "LatestPushedModel": "latest_blessed_model_resolver", "Evaluator": "Evaluator",
    "Pusher": "Pusher",
}  # fmt: skip
NOT_MEASURED = "not measured in this bench run"
# Steps shorter than this on either side are left out of a ratio: timer noise, not work.
RATIO_FLOOR_SECONDS = 0.05
# What the product aims at on this kind of machine (issue 30): (limit, "max" or "min", unit).
AIMS = {
    "first make run, wall seconds": (35.0, "max", "s"),
    "nothing new, share of the first run": (0.05, "max", "share"),
    "cost per row, largest size over the smaller (each data step)": (1.2, "max", "ratio"),
    "ExampleGen rows/s at 1,000,000 rows or more": (25_000.0, "min", "rows/s"),
    # The "200k eval rows": the eval split of a 1M-row span (about a fifth, by hash).
    "Evaluator eval rows/s at 1,000,000 rows (about 200,000 eval rows) or more": (
        5_000.0,
        "min",
        "rows/s",
    ),
    "Kubeflow step start-up over bare import tensorflow (each step)": (1.3, "max", "ratio"),
}
LARGE_ROWS = 1_000_000
# Stock's DAG has no SelectSpans, Tuner or RunReport (pipelines/bench/bench_stock.py).
STOCK_STEPS_COST = "stock TFX's steps (its own DAG) on the same rows and training steps"
UNACCOUNTED = "process exit and what no phase covers"
BETWEEN_STEPS = "the runner between steps"


def machine() -> dict[str, Any]:
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1024**3
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               platform.processor())  # fmt: skip
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                            ":!bench"], cwd=REPO_ROOT, capture_output=True, text=True)  # fmt: skip
    dirty = dirty.stdout.strip()  # the report's own folder does not count
    return {
        "cpus": os.cpu_count(), "cpu": cpu, "memory_gb": round(memory_gb, 1),
        "python": platform.python_version(), "system": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit + ("+changes" if dirty else ""),
        "clock_tick_seconds": clock_tick_seconds(),  # how well a process's start is known
    }  # fmt: skip


def write(results: dict[str, Any], report_dir: Path) -> None:
    results = {"machine": results.get("machine") or machine(), **results}
    derive(results)
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    if "end_to_end" in results:
        chart(results["end_to_end"], report_dir / "time-per-step.png")
    (report_dir / "results.md").write_text(tables(results))


def derive(results: dict[str, Any]) -> None:
    """The figures computed from the measured ones, stored in `results`: the wall accounting of
    the default run, the comparison with stock TFX and the aims."""
    d = results.get("default_run")
    if d:
        d["first_accounting"] = accounting(d["first_wall_seconds"], d.get("first_phases", {}),
                                           d["first_steps"])  # fmt: skip
        d["nothing_new_accounting"] = accounting(
            d["nothing_new_wall_seconds"], d.get("nothing_new_phases", {}), {}
        )
        d["nothing_new_recalled_runs"] = sum(d.get("nothing_new_recalled", []))
        if "nothing_new_checked_wall_seconds" in d:
            d["nothing_new_checked_accounting"] = accounting(
                d["nothing_new_checked_wall_seconds"], d["nothing_new_checked_phases"], {}
            )
        if results.get("stock"):
            results["stock_comparison"] = stock_comparison(d, results["stock"])
    if results.get("before"):
        results["before_after"] = before_after(results)
    results["aims"] = aims(results)


def before_after(results: dict[str, Any]) -> dict:
    """Each size the before commit ran, against this commit's run of the same rows in this bench
    run (its end-to-end run, else its default first run): each step's seconds, the data steps'
    rows read per second, the peak memory and the wall, with after / before."""
    out = {}
    for key, old in results["before"]["runs"].items():
        new = results.get("end_to_end", {}).get(key)
        d = results.get("default_run")
        if new is None and d and str(d["rows"]) == key:
            new = {"steps": d["first_steps"], "wall_seconds": d["first_wall_seconds"],
                   "rows_read": d["first_rows_read"]}  # fmt: skip
        if new is None:
            continue
        steps = {}
        for step, was in old["steps"].items():
            now = new["steps"].get(step, {}).get("seconds")
            comparable = now is not None and min(now, was["seconds"]) >= RATIO_FLOOR_SECONDS
            steps[step] = {"before": was["seconds"], "after": now,
                           "ratio": now / was["seconds"] if comparable else None}  # fmt: skip
        rates = {s: {"before": old["rows_read"][s] / old["steps"][s]["seconds"],
                     "after": new["rows_read"][s] / new["steps"][s]["seconds"]}
                 for s in old["rows_read"]}  # fmt: skip
        peak = {"before": max(s.get("peak_gb") or 0 for s in old["steps"].values()),
                "after": max(s.get("peak_gb") or 0 for s in new["steps"].values())}  # fmt: skip
        out[key] = {"steps": steps, "rows_per_second": rates, "peak_gb": peak,
                    "wall": {"before": old["wall_seconds"], "after": new["wall_seconds"],
                             "ratio": new["wall_seconds"] / old["wall_seconds"]}}  # fmt: skip
    old_again, d = results["before"].get("nothing_new"), results.get("default_run")
    if old_again and d:
        checked = d.get("nothing_new_checked_wall_seconds")
        out["nothing new"] = {
            "before": old_again["wall_seconds"], "after": d["nothing_new_wall_seconds"],
            "ratio": d["nothing_new_wall_seconds"] / old_again["wall_seconds"],
            "after_checked": checked,
            "ratio_checked": None if checked is None else checked / old_again["wall_seconds"],
            "rows": {"before": old_again["rows"], "after": d["rows"]},
        }  # fmt: skip
    return out


def accounting(wall: float, phases: dict[str, float], steps: dict[str, dict]) -> dict:
    """A run's wall time as its phases, the steps' phase split into each step and the runner
    between them, and what remains: exit and anything no phase covers."""
    parts: dict[str, float] = {}
    for phase, seconds in phases.items():
        if phase == "steps and the runner between them":
            step_seconds = {f"step {name}": s["seconds"] for name, s in steps.items()}
            parts.update(step_seconds)
            parts[BETWEEN_STEPS] = seconds - sum(step_seconds.values())
        else:
            parts[phase] = seconds
    parts[UNACCOUNTED] = wall - sum(parts.values())
    return {"wall_seconds": wall, "parts": parts}


def stock_comparison(default_run: dict, stock: dict) -> dict:
    """Ours against stock per step, on the same rows; the Trainer's ratio only when both trained
    the same number of steps (else it would compare work, not speed)."""
    ours_steps, theirs_steps = default_run.get("first_training_steps"), stock.get("training_steps")
    equal = ours_steps is not None and ours_steps == theirs_steps
    rows = {}
    for ours, theirs in STOCK_NAMES.items():
        a = default_run["first_steps"].get(ours, {}).get("seconds")
        b = stock["steps"].get(theirs, {}).get("seconds")
        comparable = (a is not None and b is not None and min(a, b) >= RATIO_FLOOR_SECONDS
                      and (ours != "Trainer" or equal))  # fmt: skip
        rows[ours] = {"stock_step": theirs, "ours": a, "stock": b,
                      "ratio": a / b if comparable else None}  # fmt: skip
    ratios = [row["ratio"] for row in rows.values() if row["ratio"] is not None]
    return {
        "steps": rows,
        "training_steps": {"ours": ours_steps, "stock": theirs_steps, "equal": equal},
        "ratio_range": [min(ratios), max(ratios)] if ratios else None,
        "ratio_floor_seconds": RATIO_FLOOR_SECONDS,
        "wall": {"ours": default_run["first_wall_seconds"], "stock": stock["wall_seconds"],
                 "ratio": default_run["first_wall_seconds"] / stock["wall_seconds"]},
    }  # fmt: skip


def aims(results: dict[str, Any]) -> list[dict]:
    """Each aim with the figure this run measured for it (None: not measured) and whether it is
    met; a figure over several steps is the worst of them."""
    figures: dict[str, float | None] = dict.fromkeys(AIMS)
    d = results.get("default_run")
    if d:
        figures["first make run, wall seconds"] = d["first_wall_seconds"]
        figures["nothing new, share of the first run"] = d["nothing_new_fraction"]
    ratio = results.get("cost_per_row_ratio")
    if ratio:
        figures["cost per row, largest size over the smaller (each data step)"] = max(
            v for step, v in ratio["by_step"].items() if step != "data steps"
        )
    e2e = results.get("end_to_end", {})
    large = [run for run in e2e.values() if run["rows"] >= LARGE_ROWS]
    if large:
        figures["ExampleGen rows/s at 1,000,000 rows or more"] = min(
            run["rows_per_second"]["ExampleGen"] for run in large
        )
    if large:
        figures["Evaluator eval rows/s at 1,000,000 rows (about 200,000 eval rows) or more"] = min(
            run["rows_per_second"]["Evaluator"] for run in large
        )
    start = results.get("startup")
    if start and start["steps"]:
        figures["Kubeflow step start-up over bare import tensorflow (each step)"] = max(
            s["ratio"] for s in start["steps"].values()
        )
    costs, earlier = _largest_costs(results), before_figures(results)
    out = []
    for aim, (limit, kind, unit) in AIMS.items():
        figure = figures[aim]
        met = None if figure is None else (figure <= limit if kind == "max" else figure >= limit)
        out.append({"aim": aim, "limit": limit, "kind": kind, "unit": unit, "figure": figure,
                    "met": met, "before": earlier.get(aim),
                    "largest_costs": costs.get(aim, [])})  # fmt: skip
    return out


def before_figures(results: dict[str, Any]) -> dict[str, float]:
    """Each aim's figure on the before commit, from its runs in this bench run. An aim it has
    no run for is left out: cost per row (its runs are the default rows and the largest size,
    not the end-to-end sizes the ratio divides), the 1M-row aims without --large."""
    before, d = results.get("before") or {"runs": {}}, results.get("default_run")
    out: dict[str, float] = {}
    first = before["runs"].get(str(d["rows"])) if d else None
    if first:
        out["first make run, wall seconds"] = first["wall_seconds"]
        again = before.get("nothing_new")
        if again and again["rows"] == d["rows"]:
            out["nothing new, share of the first run"] = (
                again["wall_seconds"] / first["wall_seconds"]
            )
    large = [run for run in before["runs"].values() if run["rows"] >= LARGE_ROWS]
    if large:
        out["ExampleGen rows/s at 1,000,000 rows or more"] = min(
            run["rows_per_second"]["ExampleGen"] for run in large
        )
        out["Evaluator eval rows/s at 1,000,000 rows (about 200,000 eval rows) or more"] = min(
            run["rows_per_second"]["Evaluator"] for run in large
        )
    then = (results.get("startup") or {}).get("before")
    if then and then["steps"]:
        out["Kubeflow step start-up over bare import tensorflow (each step)"] = max(
            s["ratio"] for s in then["steps"].values()
        )
    return out


def _largest_costs(results: dict[str, Any], top: int = 3) -> dict[str, list[list]]:
    """Per aim, what this run measured as its largest costs ([what, figure, unit], largest
    first): where a missed aim's time goes, from the same figures the report shows."""
    costs: dict[str, list[list]] = {}

    def largest(parts: dict[str, float]) -> list[list]:
        ranked = sorted(parts.items(), key=lambda item: -item[1])[:top]
        return [[name, round(seconds, 2), "s"] for name, seconds in ranked]

    d = results.get("default_run")
    if d and "first_accounting" in d:
        # Then the steps alone (what no start-up cut removes) and stock TFX's at equal work.
        steps = sum(step["seconds"] for step in d["first_steps"].values())
        costs["first make run, wall seconds"] = largest(d["first_accounting"]["parts"]) + [
            ["the steps together", round(steps, 2), "s"]
        ]
        compared = results.get("stock_comparison")
        if compared and compared["training_steps"]["equal"]:
            theirs = sum(step["seconds"] for step in results["stock"]["steps"].values())
            costs["first make run, wall seconds"].append([STOCK_STEPS_COST, round(theirs, 2), "s"])
        costs["nothing new, share of the first run"] = largest(d["nothing_new_accounting"]["parts"])
    ratio = results.get("cost_per_row_ratio")
    if ratio:
        by_step = {k: v for k, v in ratio["by_step"].items() if k != "data steps"}
        ranked = sorted(by_step.items(), key=lambda item: -item[1])[:top]
        costs["cost per row, largest size over the smaller (each data step)"] = [
            [step, round(value, 2), "ratio"] for step, value in ranked
        ]
    bound = results.get("evaluator")
    if bound and bound["rows"] >= LARGE_ROWS:  # the aim's size; a smaller run's bound is not it
        ranked = sorted(bound["variants"].items(), key=lambda item: item[1]["seconds"])
        costs["Evaluator eval rows/s at 1,000,000 rows (about 200,000 eval rows) or more"] = [
            [f"TFMA, {variant}", round(v["eval_rows_per_second"]), "rows/s"]
            for variant, v in ranked
        ]  # the fastest first: what TFMA allows with its work taken away
    start = results.get("startup")
    if start and start["steps"]:
        name, step = max(start["steps"].items(), key=lambda item: item[1]["ratio"])
        costs["Kubeflow step start-up over bare import tensorflow (each step)"] = [
            [f"{name}: import {package} beyond the bare import's", seconds, "s"]
            for package, seconds in list(step.get("imports_beyond_bare", {}).items())[:top]
        ]
    return costs


def chart(runs: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no screen
    from matplotlib import pyplot

    sizes = sorted(runs, key=int)
    steps = [s for s in runs[sizes[0]]["steps"] if runs[sizes[0]]["steps"][s]["seconds"] >= 0.5]
    figure, axes = pyplot.subplots(figsize=(7, 4.5))
    for step in steps:
        axes.plot([int(n) for n in sizes], [runs[n]["steps"][step]["seconds"] for n in sizes],
                  marker="o", label=step)  # fmt: skip
    axes.plot([int(n) for n in sizes], [runs[n]["wall_seconds"] for n in sizes], marker="s",
              linestyle="--", color="black", label="whole run (wall)")  # fmt: skip
    axes.set_xscale("log")
    axes.set_xlabel("rows in the span")
    axes.set_ylabel("seconds")
    axes.set_title("Time per step against rows (tkp bench)")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def tables(results: dict[str, Any]) -> str:
    m = results["machine"]
    out = [f"# Bench results (`make bench`)\n\n{m['date']}, commit {m['commit']}; {m['cpus']} "
           f"CPUs ({m['cpu']}), {m['memory_gb']} GB memory, Python {m['python']}, "
           f"{m['system']}. Settings: {json.dumps(results.get('settings', {}))}.\n\n"
           "Every figure below is in results.json and comes from this bench run; ratios are "
           "of figures measured side by side in it.\n\n"]  # fmt: skip
    d = results.get("default_run")
    if d:
        out.append(f"The DAG measured (the default run's steps, in order): "
                   f"{', '.join(d['first_steps'])}.\n\n")  # fmt: skip
    out.append("## The aims\n\n")
    commit = ((results.get("before") or (results.get("startup") or {}).get("before") or {})
              .get("commit", "the before commit"))  # fmt: skip
    rows = [[a["aim"], ("≤ " if a["kind"] == "max" else "≥ ") + _figure(a["limit"], a["unit"]),
             NOT_MEASURED if a["figure"] is None else _figure(a["figure"], a["unit"]),
             "-" if a.get("before") is None else _figure(a["before"], a["unit"]),
             "-" if a["met"] is None else ("yes" if a["met"] else "**no**"),
             "; ".join(_cost(*cost) for cost in a["largest_costs"])]
            for a in results["aims"]]  # fmt: skip
    out.append(_table(["aim", "limit", "this run", f"before ({commit}, this run)", "met",
                       "largest costs (this run)"], rows))  # fmt: skip
    out.append("\nThe before column: the same figure from the before commit's runs in this "
               "bench run (its first runs of the default rows and the largest size, its one run "
               "with nothing new, beside this commit's median, answered from the record: the "
               "before and after section shows both this commit's kinds of such a run, its "
               "compiled spec's step start-up); '-' where it has no run "
               "for it. The last column: the run's largest parts of the wall time, then the steps "
               "together and stock TFX's steps at equal work (what no start-up cut removes); "
               "the steps' worst cost-per-row ratios; TFMA on the eval split with its work taken "
               "away (the Evaluator's section below); the imports that cost the slowest-starting "
               "step most beyond a bare `import tensorflow`.\n\n")  # fmt: skip
    e2e = results.get("end_to_end")
    if e2e:
        sizes = sorted(e2e, key=int)
        steps = list(e2e[sizes[0]]["steps"])
        out.append(
            "## End to end\n\nSeconds per step (peak memory of the run's process while "
            "the step ran, GB); wall: the `tkp run` process, start-up included.\n\n"
        )
        rows = [[step] + [f"{e2e[n]['steps'][step]['seconds']:.1f} "
                          f"({e2e[n]['steps'][step]['peak_gb'] or 0:.2f})" for n in sizes]
                for step in steps]  # fmt: skip
        rows.append(["**wall**"] + [f"**{e2e[n]['wall_seconds']:.1f}**" for n in sizes])
        out.append(_table(["step"] + [f"{int(n):,} rows" for n in sizes], rows))
        rows = [[step] + [f"{e2e[n]['rows_per_second'][step]:,.0f}" for n in sizes]
                for step in e2e[sizes[0]]["rows_per_second"]]  # fmt: skip
        if all("training" in e2e[n] for n in sizes):
            rows.append(["Trainer (examples/s)"] + [
                f"{e2e[n]['training']['examples_per_second']:,.0f} "
                f"({e2e[n]['training']['steps']} steps)" for n in sizes])  # fmt: skip
        out.append("\nThroughput: rows the step reads per second of the step (ExampleGen, "
                   "StatisticsGen and Transform: the span; the Evaluator: the eval split, rows "
                   "below); the Trainer trains a set number of steps whatever the rows, so its "
                   "figure is training examples (steps x global batch) per second of the step, "
                   "set-up and export included.\n\n")  # fmt: skip
        rows.append(["Evaluator's eval rows"]
                    + [f"{e2e[n]['rows_read']['Evaluator']:,}" for n in sizes])  # fmt: skip
        out.append(_table(["step"] + [f"{int(n):,} rows" for n in sizes], rows))
        ratio = results.get("cost_per_row_ratio")
        if ratio:
            small, large = ratio["sizes"]
            out.append(f"\nCost per row read at {large:,} rows over the cost per row read at "
                       f"{small:,}, for the steps whose work grows with rows:\n\n")  # fmt: skip
            out.append(_table(["step", "ratio"],
                              [[s, f"{v:.2f}"] for s, v in ratio["by_step"].items()]))  # fmt: skip
        out.append("\n![time per step](time-per-step.png)\n")
    d = results.get("default_run")
    if d:
        out.append(f"\n## The default run (`make run`, {d['rows']:,} rows)\n\n")
        out.append(_table(["run", "wall seconds"], [
            [f"first run (pushed: {d.get('first_pushed')})", f"{d['first_wall_seconds']:.1f}"],
            [f"nothing new (median of {len(d['nothing_new_runs'])})",
             f"{d['nothing_new_wall_seconds']:.1f} = {d['nothing_new_fraction']:.1%} of the first"],
            *([["nothing new, the store started to check",
                f"{d['nothing_new_checked_wall_seconds']:.1f} = "
                f"{d['nothing_new_checked_fraction']:.1%} of the first"]]
              if "nothing_new_checked_fraction" in d else []),
            [f"after one new span (pushed: {d['new_span_pushed']})",
             f"{d['new_span_wall_seconds']:.1f}"],
        ]))  # fmt: skip
    if d:
        out.append("\nWhere the wall time goes (seconds; each phase measured in the `tkp run` "
                   "process, the rest is the wall less them; the process's start is known to "
                   f"one clock tick, {m['clock_tick_seconds']:g} s, so that rest can read up to "
                   "one tick below zero):\n\n")  # fmt: skip
        first, again = d["first_accounting"]["parts"], d["nothing_new_accounting"]["parts"]
        checked = d.get("nothing_new_checked_accounting", {}).get("parts", {})
        names = list(dict.fromkeys([*first, *again, *checked]))
        rows = [[name, _s(first.get(name)), _s(again.get(name)), _s(checked.get(name))]
                for name in names]  # fmt: skip
        rows.append(["**wall**", _s(d["first_wall_seconds"]), _s(d["nothing_new_wall_seconds"]),
                     _s(d.get("nothing_new_checked_wall_seconds"))])  # fmt: skip
        recalled = d["nothing_new_recalled_runs"]
        out.append(_table(["part", "first run", "nothing new (the median run)",
                           "nothing new, the store started to check"], rows))  # fmt: skip
        out.append(f"\n{recalled} of the {len(d['nothing_new_runs'])} runs with nothing new were "
                   "answered from the last run's record, the object store not started (its folder"
                   " unchanged since); the last column is the run after any other command "
                   "started the store.\n")  # fmt: skip
    compared = results.get("stock_comparison")
    if compared:
        trained, floor = compared["training_steps"], compared["ratio_floor_seconds"]
        out.append(f"\n## Ours against stock TFX (same {d['rows']:,} rows, same user code)\n\n"
                   f"Training steps: ours {trained['ours']}, stock {trained['stock']} "
                   f"({'equal work' if trained['equal'] else 'unequal: no Trainer ratio'}). "
                   f"A ratio needs both sides at {floor} s or more.\n\n")  # fmt: skip
        rows = [[f"{ours} / {row['stock_step']}", _s(row["ours"]), _s(row["stock"]),
                 "-" if row["ratio"] is None else f"{row['ratio']:.2f}"]
                for ours, row in compared["steps"].items()]  # fmt: skip
        wall = compared["wall"]
        rows.append(["**wall** (process)", _s(wall["ours"]), _s(wall["stock"]),
                     f"{wall['ratio']:.2f}"])  # fmt: skip
        out.append(_table(["step (ours / stock)", "ours s", "stock s", "ours / stock"], rows))
        if compared["ratio_range"]:
            low, high = compared["ratio_range"]
            out.append(f"\nPer step, ours / stock: {low:.2f} to {high:.2f}.\n")
    images = results.get("images")
    if images:
        runs = images["end_to_end"]
        sizes = sorted(runs, key=int)
        out.append("\n## The images use case (images per span)\n\nSeconds per step, and images "
                   "the step reads per second (the Evaluator: the eval split's); the Trainer: "
                   "training images (steps x global batch) per second of the step."
                   "\n\n")  # fmt: skip
        steps = list(runs[sizes[0]]["steps"])
        rows = [[step] + [f"{runs[n]['steps'][step]['seconds']:.1f}"
                          + (f" ({runs[n]['rows_per_second'][step]:,.0f}/s)"
                             if step in runs[n]["rows_per_second"] else "") for n in sizes]
                for step in steps]  # fmt: skip
        if all("training" in runs[n] for n in sizes):
            rows.append(["Trainer (training images/s)"] + [
                f"{runs[n]['training']['examples_per_second']:,.0f} "
                f"({runs[n]['training']['steps']} steps)" for n in sizes])  # fmt: skip
        rows.append(["Evaluator's eval images"]
                    + [f"{runs[n]['rows_read']['Evaluator']:,}" for n in sizes])  # fmt: skip
        rows.append(["**wall**"] + [f"**{runs[n]['wall_seconds']:.1f}**" for n in sizes])
        out.append(_table(["step"] + [f"{int(n):,} images" for n in sizes], rows))
    bound = results.get("evaluator")
    if bound:
        out.append(f"\n## What bounds the Evaluator ({bound['eval_rows']:,} eval rows of the "
                   f"{bound['rows']:,}-row run)\n\nTFX's Evaluator executor (TFMA) on that run's "
                   "eval split and model, each variant in a process of its own (the step took "
                   f"{bound['step_seconds']:.1f} s in the run, its verdict included). TFMA "
                   "computes metrics one example at a time in Python: the variant with one "
                   "counting metric and no slice is the rate its per-example path allows before "
                   "any of the step's metrics.\n\n")  # fmt: skip
        rows = [[variant, _s(v["seconds"]), f"{v['eval_rows_per_second']:,.0f}"]
                for variant, v in bound["variants"].items()]  # fmt: skip
        out.append(_table(["evaluation", "seconds", "eval rows/s"], rows))
    compared = results.get("before_after")
    if compared:
        commit = results["before"]["commit"]
        out.append(f"\n## Before and after (commit {commit} against this one, both run in this "
                   "bench run)\n\n")  # fmt: skip
        again = compared.get("nothing new")
        if again:
            rows = again["rows"]
            out.append(f"A run with nothing new: {again['before']:.1f} s before (the store "
                       f"started to check; {rows['before']:,} rows), {again['after']:.1f} s "
                       f"after ({again['ratio']:.2f}; answered from the record, "
                       f"{rows['after']:,} rows)"
                       + (f", {again['after_checked']:.1f} s after when the store must start to "
                          f"check ({again['ratio_checked']:.2f})"
                          if again.get("after_checked") is not None else "")
                       + ".\n\n")  # fmt: skip
        sizes = [key for key in compared if key.isdigit()]
        for key, c in sorted(((k, compared[k]) for k in sizes), key=lambda item: int(item[0])):
            out.append(f"{int(key):,} rows: wall {c['wall']['before']:.1f} s before, "
                       f"{c['wall']['after']:.1f} s after ({c['wall']['ratio']:.2f}); peak "
                       f"memory {c['peak_gb']['before']:.2f} GB before, "
                       f"{c['peak_gb']['after']:.2f} GB after.\n\n")  # fmt: skip
            rows = [[step, _s(v["before"]), _s(v["after"]),
                     "-" if v["ratio"] is None else f"{v['ratio']:.2f}",
                     *([f"{c['rows_per_second'][step]['before']:,.0f}",
                        f"{c['rows_per_second'][step]['after']:,.0f}"]
                       if step in c["rows_per_second"] else ["", ""])]
                    for step, v in c["steps"].items()]  # fmt: skip
            out.append(_table(["step", "before s", "after s", "after / before",
                               "rows/s before", "rows/s after"], rows) + "\n")  # fmt: skip
    start = results.get("startup")
    if start:
        bare = start["bare_import_tensorflow"]
        out.append("\n## Kubeflow step start-up (process start to the executor's first line)\n\n")
        out.append(
            "Imports: the seconds Python's import timing gives them (a run of its own; "
            "each module's own time, summed per top-level package), and the packages "
            "that cost a step most beyond what the bare import spends on them.\n\n"
        )
        before = start.get("before")
        then = before["steps"] if before else {}
        if before:
            out.append(
                f"Before: commit {before['commit']}'s compiled spec and step code, measured in "
                f"this run in rounds alternating with this commit's, each step over the bare "
                f"imports of its own side's rounds "
                f"({_s(before['bare_import_tensorflow']['seconds'])} s there).\n\n"
            )

        def earlier(name: str) -> list[str]:
            if not before:
                return []
            if name not in then:
                return ["", ""]
            return [_s(then[name]["seconds"]), f"{then[name]['ratio']:.2f}"]

        bare_then = [_s(before["bare_import_tensorflow"]["seconds"]), "1.00"] if before else []
        rows = [["bare `import tensorflow`", _s(bare["seconds"]), f"{bare['rss_mb']:.0f}", "1.00",
                 *bare_then, _s(bare.get("imports_seconds")), ""]]  # fmt: skip
        rows += [[name, _s(s["seconds"]), f"{s['rss_mb']:.0f}", f"{s['ratio']:.2f}",
                  *earlier(name), _s(s.get("imports_seconds")),
                  ", ".join(f"{package} {seconds:.2f}" for package, seconds
                            in s.get("imports_beyond_bare", {}).items())]
                 for name, s in start["steps"].items()]  # fmt: skip
        rows += [[name, "-", "-", "-", *earlier(name), "-", "(the before commit's spec alone)"]
                 for name in then if name not in start["steps"]]  # fmt: skip
        headers = ["step", "seconds", "memory MB", "× bare"]
        if before:
            headers += [f"seconds before ({before['commit']})", "× bare before"]
        out.append(_table([*headers, "imports s", "beyond the bare import (s)"], rows))
    beam = results.get("beam")
    if beam:
        out.append(f"\n## Beam runners ({beam['rows']:,} rows)\n\n")
        steps = [step for step in ("StatisticsGen", "Transform", "Evaluator")
                 if all(step in s for s in beam["modes"].values())]  # fmt: skip
        rows = [[mode, *(_s(s[step]) for step in steps)] for mode, s in beam["modes"].items()]
        out.append(_table(["mode", *(f"{step} s" for step in steps)], rows))
    out.append("\n## Trainer input and serving\n\n")
    trainer = results.get("trainer_input")
    if trainer:
        rate = trainer["examples_per_second"]
        out.append(f"Trainer input efficiency (`tkp bench-input`, {trainer['steps']} steps, median "
                   f"of {trainer['repeats']}): {rate['tfrecords']:,.0f} examples/s from the "
                   f"TFRecords through tf.data, {rate['in_memory']:,.0f} from memory: ratio "
                   f"{trainer['ratio']:.2f} (1.0: the model bounds the speed).\n\n")  # fmt: skip
    else:
        out.append(f"Trainer input efficiency: {NOT_MEASURED}.\n\n")
    serving = results.get("serving")
    if serving:
        out.append(f"Serving (`tkp bench-serving`, version {serving['version']}, "
                   f"{serving['requests']} requests each; `tkp serve` over HTTP without and with "
                   "batching, against the model called in process):\n\n")  # fmt: skip
        rows = [[r["examples"], r["concurrency"], r["serve"]["p50_ms"], r["serve"]["p99_ms"],
                 r["serve"]["per_second"], r["serve_batching"]["p50_ms"],
                 r["serve_batching"]["p99_ms"], r["serve_batching"]["per_second"],
                 r["in_process"]["p50_ms"], r["p50_ratio"]]
                for r in serving["runs"]]  # fmt: skip
        header = ["examples/request", "in flight", "serve p50 ms", "serve p99 ms",
                  "serve requests/s", "batched p50 ms", "batched p99 ms", "batched requests/s",
                  "in-process p50 ms", "p50 ratio"]  # fmt: skip
        out.append(_table(header, rows))
    else:
        out.append(f"Serving: {NOT_MEASURED}.\n")
    return "".join(out)


def _cost(what: str, figure: float, unit: str) -> str:
    """One of `_largest_costs`' entries as the aims' table shows it (units: s, ratio, rows/s)."""
    if unit == "rows/s":
        return f"{what} {figure:,.0f} rows/s"
    return f"{what} {figure:.2f}" + (" s" if unit == "s" else "")


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


def _figure(value: float, unit: str) -> str:
    """A figure as the aims' table shows it: a share as a percentage, rows/s with commas."""
    if unit == "share":
        return f"{value:.1%}"
    if unit == "rows/s":
        return f"{value:,.0f}"
    return f"{value:.1f}" if unit == "s" else f"{value:.2f}"


def summary(results: dict[str, Any]) -> str:
    """The headline figures, for the console."""
    rows = []
    for rows_, run in sorted(results.get("end_to_end", {}).items(), key=lambda i: int(i[0])):
        rows.append([f"end to end, {int(rows_):,} rows", f"{run['wall_seconds']:.1f} s"])
    ratio = results.get("cost_per_row_ratio")
    if ratio:
        rows.append([f"cost per row, {ratio['sizes'][1]:,} / {ratio['sizes'][0]:,} rows",
                     f"{ratio['by_step']['data steps']:.2f} (data steps)"])  # fmt: skip
    d = results.get("default_run")
    if d:
        rows.append([f"make run, {d['rows']:,} rows", f"{d['first_wall_seconds']:.1f} s"])
        rows.append(["  nothing new", f"{d['nothing_new_wall_seconds']:.1f} s = "
                     f"{d['nothing_new_fraction']:.1%} of it"])  # fmt: skip
        rows.append(["  after a new span", f"{d['new_span_wall_seconds']:.1f} s"])
        if results.get("stock"):
            stock = results["stock"]["wall_seconds"]
            rows.append(["stock TFX, same rows", f"{stock:.1f} s (ours / stock "
                         f"{d['first_wall_seconds'] / stock:.2f})"])  # fmt: skip
    start = results.get("startup")
    if start:
        ratios = [s["ratio"] for s in start["steps"].values()]
        rows.append(["step start-up / import tensorflow",
                     f"{min(ratios):.2f} to {max(ratios):.2f}"])  # fmt: skip
    width = max((len(r[0]) for r in rows), default=0)
    return "\n".join(f"  {name:<{width}}  {value}" for name, value in rows)
