"""Command line: `python -m pipelines.cli {run,add-span,store}`; `--help` on each."""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

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
        logs = sorted((WORK_DIR / "logs").glob("run-*.log")) if (WORK_DIR / "logs").exists() else []
        if logs:
            print(f"The full log is in {logs[-1]}.", file=sys.stderr)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
