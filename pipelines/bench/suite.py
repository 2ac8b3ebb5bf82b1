"""`tkp bench` (`make bench`): where a run's time goes, how it grows with rows, what a Kubeflow
step pays to start, and how the pipeline compares with stock TFX on the same work.

Every figure comes from this one bench run, measured side by side, so ratios hold on a noisy
machine. Each pipeline run is a `tkp run` process of its own, as a user starts it, in a work
folder of its own under .work/bench/ (its own embedded store, metadata and serving folder): wall
time is what the user waits for, start-up included; per-step seconds and peak memory come from
the run's `--timings` file. Short figures (a run with nothing new, step start-up) are medians of
`repeats`. The report (pipelines/bench/bench_report.py) goes to bench/: results.json, results.md and
a chart of time per step against rows.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from components.base.config import REPO_ROOT, SPEC_PATH, WORK_DIR, PipelineConfig
from pipelines.local.unchanged_store import RECORD_NAME

BENCH_WORK = WORK_DIR / "bench"
REPORT_DIR = REPO_ROOT / "bench"
# What `tkp bench --tiny` changes: seconds instead of minutes, so a test keeps every part working.
# Its gate refuses none of the bench's models (no AUC or accuracy is below 0, no AUC change
# below -1, and its second model follows the first, so the slide check's floor is -1). Two
# models trained 40 steps on tiny spans differ by hundredths of AUC either way (a CI run's second
# model, on 2,000-row spans: -0.016; 5 runs here on 1,000-row spans: +0.013 to +0.029), more than
# the default max_auc_drop of 0.01, which refused that CI run's model.
TINY = {"train_steps": "40", "eval_steps": "5", "epochs": "1",
        "min_auc": "0", "min_accuracy": "0", "max_auc_drop": "1"}  # fmt: skip
STEP_DONE = re.compile(r"\[\d+/\d+\] \w+ (finished in|FAILED after) ")
# Steps whose work grows with the rows; the Trainer's is a fixed number of steps (train_steps).
DATA_STEPS = ("ExampleGen", "StatisticsGen", "Transform", "Evaluator")
PUSHED = re.compile(r"^Pushed: s3://", re.M)  # the run summary's line; "nothing pushed" otherwise
RECALLED = "Answered from the last run's record"  # a run with nothing new, the store not started
TRAINING_RECORD = re.compile(r"Training finished: (\{.*\})")
BEAM_MODES = {
    "direct-in-memory": "--direct_running_mode=in_memory,--direct_num_workers=1,"
    "--pickle_library=cloudpickle",
    # Beam 2.59's default pickler, which the default beam_args replace: the before and after.
    "direct-in-memory-dill": "--direct_running_mode=in_memory,--direct_num_workers=1,"
    "--pickle_library=dill",
    "direct-2-processes": "--direct_running_mode=multi_processing,--direct_num_workers=2,"
    "--pickle_library=cloudpickle",
    "portable-job-api-loopback": "--runner=PortableRunner,--job_endpoint={job_endpoint},"
    "--environment_type=LOOPBACK,--pickle_library=cloudpickle",
}
BEAM_STEPS = ("StatisticsGen", "Transform", "Evaluator")
# Images per span of the images use case's two end-to-end runs (its default span: 1,200).
IMAGE_SIZES, IMAGE_SIZES_TINY = (1_200, 4_800), (120, 240)
# The commit before issue 30's changes (ExampleGen inferring types in two passes; no phases in
# a run's timings): the "before" part's default side.
BEFORE = "2be3c83"


class Bench:
    """One bench run: its settings, its work folder and what it has measured so far."""

    def __init__(self, sizes: list[int], default_rows: int, repeats: int, tiny: bool,
                 beam_modes: tuple[str, ...], settings: dict[str, str] | None = None,
                 say: Callable[[str], None] = print, before_rev: str = BEFORE):  # fmt: skip
        self.sizes, self.default_rows, self.repeats, self.tiny = sizes, default_rows, repeats, tiny
        self.beam_modes, self.before_rev = beam_modes, before_rev
        self.say = say
        # Config fields for every run (tkp bench --set), over the tiny mode's.
        self.settings = {**(TINY if tiny else {}), **(settings or {})}
        self.results: dict[str, Any] = {}

    def run_cli(self, name: str, *args: str, settings: dict[str, str] | None = None,
                fresh: bool = False, source: Path | None = None) -> dict[str, Any]:  # fmt: skip
        """`tkp ARGS` in work folder `name`; its wall time, output and (for run) step timings and
        phases. `source`: a checkout of another commit whose code runs instead (same venv)."""
        work = BENCH_WORK / name
        if fresh:
            shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        timings = work / "timings.json"
        timings.unlink(missing_ok=True)
        extra = ["--timings", str(timings)] if args[0] == "run" else []
        sets = [f"--set={k}={v}" for k, v in {**self.settings, **(settings or {})}.items()]
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env["PIPELINE_WORK_DIR"] = str(work)
        if source:
            env["PYTHONPATH"] = str(source)  # its packages before the venv's editable install
        seconds, output = self.stream(["-m", "pipelines.cli", *args, *extra, *sets], env,
                                      cwd=source)  # fmt: skip
        timed = json.loads(timings.read_text()) if timings.exists() else {}
        if timed and "steps" not in timed:  # an older commit's file: the steps alone
            timed = {"steps": timed}
        return {"wall_seconds": seconds, "steps": timed.get("steps", {}),
                "phases": timed.get("phases", {}), "stdout": output}  # fmt: skip

    def stream(self, python_args: list[str], env: dict | None = None,
               cwd: Path | None = None) -> tuple[float, str]:  # fmt: skip
        """Runs `python ARGS`; passes on its step lines as they come; (wall seconds, output)."""
        started = time.monotonic()
        process = subprocess.Popen([sys.executable, *python_args], env=env, text=True, cwd=cwd,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
        lines = []
        for line in process.stdout:
            lines.append(line)
            if STEP_DONE.match(line):
                self.say("    " + line.strip())
        returncode = process.wait()  # the wall a user waits: to the process's end
        seconds, output = time.monotonic() - started, "".join(lines)
        if returncode:
            raise RuntimeError(f"python {' '.join(python_args[:3])} ... failed "
                               f"({process.returncode}):\n{output[-5000:]}")  # fmt: skip
        return seconds, output

    def end_to_end(self) -> None:
        """The default pipeline on each size: a fresh work folder, span 0 of that many rows."""
        runs = {}
        for rows in self.sizes:
            self.say(f"end to end, {rows:,} rows ...")
            run = self.run_cli(f"rows-{rows}", "run", settings={"rows_per_span": str(rows)},
                               fresh=True)  # fmt: skip
            run["rows"] = rows
            run["rows_read"] = rows_read(rows, run.pop("stdout"))
            self.say(f"  {run['wall_seconds']:.0f} s in all")
            runs[str(rows)] = run
        self.results["end_to_end"] = runs
        derive_end_to_end(self.results, BENCH_WORK, PipelineConfig.load(self.settings))

    def default_run(self) -> None:
        """`make run` as a user sees it: a first run, runs with nothing new, one after a span."""
        rows = {"rows_per_span": str(self.default_rows)}
        self.say(f"default run ({self.default_rows:,} rows): first run ...")
        first = self.run_cli("default", "run", settings=rows, fresh=True)
        cached = []
        for i in range(self.repeats):
            self.say(f"  nothing new, {i + 1}/{self.repeats} ...")
            again = self.run_cli("default", "run", settings=rows)
            if "Nothing is trained or pushed" not in again["stdout"]:
                raise RuntimeError(f"a run with nothing new trained:\n{again['stdout']}")
            cached.append(again)
        median = sorted(cached, key=lambda r: r["wall_seconds"])[len(cached) // 2]
        # The same without the last run's record (pipelines/local/unchanged_store.py), as after
        # any command that started the store: the store starts and the data is checked.
        self.say("  nothing new, the store started to check ...")
        (BENCH_WORK / "default" / RECORD_NAME).unlink(missing_ok=True)
        checked = self.run_cli("default", "run", settings=rows)
        if "Nothing is trained or pushed" not in checked["stdout"]:
            raise RuntimeError(f"a run with nothing new trained:\n{checked['stdout']}")
        self.say("  a new span, then a run ...")
        self.run_cli("default", "add-span", settings=rows)
        new_span = self.run_cli("default", "run", settings=rows)
        self.results["default_run"] = {
            "rows": self.default_rows,
            "first_wall_seconds": first["wall_seconds"],
            "first_steps": first["steps"],
            "first_phases": first["phases"],
            "first_rows_read": rows_read(self.default_rows, first["stdout"]),
            "first_training_steps": training_steps(first["stdout"]),
            "nothing_new_wall_seconds": median["wall_seconds"],
            "nothing_new_phases": median["phases"],  # of the median run
            "nothing_new_runs": [r["wall_seconds"] for r in cached],
            "nothing_new_fraction": median["wall_seconds"] / first["wall_seconds"],
            "nothing_new_recalled": [RECALLED in r["stdout"] for r in cached],
            "nothing_new_checked_wall_seconds": checked["wall_seconds"],
            "nothing_new_checked_fraction": checked["wall_seconds"] / first["wall_seconds"],
            "nothing_new_checked_phases": checked["phases"],
            "new_span_wall_seconds": new_span["wall_seconds"],
            "new_span_steps": new_span["steps"],
            "first_pushed": bool(PUSHED.search(first["stdout"])),
            "new_span_pushed": bool(PUSHED.search(new_span["stdout"])),
        }

    def before(self) -> None:
        """The same runs on the commit before this bench's changes (BEFORE, or --before), checked
        out in a worktree of its own and run with this venv, side by side with this commit's:
        a first run of the default rows and one of the largest size (the largest alone with
        --tiny)."""
        with self.before_checkout() as (source, commit):
            runs = {}
            sizes = [max(self.sizes)] if self.tiny else sorted({self.default_rows, max(self.sizes)})
            for rows in sizes:
                self.say(f"before (commit {commit}), {rows:,} rows ...")
                run = self.run_cli(f"before-rows-{rows}", "run", fresh=True, source=source,
                                   settings={"rows_per_span": str(rows)})  # fmt: skip
                run["rows"] = rows
                run["rows_read"] = rows_read(rows, run.pop("stdout"))
                run["rows_per_second"] = {
                    s: run["rows_read"][s] / run["steps"][s]["seconds"] for s in DATA_STEPS
                }
                runs[str(rows)] = run
            # Its run with nothing new, after its run of the default rows (--tiny: its one run).
            rows = self.default_rows if self.default_rows in sizes else sizes[0]
            self.say(f"before (commit {commit}), nothing new ...")
            again = self.run_cli(f"before-rows-{rows}", "run", source=source,
                                 settings={"rows_per_span": str(rows)})  # fmt: skip
            if "Nothing is trained or pushed" not in again["stdout"]:
                raise RuntimeError(f"the before side's run with nothing new trained:\n"
                                   f"{again['stdout']}")  # fmt: skip
            self.results["before"] = {
                "commit": commit, "runs": runs,
                "nothing_new": {"rows": rows, "wall_seconds": again["wall_seconds"],
                                "phases": again["phases"]},
            }  # fmt: skip

    @contextlib.contextmanager
    def before_checkout(self) -> Iterator[tuple[Path, str]]:
        """(a worktree of the before commit, its short hash), removed afterwards."""
        source = BENCH_WORK / "before-source"
        _git("worktree", "remove", "--force", str(source), check=False)
        shutil.rmtree(source, ignore_errors=True)
        _git("worktree", "prune")
        _git("worktree", "add", "--detach", str(source), self.before_rev)
        try:
            yield source, _git("rev-parse", "--short", self.before_rev)
        finally:
            _git("worktree", "remove", "--force", str(source), check=False)

    def stock(self) -> None:
        """Stock TFX (pipelines/bench/bench_stock.py) on the default run's rows, from local
        files."""
        from pipelines import data

        config = PipelineConfig.load(self.settings)
        csv_dir = BENCH_WORK / "stock-data"
        shutil.rmtree(csv_dir, ignore_errors=True)
        data.write_span(str(csv_dir), 0, self.default_rows, seed=config.seed,
                        drift=config.drift, marker="", use_case=config.use_case)  # fmt: skip
        work = BENCH_WORK / "stock"
        shutil.rmtree(work, ignore_errors=True)
        self.say(f"stock TFX ({self.default_rows:,} rows) ...")
        out = work / "result.json"
        sets = [f"{k}={v}" for k, v in self.settings.items()]
        # Stock TFX builds a ~45 MB package of its own source per Beam step (its cost is in its
        # times, as a stock user pays it); its temp folder keeps them out of the system's.
        (work / "tmp").mkdir(parents=True)
        env = {**os.environ, "TMPDIR": str(work / "tmp")}
        seconds, _ = self.stream(["-m", "pipelines.bench.bench_stock", str(csv_dir / "span-0"),
                                  str(work), str(out), *sets], env)  # fmt: skip
        result = json.loads(out.read_text())
        result["wall_seconds"] = seconds
        self.results["stock"] = result

    def startup(self, spec: Path = SPEC_PATH) -> None:
        """Each Kubeflow step's start-up; when the before part ran (--skip before leaves it
        out), side by side with the before commit's compiled spec and step code: rounds
        alternate between the two, so the machine's noise hits both, and each side's steps are
        over its own rounds' bare imports. Both trees are byte-compiled first, as the image is
        (kubeflow/Dockerfile's compileall; its PYTHONDONTWRITEBYTECODE keeps a step from
        writing .pyc files, so an uncompiled tree would compile its modules at every start)."""
        from pipelines.bench import bench_startup

        _compile(REPO_ROOT)
        if "before" not in self.results:
            self.say("Kubeflow step start-up ...")
            self.results["startup"] = bench_startup.measure(spec, repeats=self.repeats,
                                                            say=self.say)  # fmt: skip
            return
        rounds: dict[str, list[dict]] = {"after": [], "before": []}
        with self.before_checkout() as (source, commit):
            _compile(source)
            for index in range(self.repeats):
                self.say(f"Kubeflow step start-up, round {index + 1}/{self.repeats} ...")
                rounds["after"].append(bench_startup.measure(
                    spec, repeats=1, say=self.say, profile_imports=index == 0))  # fmt: skip
                self.say(f"  before (commit {commit}):")
                rounds["before"].append(bench_startup.measure(
                    source / spec.relative_to(REPO_ROOT), repeats=1, say=self.say,
                    source=source, profile_imports=False))  # fmt: skip
        result = bench_startup.combine(rounds["after"])
        result["before"] = {"commit": commit, **bench_startup.combine(rounds["before"])}
        self.results["startup"] = result

    def beam(self) -> None:
        """The Beam steps under each Beam mode, on the default run's rows."""
        job_service = _start_job_service()
        try:
            modes = {}
            for mode in self.beam_modes:
                args = BEAM_MODES[mode]
                self.say(f"Beam: {mode} ...")
                run = self.run_cli(
                    "beam", "run", fresh=True,
                    settings={"rows_per_span": str(self.default_rows),
                              "beam_args": args.format(job_endpoint=job_service[1])},
                )  # fmt: skip
                modes[mode] = {step: run["steps"][step]["seconds"] for step in BEAM_STEPS}
            self.results["beam"] = {"rows": self.default_rows, "modes": modes}
        finally:
            job_service[0].kill()
            job_service[0].wait()

    def images(self) -> None:
        """The images use case end to end at two sizes (images per span): each step's images
        per second and the Trainer's training images per second, as derive_end_to_end gives
        them for rows."""
        sizes = IMAGE_SIZES_TINY if self.tiny else IMAGE_SIZES
        runs = {}
        for images in sizes:
            self.say(f"images use case, {images:,} images ...")
            settings = {"use_case": "images", "rows_per_span": str(images)}
            run = self.run_cli(f"images-{images}", "run", fresh=True, settings=settings)
            run["rows"] = images
            run["rows_read"] = rows_read(images, run.pop("stdout"))
            self.say(f"  {run['wall_seconds']:.0f} s in all")
            runs[str(images)] = run
        results = {"end_to_end": runs}
        config = PipelineConfig.load({**self.settings, "use_case": "images"})
        derive_end_to_end(results, BENCH_WORK, config, work_prefix="images-")
        self.results["images"] = results

    def evaluator(self) -> None:
        """What bounds the Evaluator (pipelines/bench/bench_evaluator.py): its evaluation on the
        largest end-to-end run's eval split, as configured and with parts of its work taken
        away, each variant in a process of its own."""
        from pipelines.bench.bench_evaluator import VARIANTS

        if not self.results.get("end_to_end"):
            self.say(
                "Evaluator variants: skipped (they evaluate the end_to_end part's largest run)"
            )
            return
        rows = max(int(n) for n in self.results["end_to_end"])
        run = self.results["end_to_end"][str(rows)]
        eval_rows = run["rows_read"]["Evaluator"]
        root = BENCH_WORK / f"rows-{rows}" / "pipeline_root"
        config = PipelineConfig.load(self.settings)
        variants = {}
        for variant in VARIANTS:
            self.say(f"Evaluator, {eval_rows:,} eval rows: {variant} ...")
            out = BENCH_WORK / "evaluator" / variant.replace(" ", "-").replace(",", "")
            shutil.rmtree(out, ignore_errors=True)
            _, output = self.stream(["-m", "pipelines.bench.bench_evaluator", str(root), variant,
                                     str(out), config.use_case])  # fmt: skip
            seconds = json.loads(output.strip().splitlines()[-1])["seconds"]
            variants[variant] = {"seconds": seconds, "eval_rows_per_second": eval_rows / seconds}
        self.results["evaluator"] = {
            "rows": rows, "eval_rows": eval_rows,
            "step_seconds": run["steps"]["Evaluator"]["seconds"], "variants": variants,
        }  # fmt: skip

    def trainer_and_serving(self) -> None:
        """bench-input and bench-serving on the default run's outputs (`default` work folder)."""
        steps, repeats, requests = ("40", "3", "50") if self.tiny else ("300", "5", "400")
        self.say("Trainer input efficiency (bench-input) ...")
        self.run_cli("default", "bench-input", "--steps", steps, "--repeats", repeats)
        self.say("serving latency and throughput (bench-serving) ...")
        # Tiny: two loads, not three (the test's time goes to the parts, not to their sizes).
        concurrency = "1,4" if self.tiny else "1,4,16"
        self.run_cli("default", "bench-serving", "--requests", requests, "--concurrency",
                     concurrency)  # fmt: skip
        folder = BENCH_WORK / "default" / "bench"
        self.results["trainer_input"] = json.loads((folder / "input.json").read_text())
        self.results["serving"] = json.loads((folder / "serving.json").read_text())


