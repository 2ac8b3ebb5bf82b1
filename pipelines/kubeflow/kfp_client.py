"""Submit, schedule, pause and resume the compiled pipeline on a Kubeflow Pipelines API server.

Thin functions over `kfp.Client` (SDK 2.5). Everything that can be checked locally (the endpoint
answers, parameter names and types, the cron expression) is checked before anything is uploaded,
so a typo never leaves a half-created pipeline version or schedule behind.

Authentication: where the API sits behind an authenticating proxy (multi-user Kubeflow), a
bearer token goes with every request: KFP_TOKEN (a CI secret, `kubectl create token`), else a
projected ServiceAccount token's file (KF_PIPELINES_SA_TOKEN_PATH, by default where the SDK looks:
/var/run/secrets/kubeflow/pipelines/token; the watch CronJob mounts one). It is never printed,
and never follows a redirect. Multi-user Kubeflow also needs the profile
namespace the runs belong to (`namespace`, KFP_NAMESPACE).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from components.base.config import RUN_PARAMETERS, ConfigError, check_run_parameters
from components.base.errors import ActionableError
from pipelines.kubeflow.kfp_entrypoint import beam_args_from_text

_PORT_FORWARD = "kubectl port-forward -n kubeflow svc/ml-pipeline-ui 8080:80"
_CRON_EXAMPLE = '"0 2 * * *" (nightly at 02:00)'
_MONTHS = {m: i for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)}
_DAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
# robfig/cron v1.2 (KFP's scheduler): seconds first, day of week 0-6 with 0 = Sunday.
_CRON_FIELDS = [("second", 0, 59, {}), ("minute", 0, 59, {}), ("hour", 0, 23, {}),
                ("day-of-month", 1, 31, {}), ("month", 1, 12, _MONTHS),
                ("day-of-week", 0, 6, _DAYS)]  # fmt: skip
_TYPES = {"NUMBER_INTEGER": int, "INT": int, "NUMBER_DOUBLE": float, "DOUBLE": float,
          "STRING": str, "BOOLEAN": lambda v: {"true": True, "false": False}[v.lower()],
          "LIST": json.loads, "STRUCT": json.loads}  # fmt: skip


class KubeflowError(ActionableError):
    """The KFP API server is unreachable or refused a request, or a local input is invalid."""


def check_endpoint(endpoint: str, timeout_s: float = 5) -> bool:
    """Fail fast and clearly when nothing answers at `endpoint` (kfp.Client itself would retry
    its health check for about 25 s and then raise a bare TimeoutError). Returns whether the
    deployment is multi-user (the health check says so)."""
    if not endpoint.startswith(("http://", "https://")):
        raise KubeflowError(f"KFP endpoint {endpoint!r} needs a scheme, e.g. http://localhost:8080")
    url = endpoint.rstrip("/") + "/apis/v2beta1/healthz"
    # No proxies from the environment: kfp.Client's HTTP pool does not use them either. No
    # redirects: urllib would send the token on to wherever one points (a login page).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    token, source = _token_and_source()
    request = urllib.request.Request(
        url, headers={"Authorization": f"Bearer {token}"} if token else {}
    )
    try:
        with opener.open(request, timeout=timeout_s) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status = error.code
    except (OSError, ValueError) as error:  # refused, DNS, timeout, malformed URL
        status = f"no answer ({error})"
    if isinstance(status, int) and 300 <= status < 400:
        raise KubeflowError(
            f"Kubeflow Pipelines API at {endpoint} redirected (HTTP {status}), most likely to a "
            "login page: "
            + (f"{source} was not accepted" if token else "set KFP_TOKEN")
            + "; behind Kubeflow's gateway the API is https://HOST/pipeline, not the UI's URL"
        )
    if status in (401, 403):
        raise KubeflowError(
            f"Kubeflow Pipelines API at {endpoint} refused the request (HTTP {status}): "
            + (f"{source} was sent but not accepted; is it expired, or for another audience?"
               if token else "it needs a bearer token; set KFP_TOKEN (e.g. `kubectl create "
               "token SERVICE_ACCOUNT -n NAMESPACE --audience pipelines.kubeflow.org`)")
        )  # fmt: skip
    if not isinstance(status, int) or not 200 <= status < 300:
        raise KubeflowError(
            f"Kubeflow Pipelines API at {endpoint} is not reachable: GET {url} gave {status}. "
            f"Port-forward the UI service (`{_PORT_FORWARD}`, then use http://localhost:8080) "
            "or pass the right endpoint with --endpoint or KFP_ENDPOINT."
        )
    try:
        return json.loads(body).get("multi_user") is True
    except (ValueError, AttributeError):
        return False


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None  # the 3xx is raised as an HTTPError instead


def normalize_cron(expression: str) -> str:
    """A 5-field (standard) or 6-field cron expression as the 6-field, seconds-first form KFP
    needs. A 5-field expression sent as is would be read with seconds first (hourly, not daily)."""
    fields = expression.split()
    if len(fields) == 5:
        fields = ["0", *fields]
    if len(fields) != 6:
        raise KubeflowError(
            f"cron {expression!r} has {len(fields)} fields; use 5 (minute hour day-of-month month "
            f"day-of-week) or 6 (seconds first), e.g. {_CRON_EXAMPLE}"
        )
    for field, (name, low, high, names) in zip(fields, _CRON_FIELDS, strict=True):
        try:
            _check_cron_field(field, low, high, names, question_ok=name.startswith("day"))
        except ValueError as error:
            raise KubeflowError(
                f"cron {expression!r}: {name} field {field!r} is invalid ({error}); "
                f"e.g. {_CRON_EXAMPLE}"
            ) from None
    return " ".join(fields)


def _check_cron_field(field: str, low: int, high: int, names: dict, question_ok: bool) -> None:
    for part in field.split(","):
        body, slash, step = part.partition("/")
        if slash and (not step.isdigit() or int(step) == 0):
            raise ValueError(f"step {step!r} must be a positive number")
        if body == "*" or (body == "?" and question_ok and not slash):
            continue
        start, dash, end = body.partition("-")
        first = _cron_value(start, low, high, names)
        if dash and _cron_value(end, low, high, names) < first:
            raise ValueError(f"range {body!r} runs backwards")


def _cron_value(text: str, low: int, high: int, names: dict) -> int:
    if text.lower() in names:
        return names[text.lower()]
    if not text.isdigit() or not low <= int(text) <= high:
        named = f" or a name ({'/'.join(n.upper() for n in names)})" if names else ""
        raise ValueError(f"{text!r} is not a number in {low}-{high}{named}")
    return int(text)


def _spec(package_path: str) -> dict:
    try:
        with open(package_path) as stream:
            spec = next(yaml.safe_load_all(stream))
        if not isinstance(spec["root"], dict) or not spec["pipelineInfo"]["name"]:
            raise TypeError("no root DAG or pipeline name")
        return spec
    except (OSError, yaml.YAMLError, StopIteration, KeyError, TypeError, AttributeError) as error:
        raise KubeflowError(
            f"{package_path} is not a compiled pipeline spec ({error!r}); run `make compile` "
            "(kubeflow/README.md, section 2) or pass another --package (SPEC)."
        ) from None


def _root_parameters(package_path: str) -> dict[str, dict]:
    return _spec(package_path)["root"].get("inputDefinitions", {}).get("parameters", {})


def _pipeline_name(package_path: str) -> str:
    """The name the package was compiled with (config `pipeline_name`)."""
    return _spec(package_path)["pipelineInfo"]["name"]


def _typed_parameters(package_path: str, parameters: dict[str, Any]) -> dict[str, Any]:
    """Values converted to the spec's declared types: the API server rejects "3" for an integer."""
    declared = _root_parameters(package_path)
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise KubeflowError(f"unknown parameter(s) {unknown}; valid names: {sorted(declared)}")
    typed = {}
    for name, value in parameters.items():
        kind = declared[name].get("parameterType") or declared[name].get("type", "STRING")
        if kind in ("NUMBER_INTEGER", "INT") and isinstance(value, float) and value.is_integer():
            value = int(value)  # a JSON number read back from the API
        try:
            typed[name] = _TYPES[kind](value) if isinstance(value, str) else value
        except (KeyError, ValueError) as error:
            raise KubeflowError(f"parameter {name}={value!r} is not a valid {kind}") from error
    # The rules every step applies to its run parameters, checked before anything is submitted.
    try:
        if (
            "beam_args" in typed
        ):  # the entry point's own check (pipelines/kubeflow/kfp_entrypoint.py)
            beam_args_from_text(typed["beam_args"], "--param")
        check_run_parameters("--param", {k: v for k, v in typed.items() if k in RUN_PARAMETERS})
    except ConfigError as error:
        raise KubeflowError(str(error)) from None
    return typed


