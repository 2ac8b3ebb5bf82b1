"""The `kfp-launcher` ConfigMap of a run's namespace as the KFP backend reads it: the pipeline
root, the store session every step's launcher opens, and the Secret that session names.

Rules, from kubeflow/pipelines at tags 2.5.0 and 2.17.0 (identical except where said):
- backend/src/v2/config/env.go: `defaultPipelineRoot`, else minio://mlpipeline/v2/artifacts
  (DefaultPipelineRoot); `providers` parsed as YAML into {minio, s3, gs} (getBucketProviders);
  the provider is the root's scheme, anything else refused (GetStoreSessionInfo);
- backend/src/v2/config/s3.go ProvideSessionInfo: no `default` and no `Overrides`, or a query
  string in the root: the session is `fromEnv` (the pod's own environment); a `default` without
  `credentials` is "invalid provider config: missing default credentials"; disableSSL defaults
  to false, forcePathStyle to true, maxRetries to 5 (2.15.0+); fromEnv false takes the
  secretRef's name and keys;
- backend/src/v2/objectstore/object_store.go getS3BucketCredential: the launcher reads that
  Secret in the run's namespace; "could not find specified keys" when either key is empty.

Refused rather than played (stricter than the backend, never kinder): keys the Go structs do not
have (sigs.k8s.io/yaml drops them silently, so a misspelled `secretRef` leaves a nil pointer the
launcher dereferences), `Overrides`, and the minio and gs providers.
"""

from __future__ import annotations

import urllib.parse

import yaml

from tests.stand_ins.kfp_versions import KfpBackend

DEFAULT_ROOT = "minio://mlpipeline/v2/artifacts"
# The json tags of the Go structs (s3.go S3ProviderDefault, S3Credentials, S3SecretRef).
_FIELDS = {
    "providers": {"minio", "s3", "gs"},
    "s3": {"default", "Overrides"},
    "default": {"endpoint", "credentials", "region", "disableSSL", "forcePathStyle", "maxRetries"},
    "credentials": {"fromEnv", "secretRef"},
    "secretRef": {"secretName", "accessKeyKey", "secretKeyKey"},
}


class LauncherConfigError(ValueError):
    """What the driver or launcher would fail on, or what this stand-in does not play."""


def pipeline_root(data: dict[str, str] | None) -> str:
    """env.go DefaultPipelineRoot: the ConfigMap is optional, so is the key."""
    return (data or {}).get("defaultPipelineRoot") or DEFAULT_ROOT


def _checked(value: object, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LauncherConfigError(f"providers: {where} is not a mapping")
    unknown = set(value) - _FIELDS[where]
    if unknown:
        raise LauncherConfigError(f"providers: unknown field(s) {sorted(unknown)} in {where} "
                                  "(the backend would drop them silently)")  # fmt: skip
    return value


def session_info(data: dict[str, str] | None, root: str, version: KfpBackend) -> dict:
    """env.go GetStoreSessionInfo and s3.go ProvideSessionInfo for the run's pipeline root."""
    parsed = urllib.parse.urlparse(root)
    if parsed.scheme != "s3":
        raise LauncherConfigError(f"pipeline root {root}: only an s3:// root is played")
    text = (data or {}).get("providers", "")
    try:
        providers = _checked(yaml.safe_load(text) if text else None, "providers")
    except yaml.YAMLError as error:
        raise LauncherConfigError(
            "failed to unmarshall kfp bucket providers, ensure that providers config is well "
            f"formed: {error}"
        ) from None
    s3 = _checked(providers.get("s3"), "s3")
    if "Overrides" in s3:
        raise LauncherConfigError("providers: s3 Overrides are not played")
    if s3.get("default") is None or parsed.query:  # `default: {}` is a Default, not a nil one
        return {"Provider": "s3", "Params": {"fromEnv": "true"}}
    default = _checked(s3["default"], "default")
    if "maxRetries" in default and not version.session_max_retries:
        raise LauncherConfigError("providers: maxRetries is not read before KFP 2.15 (the "
                                  "backend would drop it silently)")  # fmt: skip
    if not default.get("credentials"):
        raise LauncherConfigError("invalid provider config: missing default credentials")
    credentials = _checked(default["credentials"], "credentials")
    params = {
        "endpoint": str(default.get("endpoint", "")),
        "region": str(default.get("region", "")),
        "disableSSL": _bool(default.get("disableSSL", False)),
        "forcePathStyle": _bool(default.get("forcePathStyle", True)),
        "fromEnv": _bool(credentials.get("fromEnv", False)),
    }
    if version.session_max_retries:
        params["maxRetries"] = str(int(default.get("maxRetries", 5)))
    if params["fromEnv"] == "false":
        reference = _checked(credentials.get("secretRef"), "secretRef")
        if not reference:  # s3.go dereferences the nil pointer: the launcher panics
            raise LauncherConfigError("providers: fromEnv false without a secretRef")
        params.update({key: str(reference.get(key, "")) for key in _FIELDS["secretRef"]})
    return {"Provider": "s3", "Params": params}


def _bool(value: object) -> str:
    if not isinstance(value, bool):
        raise LauncherConfigError(f"providers: {value!r} is not a boolean")
    return "true" if value else "false"


def credentials(session: dict, secrets: dict[str, dict[str, str]], namespace: str
                ) -> tuple[str, str] | None:  # fmt: skip
    """object_store.go createS3BucketSession: None for fromEnv (the pod's environment), else the
    Secret's two keys, or the launcher's error."""
    params = session["Params"]
    if params["fromEnv"] == "true":
        return None
    name = params["secretName"]
    where = f"Failed to get Bucket credentials from secret name={name!r} namespace={namespace!r}"
    if name not in secrets:
        raise LauncherConfigError(f'{where}: secrets "{name}" not found')
    access, secret = (secrets[name].get(params[k], "") for k in ("accessKeyKey", "secretKeyKey"))
    if not (access and secret):
        # getS3BucketCredential's message names the access key's key first.
        keys = f"'{params['accessKeyKey']}' or '{params['secretKeyKey']}'"
        raise LauncherConfigError(f"{where}: could not find specified keys {keys}")
    return access, secret
