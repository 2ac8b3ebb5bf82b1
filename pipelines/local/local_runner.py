"""Runs `create_pipeline(config)` with TFX's LocalDagRunner and reports what happened.

A thin shell: it provides the object store (embedded SeaweedFS unless one is configured), makes
sure there is data, runs the pipeline, and reads the outcome back from ML Metadata.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from components.base import console
from components.base.config import PipelineConfig
from pipelines.local.run_phases import RunPhases

if TYPE_CHECKING:
    from pipelines.run_summary import RunSummary


def latest_served(config: PipelineConfig) -> str | None:
    """The served version's folder (components/base/registry.py), if any."""
    from components.base import serving_state, storage

    version = serving_state.read(config.serving_model_dir, config.model_name).stable
    return None if version is None else storage.join(config.serving_model_dir, str(version))


def nothing_new(config: PipelineConfig) -> str | None:
    """Why this run would train nothing (its input already trained a model and force is 0), found
    as SelectSpans finds it (components/steps/span_selection.py) but without loading TFX, so that a
    run with no new data ends in seconds; None when the run must go on (also when the input is
    unreadable: the pipeline's first step then reports it as usual)."""
    from components.base import registry, spans

    if config.force:
        return None
    try:
        selection = spans.select(
            config.data_root, config.span, config.window_spans, config.success_marker
        )
    except spans.ExampleGenInputError:
        return None
    folder = registry.versions_dir(config.serving_root, config.model_name)
    before = registry.trained_outcome(folder, selection["fingerprint"])
    return None if before is None else spans.no_new_data_reason(selection, before)


def ensure_data(config: PipelineConfig) -> None:
    """Writes span 0 when the data root holds no spans, so a first run has something to train on."""
    from pipelines import data

    if data.existing_spans(config.data_root):
        return
    console.say(
        f"No data under {config.data_root}: generating span 0 ({config.rows_per_span} rows) ..."
    )
    data.write_span(config.data_root, 0, config.rows_per_span, seed=config.seed, drift=config.drift,
                    marker=config.success_marker, use_case=config.use_case)  # fmt: skip


def _reset_peak_memory() -> None:
    """Starts this process's peak resident memory (VmHWM) afresh (Linux; elsewhere a no-op)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _peak_memory_gb() -> float | None:
    with contextlib.suppress(OSError, ValueError, StopIteration):
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(x for x in status if x.startswith("VmHWM:")).split()[1]) / 1024**2
    return None


@contextlib.contextmanager
def step_progress(total: int) -> Iterator[dict[str, dict]]:
    """Prints a line as each step starts and ends; yields, per step, its wall time (`seconds`),
    whether it ran (`ran`) and the process's peak memory while it ran (`peak_gb`; steps run in
    this process; Beam's or training's worker processes, when configured, are not counted).

    Wraps TFX's node launcher rather than parsing its log lines: components change absl's log
    verbosity mid-run, which silenced a log-based progress report.
    """
    from tfx.orchestration.portable import launcher

    original_launch = launcher.Launcher.launch
    steps: dict[str, dict] = {}
    run_start = time.monotonic()

    def launch(self):
        node = self._pipeline_node.node_info.id
        console.say(f"[{len(steps) + 1}/{total}] {node} ...")
        _reset_peak_memory()
        started = time.monotonic()
        ran = None
        try:
            result = original_launch(self)
            # No execution: a condition (no new data) or a skipped upstream step left it out.
            ran = bool(result is not None and getattr(result, "execution_id", None))
            return result
        finally:
            now = time.monotonic()
            peak = _peak_memory_gb()
            steps[node] = {"seconds": now - started, "ran": bool(ran), "peak_gb": peak}
            outcome = {None: "FAILED after", True: "finished in", False: "skipped after"}[ran]
            memory = f", peak memory {peak:.2f} GB" if ran and peak else ""
            console.say(f"[{len(steps)}/{total}] {node} {outcome} {now - started:.1f} s{memory} "
                        f"(run so far {now - run_start:.0f} s)")  # fmt: skip

    # Our executors' own notes (span read, baseline found, version pushed) go to the console too.
    notes = logging.getLogger("components")
    console_handler = logging.StreamHandler(console.out())
    console_handler.setFormatter(logging.Formatter("      %(message)s"))
    notes.addHandler(console_handler)
    notes.setLevel(logging.INFO)
    launcher.Launcher.launch = launch
    try:
        yield steps
    finally:
        launcher.Launcher.launch = original_launch
        notes.removeHandler(console_handler)


@contextlib.contextmanager
def _step_times_recorded() -> Iterator[None]:
    """Every executor's outputs carry the step times (components/steps/step_times.py), as on
    Kubeflow:
    TFX's executor operators all call python_executor_operator.run_with_executor."""
    from tfx.orchestration.portable import python_executor_operator as operator

    from components.steps.step_times import timed

    original = operator.run_with_executor

    def run_with_executor(execution_info, executor):
        return original(execution_info, timed(executor, execution_info.pipeline_node.node_info.id))

    operator.run_with_executor = run_with_executor
    try:
        yield
    finally:
        operator.run_with_executor = original