EVAL_EXAMPLES = re.compile(r"^Evaluation \((\d+) eval examples\)", re.M)  # the run summary's
TRAINING_STEPS = re.compile(r"^Training: (\d+) steps on ", re.M)


def rows_read(rows: int, stdout: str) -> dict[str, int]:
    """The examples each data step reads: ExampleGen, StatisticsGen and Transform the whole span
    (train and eval), the Evaluator the eval split, as its metrics count them (the run summary's
    "Evaluation (N eval examples)")."""
    found = EVAL_EXAMPLES.search(stdout)
    if not found:
        raise RuntimeError(f"the run printed no evaluation line:\n{stdout[-3000:]}")
    return {"ExampleGen": rows, "StatisticsGen": rows, "Transform": rows,
            "Evaluator": int(found.group(1))}  # fmt: skip


def training_steps(stdout: str) -> int | None:
    """The steps the Trainer trained, from the run summary's "Training: N steps" line."""
    found = TRAINING_STEPS.search(stdout)
    return int(found.group(1)) if found else None


def derive_end_to_end(results: dict, bench_work: Path, config: PipelineConfig,
                      work_prefix: str = "rows-") -> None:  # fmt: skip
    """Throughputs and the cost-per-row ratio from the end-to-end runs (their timings and logs).

    ExampleGen, StatisticsGen, Transform and Evaluator: the rows each reads (rows_read) per
    second of the step. Trainer: training examples per second of the step, set-up and export
    included (steps x global batch / seconds; the steps from the Trainer's own record in the
    run's log), as it trains a set number of steps whatever the rows. Cost per row: seconds per
    row read at the largest size over the same at 100,000 rows when both ran, else at the next
    smaller size; for each data step and for the four together (their seconds over the span's
    rows)."""
    runs = results["end_to_end"]
    for key, run in runs.items():
        run["rows_per_second"] = {
            s: run["rows_read"][s] / run["steps"][s]["seconds"] for s in DATA_STEPS
        }
        logs = sorted((bench_work / f"{work_prefix}{key}" / "logs").glob("run-*.log"))
        found = TRAINING_RECORD.search(logs[-1].read_text()) if logs else None
        if found:
            record = json.loads(found.group(1))
            batch = config.batch_size * record["replicas"]  # batch_size is per replica
            seconds = run["steps"]["Trainer"]["seconds"]
            rate = record["steps"] * batch / seconds
            run["training"] = {"steps": record["steps"], "global_batch": batch,
                               "examples_per_second": rate}  # fmt: skip
    sizes = sorted(run["rows"] for run in runs.values())
    if len(sizes) < 2:
        return
    large = sizes[-1]
    small = 100_000 if 100_000 in sizes[:-1] else sizes[-2]
    a, b = runs[str(large)], runs[str(small)]
    by_step = {s: (a["steps"][s]["seconds"] / a["rows_read"][s])
               / (b["steps"][s]["seconds"] / b["rows_read"][s]) for s in DATA_STEPS}  # fmt: skip
    total = {
        n: sum(runs[str(n)]["steps"][s]["seconds"] for s in DATA_STEPS) for n in (large, small)
    }
    by_step["data steps"] = (total[large] / large) / (total[small] / small)
    results["cost_per_row_ratio"] = {"sizes": [small, large], "by_step": by_step}


