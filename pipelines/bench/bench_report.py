"""The bench's report: bench/results.json (everything measured), bench/results.md (tables a
person reads; its analysis section is kept from the previous report, as it is written by hand)
and bench/time-per-step.png (seconds per step against rows)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from components.base.config import REPO_ROOT

ANALYSIS_MARK = "<!-- analysis: written by hand, kept by make bench -->"
# Stock TFX's node ids, by the step of ours that does the same work.
STOCK_NAMES = {
    "ExampleGen": "CsvExampleGen", "StatisticsGen": "StatisticsGen",
    "CuratedSchema": "ImportSchemaGen", "ExampleValidator": "ExampleValidator",
    "Transform": "Transform", "Trainer": "Trainer",
    "LatestPushedModel": "latest_blessed_model_resolver", "Evaluator": "Evaluator",
    "Pusher": "Pusher",
}  # fmt: skip
NOT_MEASURED = "not measured in this bench run"


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
    }  # fmt: skip


def write(results: dict[str, Any], report_dir: Path) -> None:
    results = {"machine": results.get("machine") or machine(), **results}
    report_dir.mkdir(parents=True, exist_ok=True)
    (report_dir / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    if "end_to_end" in results:
        chart(results["end_to_end"], report_dir / "time-per-step.png")
    markdown = report_dir / "results.md"
    analysis = ""
    if markdown.exists() and ANALYSIS_MARK in markdown.read_text():
        analysis = markdown.read_text().split(ANALYSIS_MARK, 1)[1]
    markdown.write_text(tables(results) + "\n" + ANALYSIS_MARK + (analysis or "\n"))


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
           f"{m['system']}. Settings: {json.dumps(results.get('settings', {}))}.\n\n"]  # fmt: skip
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
        out.append("\nThroughput: rows of the span per second of the step (the Evaluator reads "
                   "the eval split, a fifth of them); the Trainer trains a fixed number of steps "
                   "whatever the rows, so its figure is training examples (steps x global batch) "
                   "per second of the step, set-up and export included.\n\n")  # fmt: skip
        out.append(_table(["step"] + [f"{int(n):,} rows" for n in sizes], rows))
        ratio = results.get("cost_per_row_ratio")
        if ratio:
            small, large = ratio["sizes"]
            out.append(f"\nCost per row at {large:,} rows over the cost per row at {small:,} "
                       "(aim ≤ 1.2), for the steps whose work grows with rows:\n\n")  # fmt: skip
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
            [f"after one new span (pushed: {d['new_span_pushed']})",
             f"{d['new_span_wall_seconds']:.1f}"],
        ]))  # fmt: skip
    stock, d = results.get("stock"), results.get("default_run")
    if stock and d:
        out.append(f"\n## Ours against stock TFX (same {d['rows']:,} rows, same user code)\n\n")
        rows = []
        for ours, theirs in STOCK_NAMES.items():
            a = d["first_steps"].get(ours, {}).get("seconds")
            b = stock["steps"].get(theirs, {}).get("seconds")
            ratio = f"{a / b:.2f}" if a is not None and b and b >= 0.05 else "-"
            rows.append([f"{ours} / {theirs}", _s(a), _s(b), ratio])
        ours, theirs = d["first_wall_seconds"], stock["wall_seconds"]
        rows.append(["**wall** (process)", _s(ours), _s(theirs), f"{ours / theirs:.2f}"])
        out.append(_table(["step (ours / stock)", "ours s", "stock s", "ours / stock"], rows))
    start = results.get("startup")
    if start:
        bare = start["bare_import_tensorflow"]
        out.append("\n## Kubeflow step start-up (process start to the executor's first line)\n\n")
        rows = [["bare `import tensorflow`", _s(bare["seconds"]), f"{bare['rss_mb']:.0f}", "1.00"]]
        rows += [[name, _s(s["seconds"]), f"{s['rss_mb']:.0f}", f"{s['ratio']:.2f}"]
                 for name, s in start["steps"].items()]  # fmt: skip
        out.append(_table(["step", "seconds", "memory MB", "× bare"], rows))
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


def _s(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}"


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
