"""Pod Security admission on the Kubernetes stand-in (kube_api.py): a namespace labelled
`pod-security.kubernetes.io/enforce: restricted` refuses a pod that breaks the "restricted"
profile (Kubeflow profile namespaces may enforce it; the stand-in's namespace does by default, so
the product's replica pods must pass it). Rules and texts from kubernetes/pod-security-admission
v0.29.9 (Kubernetes 1.29): policy/check_*.go for each check's reason and detail,
policy/checks.go AggregateCheckResult.ForbiddenDetail for how they join ("reason (detail), ..."),
admission/admission.go for `violates PodSecurity "restricted:latest": ...`, and apimachinery's
NewForbidden for the `pods "<name>" is forbidden: ` in front.

Played, in the policy's order (registry.go: baseline checks first, then restricted ones, each
sorted by ID; a restricted check replaces the baseline one it overrides): host namespaces, host
ports, privileged; allowPrivilegeEscalation, capabilities (drop ALL, add at most
NET_BIND_SERVICE), restricted volume types (hostPath among them), runAsNonRoot, runAsUser=0,
seccompProfile. Not played, so refused: AppArmor (annotations or appArmorProfile),
seLinuxOptions, procMount, sysctls, windowsOptions, `spec.os` (Windows pods are exempt from
some checks), hostUsers (user-namespace relaxations), ephemeral containers.
"""

from __future__ import annotations

RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}  # fmt: skip
_APPARMOR = "container.apparmor.security.beta.kubernetes.io/"
_UNPLAYED_SECURITY = ("appArmorProfile", "seLinuxOptions", "procMount", "sysctls",
                      "windowsOptions")  # fmt: skip


def _quote(names: list[str]) -> str:
    return '"' + '", "'.join(names) + '"'  # helpers.go joinQuote


def _named(noun: str, names: list[str]) -> str:
    """`container "a"`, `containers "a", "b"` (pluralize and joinQuote)."""
    return f"{noun}{'' if len(names) == 1 else 's'} {_quote(names)}"


def refusal(name: str, metadata: dict, spec: dict) -> str | None:
    """The API server's 403 message for a pod in a namespace enforcing "restricted", or None
    when the pod is admitted."""
    apparmor = [k for k in metadata.get("annotations") or {} if k.startswith(_APPARMOR)]
    if apparmor or "os" in spec:
        raise ValueError(f"the stand-in cannot play Pod Security for {apparmor or spec['os']}")
    pod_security = spec.get("securityContext") or {}
    containers = [*spec.get("initContainers", []), *spec.get("containers", [])]
    unplayed = [k for k in _UNPLAYED_SECURITY if k in pod_security]
    unplayed += [f"{c['name']}: {k}" for c in containers for k in _UNPLAYED_SECURITY
                 if k in (c.get("securityContext") or {})]  # fmt: skip
    if unplayed or "hostUsers" in spec or spec.get("ephemeralContainers"):
        raise ValueError(f"the stand-in cannot play Pod Security for {unplayed or spec}")
    found = _baseline(spec, containers, security) + _restricted(spec, containers, security)
    if not found:
        return None
    detail = ", ".join(f"{reason} ({text})" if text else reason for reason, text in found)
    return f'pods "{name}" is forbidden: violates PodSecurity "restricted:latest": {detail}'


def security(container: dict) -> dict:
    return container.get("securityContext") or {}


def _baseline(spec: dict, containers: list[dict], security) -> list[tuple[str, str]]:
    """The baseline checks the restricted profile keeps, by check ID (registry.go orders
    baseline's first, each level's sorted)."""
    found = []
    host = [f"{k}=true" for k in ("hostNetwork", "hostPID", "hostIPC") if spec.get(k)]
    if host:
        found.append(("host namespaces", ", ".join(host)))
    users, ports = [], set()
    for c in containers:
        used = {str(p["hostPort"]) for p in c.get("ports", []) if p.get("hostPort")}
        if used:
            users.append(c["name"])
            ports |= used
    if users:
        found.append(("hostPort", f"{_named('container', users)} "
                      f"{'uses' if len(users) == 1 else 'use'} "
                      f"{'hostPort' if len(ports) == 1 else 'hostPorts'} "
                      f"{', '.join(sorted(ports))}"))  # fmt: skip
    privileged = [c["name"] for c in containers if security(c).get("privileged")]
    if privileged:
        found.append(("privileged", f"{_named('container', privileged)} must not set "
                      "securityContext.privileged=true"))  # fmt: skip
    return found