@contextlib.contextmanager
def _api(what: str) -> Iterator[None]:
    import kfp_server_api

    try:
        yield
    except kfp_server_api.ApiException as error:
        raise KubeflowError(f"{what}: HTTP {error.status} {error.reason}: {error.body}") from None
    except ValueError as error:  # kfp.Client's own, when a name it looks up is not unique
        if not str(error).startswith("Multiple"):
            raise
        raise KubeflowError(
            f"{what}: {error} (KFP 2.16+ lets pipelines share a display name): rename or delete "
            "the others in the KFP UI, or compile with another pipeline_name"
        ) from None


# A projected ServiceAccount token (audience pipelines.kubeflow.org) where the SDK looks for one:
# kfp/client/__init__.py KF_PIPELINES_SA_TOKEN_ENV and KF_PIPELINES_SA_TOKEN_PATH. kfp.Client reads
# it only when given no host, and this module always gives one, so it is read here: at each
# client, because the kubelet rotates the file.
TOKEN_PATH_ENV = "KF_PIPELINES_SA_TOKEN_PATH"
TOKEN_PATH = Path("/var/run/secrets/kubeflow/pipelines/token")


def _token_and_source() -> tuple[str | None, str]:
    """The bearer token (KFP_TOKEN, else the projected token's file) and what it came from."""
    token = os.environ.get("KFP_TOKEN", "").strip()
    if token:
        return token, "KFP_TOKEN"
    named = os.environ.get(TOKEN_PATH_ENV, "").strip()
    path = Path(named) if named else TOKEN_PATH
    try:
        token = path.read_text().strip()
    except OSError as error:
        if named:  # asked for and missing: a mount that is not there
            raise KubeflowError(
                f"{TOKEN_PATH_ENV}={named}: cannot read the token ({error.strerror}); mount a "
                "projected ServiceAccount token there (kubeflow/watch-cronjob.yaml shows how)"
            ) from None
        return None, ""
    return token or None, f"the token in {path}"


