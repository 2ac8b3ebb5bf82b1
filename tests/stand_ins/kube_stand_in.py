"""The Kubernetes stand-in for the multi-worker Trainer's tests: an API server and kubelet
(kube_api.py) with the controllers a cluster would run for the jobs the step creates, the
Training Operator v1.8.1's TFJob controller (tfjob_operator.py) and Kubeflow Trainer v2.2.0's
TrainJob controller with JobSet and Jobs under it (trainer_v2.py). Each module says what it
plays, from which source, and what it refuses because it cannot play it.

Neither a Kubernetes API server nor the controllers can run here, so this is the one part of
that path that is not the real thing. Everything on both sides of it is: the step talks to it
with the real `kubernetes` client (through a kubeconfig, as `kubectl` would), and every replica
is a real process running the step's container command with the environment the kubelet would
give it. GPUs, node selectors and tolerations are scheduled against the stand-in's nodes
(kube_api.default_nodes) but the replicas train on the CPU.
"""

from __future__ import annotations

from pathlib import Path

from tests.stand_ins.kube_api import ApiError, KubeApi
from tests.stand_ins.kube_pods import Node
from tests.stand_ins.tfjob_operator import TFJobOperator
from tests.stand_ins.trainer_v2 import TrainerV2


class KubeStandIn(KubeApi):
    """`operators`: which controllers (and CRDs) the cluster has ("trainjob", "tfjob"); none is a
    cluster on which neither exists. Broken ones: `webhook_down`, a controller whose pod (and so
    its validating webhook, failurePolicy Fail) does not answer: creating its jobs fails with
    the API server's 500 "failed calling webhook"; `without_pods`, jobs admitted but never given
    pods (a TrainJob whose JobSet cannot be applied, which Trainer reports only as an event,
    trainjob_controller.go; an operator that admits but does not reconcile). `rbac`: the
    (group, resource, verb) the service account may use, every other call refused with RBAC's
    403; None allows everything (and records the calls in `requests`). `pod_security`: the
    namespace's Pod Security level, "restricted" (pod_security.py) unless None."""

    def __init__(
        self,
        work: Path,
        namespace: str,
        secrets: dict[str, dict[str, str]],
        nodes: list[Node] | None = None,
        schedule_seconds: float = 0.5,
        operators: tuple[str, ...] = ("trainjob", "tfjob"),
        webhook_down: tuple[str, ...] = (),
        without_pods: tuple[str, ...] = (),
        rbac: set[tuple[str, str, str]] | None = None,
        pod_security: str | None = "restricted",
    ):
        super().__init__(work, namespace, secrets, nodes, schedule_seconds, rbac, pod_security)
        self.tfjobs = TFJobOperator(self) if "tfjob" in operators else None
        self.trainer = TrainerV2(self) if "trainjob" in operators else None
        controllers = {"tfjob": self.tfjobs, "trainjob": self.trainer}
        for kind in without_pods:
            controllers[kind].make_pods = False
        for kind in webhook_down:
            resource = self.tfjobs.resource if kind == "tfjob" else self.trainer.trainjobs
            resource.admit = _webhook_unreachable(resource.webhook)


def _webhook_unreachable(webhook: str):
    def admit(body: dict) -> list[str]:
        # apiserver pkg/admission/plugin/webhook/errors: a call that fails is an internal error
        raise ApiError(500, "InternalError", f'Internal error occurred: failed calling webhook '
                       f'"{webhook}": failed to call webhook: Post "https://{webhook}:443/'
                       'validate": dial tcp: connect: connection refused')  # fmt: skip

    return admit
