"""Command line: `tkp COMMAND` (or `python -m pipelines.cli COMMAND`); `--help` on each.

Local: run, add-span, store, watch. Served versions: models list, models show, rollback.
Serving: serve (TF Serving's REST API), serving-sync (the mirror TF Serving reads), bench-serving.
Bench: bench (make bench: steps against rows, caching, stock TFX, step start-up, Beam).
Training: bench-input (is training bound by its input pipeline?), bench-tuning (what parallel
trials buy, a search's best against the defaults), gpu-check (on a GPU machine),
tensorboard (a training run's TensorBoard logs, copied to local disk and served).
Kubeflow: images (build the step images), compile, submit, schedule, pause, resume.

The console shows progress, results and errors. Each command writes a log of its own,
`.work/logs/<command>-<time>-<pid>.log`, with everything the libraries print and, when something
fails, the full traceback; an error on the console names that file.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines, even in the log
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from components.base import console  # noqa: E402
from components.base.config import (  # noqa: E402
    DEFAULT_DRIFT,
    ENV_PREFIX,
    FIELDS,
    OTHER_ENV,
    REPO_ROOT,
    ConfigError,
    PipelineConfig,
    check_values,
    compiled_spec_path,
    parse_assignments,
    spec_path,
)
from components.base.errors import ActionableError, actionable_cause  # noqa: E402

if TYPE_CHECKING:
    from pipelines.local.run_phases import RunPhases


def cmd_run(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines.local import embedded_store, run_lock, unchanged_store
    from pipelines.local.run_phases import RunPhases

    started, phases = time.monotonic(), RunPhases()
    with contextlib.ExitStack() as held:
        with phases.timed("run lock and nothing-new record"):
            held.enter_context(run_lock.exclusive_run(args_line()))
            recalled = (
                None
                if args.keep_store  # asks for a store left running: start it
                else unchanged_store.recall(config, embedded_store.STORE_DIR)
            )
        if recalled:  # the store's folder is as a run that found nothing new left it
            console.say("\n".join(recalled))
            console.say("(Answered from the last run's record: the object store's folder has "
                        "not changed since, so it was not started.)")  # fmt: skip
        else:
            answer = _check_and_run(args, config, phases, held)
            if answer is not None:  # the store has stopped: its folder as the next run finds it
                with contextlib.suppress(OSError):  # without a record the next run checks
                    unchanged_store.remember(config, embedded_store.STORE_DIR, answer)
    phases.write(args.timings)
    console.say(f"\nDone in {time.monotonic() - started:.1f} s.")
    return 0


def _check_and_run(args: argparse.Namespace, config: PipelineConfig, phases: RunPhases,
                   held: contextlib.ExitStack) -> list[str] | None:  # fmt: skip
    """Starts the store, runs the pipeline unless nothing is new, stops the store; returns what a
    run with nothing new prints, when that is the answer now (the next run's record)."""
    from pipelines.local import embedded_store, local_runner

    with phases.timed("object store start"):
        store = held.enter_context(embedded_store.object_store(config, keep=args.keep_store))
    with phases.timed("storage library import (what the store's start left)"):
        from components.base import storage  # noqa: F401  (timed apart: a fixed cost)
    with phases.timed("data check (nothing new?)"):
        local_runner.ensure_data(config)
        unchanged = local_runner.nothing_new(config)
    if unchanged:  # the pipeline would skip every step: say so without loading TFX
        answer = _nothing_new_lines(config, unchanged)
        console.say("\n".join(answer))
    else:
        _run_pipeline(args, config, phases)
        with phases.timed("data check after the run (the next run's record)"):
            unchanged = local_runner.nothing_new(config)
            answer = _nothing_new_lines(config, unchanged) if unchanged else None
    with phases.timed("object store stop"):
        held.close()
    # A record only when this command was the store's one user from its start to its stop: a
    # command that used it meanwhile (add-span, rollback) may have written after the check.
    alone = store.kind == "started" and store.embedded.sole_user_since_start()
    return answer if alone else None


def _nothing_new_lines(config: PipelineConfig, reason: str) -> list[str]:
    from pipelines.local import local_runner

    served = local_runner.latest_served(config)
    return [reason] + ([f"Served: {served} (`tkp serve` answers predictions from it)."]
                       if served else [])  # fmt: skip


def _run_pipeline(args: argparse.Namespace, config: PipelineConfig, phases: RunPhases) -> None:
    from pipelines.local import local_runner

    console.say(f"Running pipeline {config.pipeline_name!r} (full log: {args.log_path}) ...")
    summary = local_runner.run_pipeline(config, args.log_path, args.timings, phases)
    # Each import in the phase that needs it: `samples` loads TensorFlow and Beam, seconds that
    # an import here, before the pipeline's own phase, left in no phase of the bench's account.
    with phases.timed("summary and run report"):
        from pipelines.run_summary import format_summary

        console.say(format_summary(summary))
        report = local_runner.save_report(summary.report_uri, args.log_path)
    if report:
        console.say(f"Report: {report} (what the Kubeflow UI shows of a run)")
    with phases.timed("sample predictions"):
        from components.base.use_case import load as load_use_case
        from pipelines import data
        from pipelines.serving import samples

        served = summary.pushed_path or local_runner.latest_served(config)
        if served and summary.span is not None:
            span_dir = data.span_dir(config.data_root, summary.span)
            lines = samples.sample_predictions(
                served, span_dir, load_use_case(config.use_case), encoding=config.input_encoding
            )
            console.say("\n" + "\n".join(lines))


def _span_size(args: argparse.Namespace, config: PipelineConfig) -> tuple[int, float]:
    """add-span's --rows and --drift (or the config's values), checked by the config's rules."""
    rows = config.rows_per_span if args.rows is None else args.rows
    drift = config.drift if args.drift is None else args.drift
    check_values("add-span", {"rows_per_span": rows, "drift": drift},
                 sources={"rows_per_span": "--rows", "drift": "--drift"})  # fmt: skip
    if not 0 <= args.label_noise <= 1:
        raise ConfigError(f"--label-noise must be between 0 and 1, got {args.label_noise}")
    from components.base.use_case import IMAGE_FOLDERS
    from components.base.use_case import load as load_use_case

    if args.corrupt and load_use_case(config.use_case).input_format != IMAGE_FOLDERS:
        raise ConfigError(f"--corrupt is for use cases of images; {config.use_case!r} writes CSV "
                          "rows")  # fmt: skip
    if not 0 <= args.corrupt <= rows:
        raise ConfigError(f"--corrupt must be between 0 and the span's {rows} images, got "
                          f"{args.corrupt}")  # fmt: skip
    return rows, drift


def cmd_add_span(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines import data
    from pipelines.local import embedded_store

    rows, drift = _span_size(args, config)
    with embedded_store.object_store(config):
        span = data.add_next_span(
            config.data_root, rows, seed=config.seed, drift=drift,
            marker=config.success_marker, label_noise=args.label_noise, use_case=config.use_case,
            corrupt=args.corrupt,
        )  # fmt: skip
    noise = f", label noise {args.label_noise}" if args.label_noise else ""
    noise += f", {args.corrupt} cut-off file(s)" if args.corrupt else ""
    marker = f", then {config.success_marker}" if config.success_marker else ""
    from components.base.use_case import IMAGE_FOLDERS
    from components.base.use_case import load as load_use_case

    unit = "images" if load_use_case(config.use_case).input_format == IMAGE_FOLDERS else "rows"
    console.say(f"Wrote span {span} ({rows} {unit}, drift {drift}{noise}{marker}) to "
                f"{data.span_dir(config.data_root, span)}")  # fmt: skip
    return 0


def cmd_models(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines import models
    from pipelines.local import embedded_store

    with embedded_store.object_store(config):
        if args.action == "show":
            console.say(models.show_version(config, args.version))
        else:
            console.say(models.list_versions(config))
    return 0


def cmd_rollout(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines import rollout
    from pipelines.local import embedded_store

    with embedded_store.object_store(config):
        if args.action == "status":
            console.say(rollout.status(config))
        else:
            console.say(rollout.decide(config, args.action, args.reason))
    return 0


def cmd_rollback(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines import models
    from pipelines.local import embedded_store

    with embedded_store.object_store(config):
        console.say(models.rollback(config, args.version))
    return 0


def cmd_serve(args: argparse.Namespace, config: PipelineConfig) -> int:
    from components.base.config import WORK_DIR
    from pipelines.local import embedded_store
    from pipelines.serving import serve
    from pipelines.serving.model_server import ModelManager

    cache = (
        Path(args.cache_dir) if args.cache_dir else serve.cache_dir_for(WORK_DIR, config.model_name)
    )
    with embedded_store.object_store(config) as store:
        manager = ModelManager(config.model_name, config.serving_model_dir, cache,
                               args.poll_seconds, serve.batching_of(args), args.label)  # fmt: skip
        manager.follower = embedded_store.StoreFollower(store, console.say, manager.keeps)
        for version, error_share, delay in args.fault_drill:
            manager.router.drill(version, delay, error_share)
            console.say(f"Fault drill: version {version} fails {error_share:.0%} of its "
                        f"requests and answers {delay:g} s later.")  # fmt: skip
        serve.serve_forever(manager, args.host, args.port, int(args.max_request_mb * 2**20),
                            console.say)  # fmt: skip
    return 0


def cmd_serving_sync(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines.local import embedded_store
    from pipelines.serving import serving_sync

    with embedded_store.object_store(config):
        return serving_sync.run(config.serving_model_dir, config.model_name, Path(args.target),
                                None if args.once else args.interval, console.say,
                                model_server=args.model_server, label=args.label)  # fmt: skip


def cmd_bench(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines.bench import suite as bench

    sizes = [500, 1_000] if args.tiny else args.sizes + ([1_000_000] if args.large else [])
    rows = 2_000 if args.tiny else config.rows_per_span
    skip = set(args.skip or [])
    unknown = skip - set(bench.PARTS)
    if unknown:
        parts = ", ".join(bench.PARTS)
        raise ConfigError(f"--skip: no part named {sorted(unknown)}; the parts: {parts}")
    console.say(f"Bench: parts {[p for p in bench.PARTS if p not in skip]}, sizes {sizes}, "
                f"default run {rows:,} rows; work in {bench.BENCH_WORK} ...")  # fmt: skip
    modes = tuple(args.beam_modes or bench.BEAM_MODES)
    if set(modes) - set(bench.BEAM_MODES):
        raise ConfigError(f"--beam-modes: one of {list(bench.BEAM_MODES)} each, got {modes}")
    from pipelines.bench import bench_report

    results = bench.run(sizes, rows, args.repeats, args.tiny, skip, modes,
                        settings=parse_assignments(args.set or []), report_dir=args.report_dir,
                        say=console.say, before_rev=args.before)  # fmt: skip
    console.say("\n" + bench_report.summary(results))
    console.say(f"Report: {args.report_dir / 'results.md'} (and results.json, time-per-step.png)")
    return 0


def cmd_bench_input(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines.bench import bench_training

    examples_dir, graph_dir = bench_training.transform_outputs(config)
    results = bench_training.run(examples_dir, graph_dir, config, args.steps, args.repeats,
                                 console.say)  # fmt: skip
    console.say(bench_training.table(results))
    return 0


def cmd_bench_tuning(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines.bench import bench_tuning

    results = bench_tuning.run(config, args.trials, args.parallel, args.trial_steps, console.say)
    console.say(bench_tuning.table(results))
    return 0


def cmd_gpu_check(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines import gpu_check

    gpu_check.run(config, args.steps, console.say)
    return 0


def cmd_images(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines.kubeflow import images

    if args.base_only:
        images.ensure_local_base(images.engine(), rebuild=True, say=console.say)
        return 0
    images.build_images(config, base=args.base, gpu=args.gpu, say=console.say)
    if args.push:
        images.push_images(config, gpu=args.gpu, say=console.say)
    return 0


def cmd_tensorboard(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines.local import tensorboard

    return tensorboard.main(
        config, console.say, pipeline_root=args.pipeline_root, model_run_uri=args.model_run,
        run=args.run, all_runs=args.all, serve=not args.no_serve, host=args.host, port=args.port,
    )  # fmt: skip


def cmd_bench_serving(args: argparse.Namespace, config: PipelineConfig) -> int:
    import json

    from components.base.config import WORK_DIR
    from pipelines.bench import bench_serving
    from pipelines.local import embedded_store

    with embedded_store.object_store(config):
        batching = args.batching_parameters_file or bench_serving.SHIPPED_BATCHING
        results = bench_serving.run(config, args.requests, args.concurrency, args.batch_sizes,
                                    console.say, batching)  # fmt: skip
    console.say(bench_serving.table(results))
    path = WORK_DIR / "bench" / "serving.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2))
    console.say(f"Figures written to {path}")
    return 0


def cmd_store(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines.local import embedded_store

    store = None
    try:
        with embedded_store.object_store(config) as store:
            if store.kind == "reused":
                console.say(
                    f"Nothing to start: the store of this folder answers at {store.endpoint}."
                )
                return 0
            if store.kind != "started":
                console.error(
                    f"Nothing to start: AWS_ENDPOINT_URL_S3 is set ({store.endpoint}), so commands "
                    "use that store; unset it to use the embedded one."
                    if store.kind == "configured"
                    else "Nothing to start: no data_root, serving_root or pipeline_root is s3://."
                )
                return 1
            console.say(f"Object store at {store.endpoint}; it runs while this command or any "
                        "other uses it (Ctrl-C ends this one). For other shells:")  # fmt: skip
            # SeaweedFS without an IAM config accepts any key: never echo the user's own.
            console.say(f"  export AWS_ENDPOINT_URL_S3={store.endpoint} AWS_ACCESS_KEY_ID=any "
                        "AWS_SECRET_ACCESS_KEY=any AWS_REGION=us-east-1")  # fmt: skip
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        if store is not None and store.embedded is not None:
            if store.embedded.outcome == "stopped":
                console.say("Object store stopped.")
        return 0


def cmd_schema(args: argparse.Namespace, config: PipelineConfig) -> int:
    from pipelines.local import embedded_store
    from pipelines.schema_proposal import propose

    with embedded_store.object_store(config):
        return propose(config, args.span, args.write, console.say)


def cmd_compile(args: argparse.Namespace, config: PipelineConfig) -> int:
    from components.base import use_case
    from pipelines.kubeflow import kubeflow_runner

    if args.committed:
        return _compile_committed(args)
    output = Path(args.output) if args.output else compiled_spec_path(config.use_case)
    committed = {spec_path(name).resolve() for name in use_case.shipped()}
    if output.resolve() in committed:
        raise ConfigError(
            f"--output {args.output}: that is a committed spec, which only `make specs` writes "
            "(from the defaults, as the stale-spec test expects); leave out --output (SPEC) to "
            f"write {_shown(compiled_spec_path(config.use_case))}, or name another file"
        )
    path = kubeflow_runner.write(config, output)
    console.say(f"Wrote {_shown(path)} (use case {config.use_case}, cpu image "
                f"{config.cpu_image}, gpu image {config.gpu_image}).")  # fmt: skip
    return 0


def _compile_committed(args: argparse.Namespace) -> int:
    """Every shipped use case's committed spec, from its defaults alone."""
    from components.base import use_case
    from pipelines.kubeflow import kubeflow_runner

    given = [f"--set {name}" for name in parse_assignments(args.set or [])]
    given += [f"--output {args.output}"] if args.output else []
    given += sorted(n for n in os.environ if n.startswith(ENV_PREFIX) and n not in OTHER_ENV)
    if given:
        raise ConfigError(
            f"--committed compiles the defaults alone; remove {', '.join(given)} (to compile "
            "with your settings, `make compile` writes .work/kubeflow/pipeline-<use case>.yaml)"
        )
    for name in use_case.shipped():
        path = kubeflow_runner.write(PipelineConfig.load({"use_case": name}, environ={}),
                                     spec_path(name))  # fmt: skip
        console.say(f"Wrote {_shown(path)} (use case {name}, the defaults).")
    return 0


def _shown(path: Path) -> str:
    """A path as the reader typed it: relative to the repository when inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


def _parameters(args: argparse.Namespace) -> dict[str, str]:
    return parse_assignments(args.param or [], flag="--param")


def cmd_submit(args: argparse.Namespace, config: None) -> int:
    from pipelines.kubeflow import kfp_client

    package = _package(args)
    run_id = kfp_client.submit(args.endpoint, package, _parameters(args), args.experiment,
                               args.namespace)  # fmt: skip
    console.say(f"Started run {run_id} of {package} on {args.endpoint}.")
    return 0


def cmd_schedule(args: argparse.Namespace, config: None) -> int:
    from pipelines.kubeflow import kfp_client

    job_id = kfp_client.schedule(
        args.endpoint, _package(args), args.cron,
        _parameters(args), args.experiment, args.name,
        args.namespace, replace=args.replace, say=console.say,
    )  # fmt: skip
    console.say(
        f"Created recurring run {job_id} ({args.name}, cron {args.cron!r}) on {args.endpoint}"
        + (" (any earlier one of that name is deleted)." if args.replace else ".")
    )
    return 0


def cmd_pause(args: argparse.Namespace, config: None) -> int:
    from pipelines.kubeflow import kfp_client

    kfp_client.pause(args.endpoint, args.recurring_run_id, args.namespace)
    console.say(f"Paused recurring run {args.recurring_run_id}.")
    return 0


def cmd_resume(args: argparse.Namespace, config: None) -> int:
    from pipelines.kubeflow import kfp_client

    kfp_client.resume(args.endpoint, args.recurring_run_id, args.namespace)
    console.say(f"Resumed recurring run {args.recurring_run_id}.")
    return 0


def cmd_watch(args: argparse.Namespace, config: PipelineConfig) -> int:
    interval = config.watch_interval if args.interval is None else args.interval
    if args.interval is not None:  # the config's own value was checked when it was loaded
        check_values("watch", {"watch_interval": interval}, {"watch_interval": "--interval"})
    from pipelines import watch

    return watch.main(config, interval, args.once, args.endpoint, args.package, args.experiment,
                      args.log_path, args_line())  # fmt: skip


def _drill(text: str) -> tuple[int, float, float]:
    """VERSION:ERROR_SHARE[:DELAY_S] of --fault-drill."""
    parts = text.split(":")
    try:
        version, share, delay = int(parts[0]), float(parts[1]), float((parts[2:] or ["0"])[0])
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not VERSION:ERROR_SHARE[:DELAY_S]: {text!r}") from None
    if len(parts) > 3 or version < 1 or not 0 <= share <= 1 or delay < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a version from 1, an error share from 0 to 1, a delay from 0 seconds"
        )
    return version, share, delay


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a port number (1-65535): {text!r}")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1: {text!r}")
    return int(text)


def _counts(text: str) -> list[int]:
    return [_count(part.strip()) for part in text.split(",")]


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number above 0: {text!r}")
    return value


class _RefuseSet(argparse.Action):
    """`--set` on a Kubeflow command: the config is compiled into the spec, so refuse it."""

    def __call__(self, parser, namespace, values, option_string=None):
        hint = "its run parameters are `--param NAME=VALUE`; " if parser.has_param else ""
        parser.error(
            f"--set changes the compiled spec and has no effect here: {hint}"
            "compile config changes with `compile --set FIELD=VALUE`"
        )


def _prog() -> str:
    """How the user started the CLI, for --help and errors."""
    installed = sys.argv and Path(sys.argv[0]).name == "tkp"  # the console script (pyproject)
    return "tkp" if installed else "python -m pipelines.cli"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_prog(), description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)

    def add(name: str, handler, help_text: str, config: bool = True) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.has_param = False
        if config:
            sub.add_argument(
                "--set",
                action="append",
                metavar="FIELD=VALUE",
                help="override a config field (components/base/config.py); repeatable",
            )
        else:
            sub.add_argument("--set", action=_RefuseSet, help=argparse.SUPPRESS)
        sub.set_defaults(handler=handler, uses_config=config)
        return sub

    run = add(
        "run", cmd_run, "Run the whole pipeline locally (LocalDagRunner) and show the result."
    )
    run.add_argument(
        "--keep-store",
        action="store_true",
        help="leave the embedded object store running; the next command reuses it",
    )
    run.add_argument("--timings", type=Path, metavar="JSON",
                     help="also write where the run's time went there (each step's seconds and "
                     "peak memory, each phase's seconds)")  # fmt: skip
    span = add("add-span", cmd_add_span, "Generate the next data span into the data root.")
    span.add_argument("--rows", type=int, help="rows in the new span (default: rows_per_span)")
    span.add_argument("--drift", type=float, nargs="?", const=DEFAULT_DRIFT, metavar="STRENGTH",
                      help=f"drift strength, >= 0 (0: none; alone: {DEFAULT_DRIFT}, which the "
                      "drift checks in schemas/ catch)")  # fmt: skip
    span.add_argument("--label-noise", type=float, default=0.0, metavar="SHARE",
                      help="share of rows with a coin-flip label (a broken export; images: "
                      "filed under a wrong class)")  # fmt: skip
    span.add_argument("--corrupt", type=int, default=0, metavar="FILES",
                      help="images only: this many files cut off half-way (an interrupted "
                      "upload)")  # fmt: skip
    models = add("models", cmd_models, "Show the pushed versions (list) or one version (show N).")
    models.add_argument("action", choices=("list", "show"))
    models.add_argument("version", type=int, nargs="?", help="with show: the version")
    rollback = add("rollback", cmd_rollback,
                   "Serve the version below the served one, or version N.")  # fmt: skip
    rollback.add_argument("version", type=int, nargs="?", help="the version to serve")
    rollout = add("rollout", cmd_rollout, "A release's state (status), or force its decision: "
                  "promote the canary to stable, or abort it.")  # fmt: skip
    rollout.add_argument("action", choices=("status", "promote", "abort"))
    rollout.add_argument("--reason", default="", help="recorded with the decision")
    add("store", cmd_store, "Start the embedded object store in the foreground.")
    schema = add("schema", cmd_schema, "Propose the use case's schema from a span's data.")
    schema.add_argument("action", choices=("propose",))
    schema.add_argument("--span", type=int, default=-1,
                        help="the span to read (default: the newest complete one)")  # fmt: skip
    schema.add_argument("--write", action="store_true",
                        help="write the proposal to the use case's schema file (its "
                        "schema_path), to review and commit")  # fmt: skip
    compile_ = add(
        "compile", cmd_compile, "Compile the pipeline into a Kubeflow Pipelines v2 spec."
    )
    compile_.add_argument("--output", help="default: .work/kubeflow/pipeline-<use case>.yaml "
                          "(what submit, schedule and watch send); never a committed "
                          "kubeflow/pipeline-<name>.yaml")  # fmt: skip
    compile_.add_argument("--committed", action="store_true",
                          help="rewrite the committed kubeflow/pipeline-<name>.yaml of every "
                          "shipped use case from its defaults (`make specs`); refuses --set, "
                          "--output and PIPELINE_* settings")  # fmt: skip

    def add_kfp(
        name: str, handler, help_text: str, package: bool = True
    ) -> argparse.ArgumentParser:
        sub = add(name, handler, help_text, config=False)
        sub.add_argument(
            "--endpoint",
            default=os.environ.get("KFP_ENDPOINT", "http://localhost:8080"),
            help="KFP API endpoint (default: $KFP_ENDPOINT or http://localhost:8080)",
        )
        sub.add_argument("--namespace", help="multi-user Kubeflow: the profile namespace of the "
                         "runs (default: $KFP_NAMESPACE)")  # fmt: skip
        if package:
            sub.has_param = True
            sub.add_argument("--package", help="compiled spec to upload (default: .work/"
                             "kubeflow/pipeline-<use case>.yaml, `make compile`)")  # fmt: skip
            sub.add_argument("--experiment", help="KFP experiment (default: the pipeline's name)")
            sub.add_argument("--param", action="append", metavar="NAME=VALUE",
                             help="pipeline parameter for the run(s); repeatable")  # fmt: skip
        return sub

    add_kfp("submit", cmd_submit, "Upload the spec (if changed) and start one run.")
    schedule = add_kfp(
        "schedule", cmd_schedule, "Create a recurring run (one at a time, no catch-up)."
    )
    schedule.add_argument("--cron", required=True, help='cron, e.g. "0 2 * * *" (nightly, 02:00)')
    schedule.add_argument("--name", help="recurring run name (default: <pipeline name>-nightly)")
    schedule.add_argument("--replace", action="store_true",
                          help="move a recurring run of that name to this package (as CI does "
                          "after a merge) instead of refusing")  # fmt: skip
    for name, handler, text in (
        ("pause", cmd_pause, "Pause a recurring run."),
        ("resume", cmd_resume, "Resume a paused recurring run."),
    ):
        sub = add_kfp(name, handler, text, package=False)
        sub.add_argument("--recurring-run-id", required=True)
    serve_ = add("serve", cmd_serve, "Serve the pushed versions over TF Serving's REST API.")
    serve_.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve_.add_argument("--port", type=_port, default=8501, help="REST port (TF Serving's: 8501)")
    serve_.add_argument("--poll-seconds", type=_positive, default=2.0, metavar="SECONDS",
                        help="how often to look for a pushed or rolled-back version")  # fmt: skip
    serve_.add_argument("--max-request-mb", type=_positive, default=32.0, metavar="MB",
                        help="larger request bodies are refused with 413")  # fmt: skip
    cache_help = "local copy of the versions (default: .work/serving/MODEL_NAME/)"
    serve_.add_argument("--cache-dir", help=cache_help)
    serve_.add_argument("--enable-batching", action="store_true",
                        help="merge concurrent requests into batches (TF Serving's "
                        "--enable_batching)")  # fmt: skip
    serve_.add_argument("--batching-parameters-file", type=Path, metavar="FILE",
                        help="TF Serving's BatchingParameters text proto (the manifests' "
                        "own: pipelines/serving/batching_parameters.txt)")  # fmt: skip
    serve_.add_argument("--label", choices=("stable", "canary"),
                        help="serve only what a server of this label serves (one per track "
                        "behind a cluster's traffic split, as `serving-sync --label`)")  # fmt: skip
    serve_.add_argument("--fault-drill", type=_drill, action="append", default=[],
                        metavar="VERSION:ERROR_SHARE[:DELAY_S]",
                        help="make a version fail this share of its requests (500 "
                        "INTERNAL) and answer DELAY_S later: a release rehearsal")  # fmt: skip
    sync_help = "Mirror the served versions and model config into a folder TF Serving reads."
    sync = add("serving-sync", cmd_serving_sync, sync_help)
    sync.add_argument("--target", required=True, help="local folder, e.g. /models")
    when = sync.add_mutually_exclusive_group(required=True)
    when.add_argument("--once", action="store_true", help="sync once and exit (init container)")
    when.add_argument("--interval", type=_positive, metavar="SECONDS",
                      help="sync every SECONDS until stopped (sidecar)")  # fmt: skip
    sync.add_argument("--model-server", metavar="URL",
                      help="the TF Serving REST address (e.g. http://localhost:8501): a label "
                      "is written once it has loaded its version (else none is)")  # fmt: skip
    sync.add_argument("--label", choices=("stable", "canary"),
                      help="mirror only what a server of this label serves: its version, or "
                      "stable's outside a release (one Deployment per label)")  # fmt: skip
    bench = add("bench-serving", cmd_bench_serving,
                "Latency and throughput of `serve` next to the SavedModel in-process.")  # fmt: skip
    bench.add_argument("--requests", type=_count, default=400, help="requests per batch size")
    bench.add_argument("--concurrency", type=_counts, default=[1, 4, 16], metavar="N,N",
                       help="requests in flight (default: 1,4,16)")  # fmt: skip
    bench.add_argument("--batching-parameters-file", type=Path, metavar="FILE",
                       help="the batched server's parameters (default: the manifests' own, "
                       "pipelines/serving/batching_parameters.txt)")  # fmt: skip
    bench.add_argument("--batch-sizes", type=_counts, default=[1, 64], metavar="N,N",
                       help="examples per request (default: 1,64)")  # fmt: skip
    bench_all = add("bench", cmd_bench, "Benchmark the pipeline: time per step against rows, "
                    "a run with nothing new, stock TFX, step start-up, Beam runners.")  # fmt: skip
    bench_all.add_argument("--sizes", type=_counts, default=[10_000, 100_000], metavar="N,N",
                           help="rows of the end-to-end runs")  # fmt: skip
    bench_all.add_argument("--large", action="store_true", help="also 1,000,000 rows (long)")
    bench_all.add_argument("--repeats", type=_count, default=3, help="of each short figure")
    bench_all.add_argument("--skip", type=lambda t: t.split(","), metavar="PART,PART",
                           help="parts to leave out (pipelines/bench/suite.py PARTS)")  # fmt: skip
    bench_all.add_argument("--beam-modes", type=lambda t: t.split(","), metavar="MODE,MODE",
                           help="Beam modes (pipelines/bench/suite.py BEAM_MODES)")  # fmt: skip
    bench_all.add_argument("--before", default="", metavar="REV",
                           help="the commit the `before` part measures side by side with this "
                           "one (default: pipelines/bench/suite.py BEFORE)")  # fmt: skip
    bench_all.add_argument("--tiny", action="store_true",
                           help="every part on tiny data (the test's mode)")  # fmt: skip
    bench_all.add_argument("--report-dir", type=Path, default=REPO_ROOT / "bench",
                           help="where results.json, results.md and the chart go")  # fmt: skip
    bench_input = add("bench-input", cmd_bench_input,
                      "Training examples/s from the TFRecords vs. from memory.")  # fmt: skip
    bench_input.add_argument("--steps", type=_count, default=400,
                             help="timed steps per pass, after 20 warm-up steps")  # fmt: skip
    bench_input.add_argument("--repeats", type=_count, default=7, help="timed passes of each")
    tuning = add("bench-tuning", cmd_bench_tuning,
                 "Wall time of one search at each parallelism, and its best trial against "
                 "the defaults' model.")  # fmt: skip
    tuning.add_argument("--trials", type=_count, default=8, help="trials per search")
    tuning.add_argument("--parallel", type=_counts, default=[1, 2], metavar="N,N",
                        help="trials at once, one search each (default: 1,2)")  # fmt: skip
    tuning.add_argument("--trial-steps", type=_count, default=200, help="steps per trial")
    gpu = add("gpu-check", cmd_gpu_check,
              "Examples/s, GPU use: CPU, 1 and all GPUs, float32 and mixed.")  # fmt: skip
    gpu.add_argument("--steps", type=_count, default=300, help="timed steps per setup")
    image = add("images", cmd_images,
                "Build the step images (cpu_image, and gpu_image with --gpu) with podman or "
                "docker.")  # fmt: skip
    image.add_argument(
        "--base", metavar="IMAGE",
        help="base image instead of the Dockerfile's pinned one; 'local': a Debian minbase + "
        "this Python 3.10, built once (needs root)",
    )  # fmt: skip
    image.add_argument("--gpu", action="store_true", help="also the GPU image (NVIDIA's base)")
    image.add_argument("--push", action="store_true",
                       help="then push them (the registry login is the engine's own)")  # fmt: skip
    image.add_argument("--base-only", action="store_true",
                       help="(re)build the local base image only")  # fmt: skip
    board = add("tensorboard", cmd_tensorboard,
                "Copy the newest training run's TensorBoard logs to .work/tensorboard/ and "
                "serve them with TensorBoard.")  # fmt: skip
    which = board.add_mutually_exclusive_group()
    which.add_argument("--run", metavar="ID",
                       help="this run instead of the newest: the Trainer's execution id (local) "
                       "or the KFP run id (or its beginning)")  # fmt: skip
    which.add_argument("--all", action="store_true",
                       help="every run, side by side (a TensorBoard run folder each)")  # fmt: skip
    board.add_argument("--pipeline-root", metavar="URI",
                       help="where to look for Trainer runs (default: the config's "
                       "pipeline_root); a Kubeflow pipeline root (s3://BUCKET/pipeline_root) "
                       "works too")  # fmt: skip
    which.add_argument("--model-run", metavar="URI",
                       help="one Trainer model_run artifact, e.g. the URI the KFP UI shows for "
                       "the trainer task")  # fmt: skip
    board.add_argument("--no-serve", action="store_true",
                       help="only copy the logs and print the folder")  # fmt: skip
    board.add_argument("--host", default="127.0.0.1",
                       help="address TensorBoard listens on (default: loopback only)")  # fmt: skip
    board.add_argument("--port", type=_port, default=6006, help="TensorBoard's port")
    watch = add("watch", cmd_watch, "Start exactly one run per new complete span of the data root.")
    watch.add_argument("--once", action="store_true", help="poll once and exit (for a CronJob)")
    watch.add_argument("--interval", type=int, metavar="SECONDS",
                       help="seconds between polls, 5-3600 (default: watch_interval)")  # fmt: skip
    watch.add_argument("--endpoint", metavar="URL",
                       help="submit each run to this KFP API (default: run it here)")  # fmt: skip
    watch.add_argument("--package", help="with --endpoint: upload this compiled spec (if "
                       "changed) and run it (default: run the pipeline's newest version on the "
                       "server, what make submit or make schedule uploaded last)")  # fmt: skip
    watch.add_argument("--experiment", help="with --endpoint: KFP experiment (default: the "
                       "pipeline's name)")  # fmt: skip
    return parser


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _exit_on_signal(signum: int, frame) -> None:
    """SIGTERM and SIGHUP end in the same clean-up as an error (the object store is stopped);
    a second signal must not cut that clean-up short."""
    for other in STOP_SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    console.error(f"\nStopping: received {signal.Signals(signum).name}.")
    raise SystemExit(128 + signum)


def _report(error: Exception, log, log_path: Path) -> int:
    """One clear error on the console; the traceback in this command's log."""
    log.write(f"\n{time.strftime('%Y-%m-%d %H:%M:%S')} {args_line()} failed:\n")
    log.write("".join(traceback.format_exception(error)))
    log.flush()
    cause = actionable_cause(error)
    if not isinstance(cause, ActionableError):
        from components.base import store_errors

        if store_errors.unreachable(error):  # e.g. inside a Beam pipeline, which raises its own
            cause = store_errors.store_error("a call to the object store failed", error)
    if isinstance(cause, ActionableError):
        console.error(f"\nerror: {cause}")
        console.error(f"The full log is in {log_path}.")
        return 2 if isinstance(cause, ConfigError) else 1
    console.error(f"\nerror: {type(cause).__name__}: {cause}")
    console.error(f"This is not a known input or setup problem; the traceback is in {log_path}.")
    return 1


def _package(args: argparse.Namespace) -> str:
    """--package, else the compiled spec (`make compile`) of the use case PIPELINE_USE_CASE
    names (else the default one), which must exist."""
    if args.package:
        return args.package
    name = os.environ.get("PIPELINE_USE_CASE") or FIELDS["use_case"].default
    compiled = compiled_spec_path(name)
    if not compiled.is_file():
        raise ConfigError(
            f'no compiled spec at {_shown(compiled)}: run `make compile ARGS="--set cpu_image=... '
            '--set gpu_image=..."` with your images (kubeflow/README.md, section 2), or pass '
            "--package (SPEC) to send another"
        )
    return str(compiled)


def _load_config(args: argparse.Namespace, **fixed: str) -> PipelineConfig:
    """The config from the environment and --set flags, with `fixed` values over both."""
    return PipelineConfig.load({**parse_assignments(args.set or []), **fixed})


def args_line() -> str:
    return " ".join([_prog(), *sys.argv[1:]])


def main(argv: list[str] | None = None) -> int:
    """Runs one command. As the program (`tkp`, `python -m pipelines.cli`: no `argv` given) the
    process ends here, without the interpreter's teardown (_end_process)."""
    code = _main(argv)
    if argv is None:
        _end_process(code)
    return code


def _end_process(code: int) -> None:
    """Ends the process as Python's own exit does, less its teardown of every module and object:
    non-daemon threads are joined and thread pools shut down (threading._shutdown, as
    Py_FinalizeEx calls it), atexit handlers run (log handlers, temporary folders, child
    processes), then os._exit. Once TensorFlow and Beam are loaded that teardown takes about 4 s
    of nothing a user needs (measured: a first run's main returned at 74.3 s, its last atexit
    handler ran at 74.3 s, the process ended at 78.0 s); every file a command writes is closed
    before it returns."""
    import atexit
    import threading

    threading._shutdown()  # CPython 3.10 (the only Python the project runs on)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:  # before anything heavy is imported: a typo fails within a second
        config = _load_config(args) if args.uses_config else None
        if args.command == "add-span":
            _span_size(args, config)
        if args.command == "models" and (args.action == "show") != (args.version is not None):
            raise ConfigError("`models show N` takes a version number; `models list` takes none")
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for signum in STOP_SIGNALS:
        signal.signal(signum, _exit_on_signal)
    args.log_path = console.new_log_path(args.command)
    try:
        args.log_path.parent.mkdir(parents=True, exist_ok=True)
        args.log_path.touch()
    except OSError as e:
        print(f"error: cannot write this command's log {args.log_path} ({e}): set "
              "PIPELINE_WORK_DIR to a writable folder.", file=sys.stderr)  # fmt: skip
        return 1
    with console.output_to_log(args.log_path) as log:
        try:
            code = args.handler(args, config)
        except KeyboardInterrupt:
            console.error("\nInterrupted.")
            code = 130
        except Exception as error:
            code = _report(error, log, args.log_path)
    return code


if __name__ == "__main__":
    sys.exit(main())
