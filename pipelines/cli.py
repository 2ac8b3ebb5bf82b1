"""Command line: `python -m pipelines.cli COMMAND`; `--help` on each.

Local: run, add-span, store. Kubeflow: compile, submit, schedule, pause, resume.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
warnings.filterwarnings("ignore", category=FutureWarning)

from pipelines.config import WORK_DIR, ConfigError, PipelineConfig, parse_assignments  # noqa: E402
from pipelines.errors import actionable_cause  # noqa: E402


def _config(args: argparse.Namespace) -> PipelineConfig:
    return PipelineConfig.load(parse_assignments(args.set or []))


def cmd_run(args: argparse.Namespace) -> int:
    from pipelines import data, local_runner, serving
    from pipelines.run_summary import format_summary

    config = _config(args)
    log_path = WORK_DIR / "logs" / f"run-{time.strftime('%Y%m%d-%H%M%S')}.log"
    started = time.monotonic()
    with local_runner.object_store(config, keep=args.keep_store):
        local_runner.ensure_data(config)
        print(f"Running pipeline {config.pipeline_name!r} (full log: {log_path}) ...", flush=True)
        summary = local_runner.run_pipeline(config, log_path=log_path)
        print(format_summary(summary))
        served = summary.pushed_path or _latest_served(config)
        if served:
            span = data.existing_spans(config.data_root)[-1]
            csv_path = storage_first_csv(data.span_dir(config.data_root, span))
            rows = serving.read_rows(csv_path, limit=5)
            probabilities = serving.predict(served, rows)
            print(f"\nPredictions of {served} on the first rows of span {span}:")
            print(f"  {'payment_type':<12} {'fare':>7} {'miles':>6}  P(big tip)  actual")
            for row, p in zip(rows, probabilities, strict=False):
                print(f"  {row['payment_type']:<12} {row['fare']:>7} {row['trip_miles']:>6}  "
                      f"{p:10.3f}  {row['big_tipper']}")  # fmt: skip
    print(f"\nDone in {time.monotonic() - started:.0f} s.")
    return 0


def _latest_served(config: PipelineConfig) -> str | None:
    from components.baseline import pushed_versions

    versions = pushed_versions(config.serving_model_dir)
    return versions[max(versions)] if versions else None


def storage_first_csv(span_dir: str) -> str:
    from pipelines import storage

    return storage.list_files(span_dir.rstrip("/") + "/*.csv")[0]


def cmd_add_span(args: argparse.Namespace) -> int:
    from pipelines import data, local_runner

    config = _config(args)
    rows = args.rows or config.rows_per_span
    drift = config.drift if args.drift is None else args.drift
    with local_runner.object_store(config):
        span = data.add_next_span(config.data_root, rows, seed=config.seed, drift=drift)
    print(
        f"Wrote span {span} ({rows} rows, drift {drift}) to {data.span_dir(config.data_root, span)}"
    )
    return 0


def cmd_store(args: argparse.Namespace) -> int:
    from pipelines import local_runner

    config = _config(args)
    with local_runner.object_store(config) as endpoint:
        print(f"Object store at {endpoint}; Ctrl-C stops it.")
        key_id = os.environ["AWS_ACCESS_KEY_ID"]
        print(f"  export AWS_ENDPOINT_URL_S3={endpoint} AWS_ACCESS_KEY_ID={key_id} "
              "AWS_SECRET_ACCESS_KEY=<any> AWS_REGION=us-east-1")  # fmt: skip
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


def cmd_compile(args: argparse.Namespace) -> int:
    from pipelines import kubeflow_runner

    config = _config(args)
    path = kubeflow_runner.write(config, Path(args.output))
    print(f"Wrote {path} (cpu image {config.cpu_image}, gpu image {config.gpu_image}).")
    return 0


def _parameters(args: argparse.Namespace) -> dict[str, str]:
    return parse_assignments(args.param or [], flag="--param")


def cmd_submit(args: argparse.Namespace) -> int:
    from pipelines import kfp_client

    config = _config(args)
    run_id = kfp_client.submit(
        args.endpoint, args.package, config.pipeline_name, _parameters(args), args.experiment
    )
    print(f"Started run {run_id} of {config.pipeline_name!r} on {args.endpoint}.")
    return 0


def cmd_schedule(args: argparse.Namespace) -> int:
    from pipelines import kfp_client

    config = _config(args)
    job_id = kfp_client.schedule(
        args.endpoint, args.package, config.pipeline_name, args.cron, _parameters(args),
        args.experiment, args.name,
    )  # fmt: skip
    print(f"Created recurring run {job_id} ({args.name}, cron {args.cron!r}) on {args.endpoint}.")
    return 0


def cmd_pause(args: argparse.Namespace) -> int:
    from pipelines import kfp_client

    kfp_client.pause(args.endpoint, args.recurring_run_id)
    print(f"Paused recurring run {args.recurring_run_id}.")
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from pipelines import kfp_client

    kfp_client.resume(args.endpoint, args.recurring_run_id)
    print(f"Resumed recurring run {args.recurring_run_id}.")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m pipelines.cli", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    def add(name: str, handler, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument(
            "--set",
            action="append",
            metavar="FIELD=VALUE",
            help="override a config field (pipelines/config.py); repeatable",
        )
        sub.set_defaults(handler=handler)
        return sub

    run = add(
        "run", cmd_run, "Run the whole pipeline locally (LocalDagRunner) and show the result."
    )
    run.add_argument(
        "--keep-store", action="store_true", help="leave the embedded object store running"
    )
    span = add("add-span", cmd_add_span, "Generate the next data span into the data root.")
    span.add_argument("--rows", type=int, help="rows in the new span (default: rows_per_span)")
    span.add_argument("--drift", type=float, help="drift strength (0: none; 1: strong)")
    add("store", cmd_store, "Start the embedded object store in the foreground.")

    from pipelines.kubeflow_runner import SPEC_PATH

    compile_ = add(
        "compile", cmd_compile, "Compile the pipeline into a Kubeflow Pipelines v2 spec."
    )
    compile_.add_argument("--output", default=str(SPEC_PATH), help=f"default: {SPEC_PATH}")

    def add_kfp(
        name: str, handler, help_text: str, package: bool = True
    ) -> argparse.ArgumentParser:
        sub = add(name, handler, help_text)
        sub.add_argument(
            "--endpoint",
            default=os.environ.get("KFP_ENDPOINT", "http://localhost:8080"),
            help="KFP API endpoint (default: $KFP_ENDPOINT or http://localhost:8080)",
        )
        if package:
            sub.add_argument("--package", default=str(SPEC_PATH), help="compiled spec to upload")
            sub.add_argument("--experiment", default="taxi-tips", help="KFP experiment")
            sub.add_argument("--param", action="append", metavar="NAME=VALUE",
                             help="pipeline parameter for the run(s); repeatable")  # fmt: skip
        return sub

    add_kfp("submit", cmd_submit, "Upload the spec (if changed) and start one run.")
    schedule = add_kfp(
        "schedule", cmd_schedule, "Create a recurring run (one at a time, no catch-up)."
    )
    schedule.add_argument("--cron", required=True, help='cron, e.g. "0 2 * * *" (nightly, 02:00)')
    schedule.add_argument("--name", default="taxi-tips-nightly", help="recurring run name")
    for name, handler, text in (
        ("pause", cmd_pause, "Pause a recurring run."),
        ("resume", cmd_resume, "Resume a paused recurring run."),
    ):
        sub = add_kfp(name, handler, text, package=False)
        sub.add_argument("--recurring-run-id", required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code = args.handler(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        code = 2
    except Exception as e:  # a failed step: say which and what to do, not a 200-line trace
        cause = actionable_cause(e)
        print(f"\nerror: {type(cause).__name__}: {cause}", file=sys.stderr)
        logs = sorted((WORK_DIR / "logs").glob("run-*.log")) if args.command == "run" else []
        if logs:
            print(f"The full log is in {logs[-1]}.", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
