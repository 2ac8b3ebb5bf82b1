"""Beam steps on local workers: no TFX source package to stage.

Before each Beam step TFX builds an sdist of its own source for the workers, unless the Beam
options already name one (`--extra_package`, `--setup_file`, `--requirements_file`,
`--sdk_container_image`, ...): tfx/dsl/components/base/base_beam_executor.py calls
tfx/utils/dependency_utils.py `make_beam_dependency_flags`. It takes 1-2 s per step and leaves a
~45 MB folder in the system temp directory that nothing removes: ~170 MB per local run, so
scheduled local runs fill the disk. Workers that run in this process or on this machine
(Beam's DirectRunner, or a portable runner with LOOPBACK workers) import the installed TFX and
never read that package, so for them it is not built; nor for EXTERNAL workers, the worker pools
an operator runs from the step image. Other remote workers (Dataflow, DOCKER or PROCESS
environments) still get TFX's default unless the options name their image or packages.
"""

from __future__ import annotations

_LOCAL_RUNNERS = {
    None, "directrunner", "direct", "switchingdirectrunner", "bundlebaseddirectrunner",
}  # fmt: skip


def workers_are_local(beam_args: list[str]) -> bool:
    """True when the options' workers already have TFX: the DirectRunner (Beam's default), the
    PortableRunner with LOOPBACK workers (this process) or EXTERNAL ones (worker pools the
    operator runs, from the step image, README.md "Speed and scale"; Beam's worker pool does not
    install staged packages anyway)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(flags=list(beam_args)).get_all_options()
    runner = (options.get("runner") or "").lower() or None
    if runner in _LOCAL_RUNNERS:
        return True
    workers = options.get("environment_type")
    return runner == "portablerunner" and workers in ("LOOPBACK", "EXTERNAL")


def skip_tfx_package_for_local_workers() -> None:
    """Wraps TFX's dependency flags: unchanged Beam options where the workers are local. Once per
    process; the executors look the function up at each step, so it applies to every step."""
    from tfx.utils import dependency_utils

    build = dependency_utils.make_beam_dependency_flags
    if getattr(build, "_local_aware", False):
        return

    def make_beam_dependency_flags(beam_pipeline_args: list[str]) -> list[str]:
        if workers_are_local(beam_pipeline_args):
            return beam_pipeline_args
        return build(beam_pipeline_args)

    make_beam_dependency_flags._local_aware = True
    dependency_utils.make_beam_dependency_flags = make_beam_dependency_flags