def _token() -> str | None:
    return _token_and_source()[0]


_POD_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _client(endpoint: str, namespace: str | None, multi_user: bool) -> Any:
    namespace = namespace or os.environ.get("KFP_NAMESPACE", "").strip() or None
    if multi_user and not namespace and _POD_NAMESPACE.exists():  # in a pod, as kfp.Client does
        namespace = _POD_NAMESPACE.read_text().strip()
    if multi_user and not namespace:  # the API server would refuse the experiment
        raise KubeflowError(
            f"Kubeflow Pipelines at {endpoint} is multi-user: name the profile namespace the runs "
            "belong to with --namespace or KFP_NAMESPACE (e.g. kubeflow-user-example-com)"
        )
    import kfp  # imported late: it costs about a second, and the checks above don't need it

    # "kubeflow" is the SDK's own placeholder for "no namespace given".
    return kfp.Client(host=endpoint, namespace=namespace or "kubeflow", existing_token=_token())


def _pipeline_version(client: Any, package_path: str, pipeline_name: str) -> tuple[str, str]:
    """Upload the package as a version of `pipeline_name` (so UI runs use the same spec).

    The pipeline's newest version is always the package submitted or scheduled last: an
    identical earlier upload (its version name carries the package's hash) is reused only while
    it is the newest; otherwise the package is uploaded again, under a name that adds the time.
    `tkp watch --endpoint` and the UI's *Create run* (newest version first) therefore run what
    was deployed last, a reverted commit included."""
    version = f"{pipeline_name}-{hashlib.sha256(Path(package_path).read_bytes()).hexdigest()[:12]}"
    pipeline_id = client.get_pipeline_id(pipeline_name)
    if pipeline_id is None:  # the first upload creates the pipeline and its first version
        pipeline_id = client.upload_pipeline(package_path, pipeline_name).pipeline_id
        return pipeline_id, _newest_version(client, pipeline_id).pipeline_version_id
    newest = _newest_version(client, pipeline_id)
    if newest is not None and re.fullmatch(rf"{re.escape(version)}(-\d{{8}}-\d{{6}})?",
                                           newest.display_name):  # fmt: skip
        return pipeline_id, newest.pipeline_version_id
    if client.list_pipeline_versions(pipeline_id, filter=_name_filter(version)).pipeline_versions:
        # Lower case and digits: KFP 2.17's Kubernetes-native store names versions as objects.
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
        version = f"{version}-{now}"
    created = client.upload_pipeline_version(package_path, version, pipeline_id=pipeline_id)
    return pipeline_id, created.pipeline_version_id