def save_report(report_uri: str | None, log_path: Path | None) -> Path | None:
    """The run report (components/steps/run_report.py) copied beside the run's log."""
    if not report_uri or log_path is None:
        return None
    from components.base import storage

    path = log_path.with_suffix(".report.html")
    path.write_bytes(storage.read_bytes(report_uri))
    return path


@contextlib.contextmanager
def logs_to_file(log_path: Path | None) -> Iterator[None]:
    """The libraries' logging (TFX, Beam, absl) at INFO into `log_path` while a pipeline runs;
    the console's handlers then let only the progress lines through (components/base/console.py).
    Without a log file, warnings still reach the other handlers."""
    root = logging.getLogger()
    file_handler = None
    if log_path:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        file_handler = logging.FileHandler(log_path)
        file_handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        root.addHandler(file_handler)
    quiet = logging.CRITICAL + 1 if file_handler else logging.WARNING
    console_levels = {h: h.level for h in root.handlers if h is not file_handler}
    for handler in console_levels:
        handler.setLevel(max(handler.level, quiet))
    previous_level = root.level
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        if file_handler:
            root.removeHandler(file_handler)
            file_handler.close()
        for handler, level in console_levels.items():
            handler.setLevel(level)
        root.setLevel(previous_level)


def run_pipeline(
    config: PipelineConfig,
    log_path: Path | None = None,
    timings: Path | None = None,
    phases: RunPhases | None = None,
) -> RunSummary:
    """Runs the pipeline once with LocalDagRunner (store and data must be in place); `timings`:
    a JSON file to write each step's seconds and peak memory (step_progress) and `phases`' to,
    also when a step fails."""
    from pipelines.run_summary import last_execution_id, read_summary

    phases = phases or RunPhases()
    with phases.timed("TFX import and pipeline compilation"):
        pipeline_ir, steps_in_dag, tfx = _compiled(config)
        from components.base import storage

        storage.beam_filesystems()  # the steps' own Beam IO gets storage's fixes (imported now)
    Path(config.metadata_path).parent.mkdir(parents=True, exist_ok=True)
    last_execution = last_execution_id(config)
    with (
        logs_to_file(log_path),
        step_progress(total=steps_in_dag) as steps,
        _step_times_recorded(),
    ):
        phases.steps = steps
        try:
            with phases.timed("steps and the runner between them"):
                tfx.orchestration.LocalDagRunner().run_with_ir(pipeline_ir)
        finally:
            phases.write(timings)
    seconds = {node: step["seconds"] for node, step in steps.items()}
    with phases.timed("summary and run report"):
        return read_summary(config, after_execution=last_execution, seconds=seconds)


def _compiled(config: PipelineConfig):
    """The pipeline's IR with every run parameter bound to the config's value, its number of
    steps, and tfx.v1."""
    from tfx import v1 as tfx  # heavy import (~20 s): only when a run is asked for
    from tfx.dsl.compiler import compiler
    from tfx.orchestration.portable import runtime_parameter_utils

    from components.steps.beam_dependencies import skip_tfx_package_for_local_workers
    from pipelines.pipeline import create_pipeline, run_parameter_values

    pipeline = create_pipeline(
        config,
        metadata_connection_config=tfx.orchestration.metadata.sqlite_metadata_connection_config(
            config.metadata_path
        ),
    )
    skip_tfx_package_for_local_workers()
    pipeline_ir = compiler.Compiler().compile(pipeline)
    # Every run parameter bound to the config's value: TFX compiles no default for a falsy one
    # (`if default_value:` in tfx/dsl/compiler/compiler_utils.py), so `span=0` or `min_auc=0`
    # would stop the run with "Parameter value not ready".
    runtime_parameter_utils.substitute_runtime_parameter(pipeline_ir, run_parameter_values(config))
    return pipeline_ir, len(pipeline.components), tfx