def _restricted(spec: dict, containers: list[dict], security) -> list[tuple[str, str]]:
    found = []
    escalating = [c["name"] for c in containers
                  if security(c).get("allowPrivilegeEscalation") is not False]  # fmt: skip
    if escalating:
        found.append(("allowPrivilegeEscalation != false", f"{_named('container', escalating)} "
                      "must set securityContext.allowPrivilegeEscalation=false"))  # fmt: skip
    no_drop, adding, added = [], [], set()
    for c in containers:
        capabilities = security(c).get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            no_drop.append(c["name"])
        extra = [a for a in capabilities.get("add") or [] if a != "NET_BIND_SERVICE"]
        if extra:
            adding.append(c["name"])
            added.update(extra)
    details = []
    if no_drop:
        details.append(f"{_named('container', no_drop)} must set "
                       'securityContext.capabilities.drop=["ALL"]')  # fmt: skip
    if adding:
        details.append(f"{_named('container', adding)} must not include {_quote(sorted(added))} "
                       "in securityContext.capabilities.add")  # fmt: skip
    if details:
        found.append(("unrestricted capabilities", "; ".join(details)))
    bad, types = [], set()
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds & RESTRICTED_VOLUMES:
            bad.append(volume["name"])
            types |= kinds or {"unknown"}
    if bad:
        found.append(
            (
                "restricted volume types",
                f"{_named('volume', bad)} "
                f"{'uses' if len(bad) == 1 else 'use'} restricted volume "
                f"{'type' if len(types) == 1 else 'types'} {_quote(sorted(types))}",
            )
        )
    return found + _pod_or_containers(spec.get("securityContext") or {}, containers, security)


def _pod_or_containers(pod: dict, containers: list[dict], security) -> list[tuple[str, str]]:
    """The checks a pod-level setting satisfies for every container that does not set its own
    (check_runAsNonRoot.go, check_runAsUser.go, check_seccompProfile_restricted.go)."""
    found = []

    def setters(pod_bad: bool, container_bad) -> list[str]:
        named = [c["name"] for c in containers if container_bad(security(c))]
        return (["pod"] if pod_bad else []) + ([_named("container", named)] if named else [])

    bad = setters(pod.get("runAsNonRoot") is False, lambda c: c.get("runAsNonRoot") is False)
    implicit = [c["name"] for c in containers if "runAsNonRoot" not in security(c)]
    if bad:
        found.append(
            (
                "runAsNonRoot != true",
                f"{' and '.join(bad)} must not set securityContext.runAsNonRoot=false",
            )
        )
    elif implicit and pod.get("runAsNonRoot") is not True:
        found.append(("runAsNonRoot != true", f"pod or {_named('container', implicit)} must set "
                      "securityContext.runAsNonRoot=true"))  # fmt: skip
    root = setters(pod.get("runAsUser") == 0, lambda c: c.get("runAsUser") == 0)
    if root:
        found.append(("runAsUser=0", f"{' and '.join(root)} must not set runAsUser=0"))
    valid = ("RuntimeDefault", "Localhost")
    pod_type = (pod.get("seccompProfile") or {}).get("type")
    types = {(security(c).get("seccompProfile") or {}).get("type") for c in containers}
    bad = setters(
        pod_type not in (None, *valid),
        lambda c: (c.get("seccompProfile") or {}).get("type") not in (None, *valid),
    )
    implicit = [c["name"] for c in containers if "seccompProfile" not in security(c)]
    if bad:
        values = sorted(t for t in {pod_type, *types} if t not in (None, *valid))
        found.append(("seccompProfile", f"{' and '.join(bad)} must not set "
                      f"securityContext.seccompProfile.type to {_quote(values)}"))  # fmt: skip
    elif implicit and pod_type not in valid:
        found.append(
            (
                "seccompProfile",
                f"pod or {_named('container', implicit)} must set "
                'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"',
            )
        )
    return found