def _newest_version(client: Any, pipeline_id: str) -> Any:
    found = client.list_pipeline_versions(pipeline_id, sort_by="created_at desc")
    return found.pipeline_versions[0] if found.pipeline_versions else None


def _name_filter(name: str) -> str:
    predicate = {"operation": "EQUALS", "key": "display_name", "stringValue": name}
    return json.dumps({"predicates": [predicate]})


def submit(
    endpoint: str,
    package_path: str,
    parameters: dict[str, Any],
    experiment: str | None = None,
    namespace: str | None = None,
) -> str:
    """Upload the package (if new) as a version of the pipeline it was compiled as, and start one
    run in `experiment` (default: the pipeline's name); returns the run id."""
    multi_user = check_endpoint(endpoint)
    typed = _typed_parameters(package_path, parameters)
    pipeline_name = _pipeline_name(package_path)
    experiment = experiment or pipeline_name
    client = _client(endpoint, namespace, multi_user)
    with _api(f"submitting {package_path} to {endpoint}"):  # the experiment first: it can fail
        experiment_id = client.create_experiment(experiment, namespace=namespace).experiment_id
        pipeline_id, version_id = _pipeline_version(client, package_path, pipeline_name)
        return _start_run(client, experiment_id, pipeline_name, typed, pipeline_id, version_id)