def _compile(root: Path) -> None:
    """Byte-compiles the project's packages under `root`, as the image does at its build."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "pipelines"),
                    str(root / "components")], check=True)  # fmt: skip


def _git(*args: str, check: bool = True) -> str:
    done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done.stdout.strip()


def _start_job_service() -> tuple[subprocess.Popen, str]:
    """Beam's own local job service: the portable Job API that Flink's and Spark's job servers
    implement; `(process, host:port)`."""
    from components.base.object_store import _free_port_pair

    port = _free_port_pair()
    process = subprocess.Popen(
        [sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
         f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    import socket

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return process, f"localhost:{port}"
        time.sleep(0.2)
    process.kill()
    raise RuntimeError("Beam's local job service did not listen within 60 s")


PARTS = ("end_to_end", "default_run", "before", "stock", "images", "evaluator", "startup",
         "beam", "trainer_and_serving")  # fmt: skip


def run(sizes: list[int], default_rows: int, repeats: int, tiny: bool, skip: set[str],
        beam_modes: tuple[str, ...] = tuple(BEAM_MODES), settings: dict[str, str] | None = None,
        report_dir: Path = REPORT_DIR, say: Callable[[str], None] = print,
        before_rev: str = "") -> dict:  # fmt: skip
    """Runs every part not in `skip`, in order, and writes the report; returns the results."""
    from pipelines.bench import bench_report

    bench = Bench(sizes, default_rows, repeats, tiny, beam_modes, settings, say,
                  before_rev or BEFORE)  # fmt: skip
    started = time.monotonic()
    for part in PARTS:
        if part in skip:
            continue
        part_started = time.monotonic()
        getattr(bench, part)()
        bench_report.write(bench.results, report_dir)  # a later part's failure keeps these
        say(f"[{part}] done in {time.monotonic() - part_started:.0f} s "
            f"(bench so far {time.monotonic() - started:.0f} s)")  # fmt: skip
    bench.results["settings"] = {
        "sizes": sizes, "default_rows": default_rows, "repeats": repeats, "tiny": tiny,
        "skipped": sorted(skip), "config": bench.settings, "before": bench.before_rev,
        "bench_seconds": time.monotonic() - started,
    }  # fmt: skip
    bench_report.write(bench.results, report_dir)
    return bench.results