def _start_run(client: Any, experiment_id: str, pipeline_name: str, parameters: dict[str, Any],
               pipeline_id: str, version_id: str) -> str:  # fmt: skip
    """A run of that version, named after the pipeline and the time; its id."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    run = client.run_pipeline(experiment_id, f"{pipeline_name} {now}", params=parameters,
                              pipeline_id=pipeline_id, version_id=version_id)  # fmt: skip
    return run.run_id


def submit_newest(
    endpoint: str,
    pipeline_name: str,
    parameters: dict[str, Any],
    experiment: str | None = None,
    namespace: str | None = None,
) -> str:
    """One run of the newest version of `pipeline_name` (what `make submit` or `make schedule`,
    CI after a merge, uploaded last) in `experiment` (default: the pipeline's name); returns the
    run id. `parameters` are typed already; the run parameters' rules are checked first."""
    try:
        check_run_parameters("--param", {k: v for k, v in parameters.items()
                                         if k in RUN_PARAMETERS})  # fmt: skip
    except ConfigError as error:
        raise KubeflowError(str(error)) from None
    multi_user = check_endpoint(endpoint)
    client = _client(endpoint, namespace, multi_user)
    with _api(f"submitting a run of pipeline {pipeline_name!r} to {endpoint}"):
        version = newest_version(client, endpoint, pipeline_name)
        experiment_id = client.create_experiment(
            experiment or pipeline_name, namespace=namespace
        ).experiment_id
        return _start_run(client, experiment_id, pipeline_name, parameters,
                          version.pipeline_id, version.pipeline_version_id)  # fmt: skip


def newest_version(client: Any, endpoint: str, pipeline_name: str) -> Any:
    """The pipeline's newest version, or an error saying how to upload one."""
    pipeline_id = client.get_pipeline_id(pipeline_name)
    version = _newest_version(client, pipeline_id) if pipeline_id is not None else None
    if version is None:
        raise KubeflowError(
            f"no pipeline {pipeline_name!r} at {endpoint}: upload it first with `make submit` "
            "or `make schedule` (kubeflow/README.md, section 7), or pass --package"
        )
    return version


def check_pipeline(endpoint: str, pipeline_name: str, namespace: str | None = None) -> None:
    """The endpoint answers and holds a version of `pipeline_name`."""
    multi_user = check_endpoint(endpoint)
    client = _client(endpoint, namespace, multi_user)
    with _api(f"looking up pipeline {pipeline_name!r} at {endpoint}"):
        newest_version(client, endpoint, pipeline_name)


def schedule(
    endpoint: str,
    package_path: str,
    cron: str,
    parameters: dict[str, Any],
    experiment: str | None = None,
    job_name: str | None = None,
    namespace: str | None = None,
    replace: bool = False,
    say: Callable[[str], None] = print,
) -> str:
    """Create an enabled recurring run; returns its id. One run at a time (a run still going
    when the next is due delays it); no catch-up (after a pause only the latest missed run).

    With `replace`, a recurring run of the same name moves to this package (CI after a merge),
    keeping its parameters (those given here win) and its state (a paused one stays paused).
    KFP's API cannot change a recurring run's pipeline version, so the old one is paused, the
    new one created, then the old one deleted: two schedules never trigger side by side, and if
    anything fails before the creation, the old one is resumed as it was.

    `experiment` defaults to the pipeline's name, `job_name` to `<pipeline name>-nightly`."""
    cron6 = normalize_cron(cron)
    multi_user = check_endpoint(endpoint)
    typed = _typed_parameters(package_path, parameters)
    pipeline_name = _pipeline_name(package_path)
    experiment = experiment or pipeline_name
    job_name = job_name or f"{pipeline_name}-nightly"
    client = _client(endpoint, namespace, multi_user)
    with _api(f"scheduling {package_path} on {endpoint}"):
        experiment_id = client.create_experiment(experiment, namespace=namespace).experiment_id
        same_name = _name_filter(job_name)
        found = client.list_recurring_runs(experiment_id=experiment_id, filter=same_name)
        old_jobs = found.recurring_runs or []
        if old_jobs and not replace:  # two schedules of one name would run the pipeline twice
            raise KubeflowError(
                f"a recurring run named {job_name!r} already exists in experiment {experiment!r} "
                f"(id {old_jobs[0].recurring_run_id}); pass --replace (make schedule REPLACE=1) "
                "to move it to this package, delete it in the UI, or choose another --name."
            )
        kept: dict[str, Any] = {}
        for old in old_jobs:
            kept.update((old.runtime_config and old.runtime_config.parameters) or {})
        dropped = sorted(set(kept) - set(_root_parameters(package_path)))
        if dropped:  # the new spec has no such parameter: keeping it would fail every deploy
            say(f"Not kept from recurring run {job_name!r}: {dropped} (not parameters of "
                f"{package_path})")  # fmt: skip
            kept = {k: v for k, v in kept.items() if k not in dropped}
        if kept:
            try:
                typed = _typed_parameters(package_path, {**kept, **typed})
            except KubeflowError as error:
                raise KubeflowError(f"the parameters of recurring run {job_name!r}: {error}; "
                                    "pass new values with --param") from None  # fmt: skip
        enabled = not old_jobs or any(_enabled(old) for old in old_jobs)
        pipeline_id, version_id = _pipeline_version(client, package_path, pipeline_name)
        paused = []
        try:
            for old in old_jobs:
                if _enabled(old):
                    client.disable_recurring_run(old.recurring_run_id)
                    paused.append(old.recurring_run_id)
            job = client.create_recurring_run(
                experiment_id, job_name, cron_expression=cron6, max_concurrency=1,
                no_catchup=True, params=typed, pipeline_id=pipeline_id, version_id=version_id,
                enabled=enabled,
            )  # fmt: skip
        except BaseException:  # an API error, or Ctrl-C
            for old_id in paused:
                client.enable_recurring_run(old_id)
            raise
        for old in old_jobs:
            client.delete_recurring_run(old.recurring_run_id)
    return job.recurring_run_id


def _enabled(job: Any) -> bool:
    """KFP 2.5 answers mode ENABLE or DISABLE; anything else, trust the status."""
    if job.mode in ("ENABLE", "DISABLE"):
        return job.mode == "ENABLE"
    return job.status != "DISABLED"


def pause(endpoint: str, recurring_run_id: str, namespace: str | None = None) -> None:
    """Stop a recurring run from starting new runs (runs already going carry on)."""
    check_endpoint(endpoint)  # by id: no namespace needed, even on multi-user Kubeflow
    client = _client(endpoint, namespace, multi_user=False)
    with _api(f"pausing recurring run {recurring_run_id}"):
        client.disable_recurring_run(recurring_run_id)


def resume(endpoint: str, recurring_run_id: str, namespace: str | None = None) -> None:
    """Re-enable a paused recurring run; with no catch-up, missed slots are not back-filled."""
    check_endpoint(endpoint)
    client = _client(endpoint, namespace, multi_user=False)
    with _api(f"resuming recurring run {recurring_run_id}"):
        client.enable_recurring_run(recurring_run_id)
