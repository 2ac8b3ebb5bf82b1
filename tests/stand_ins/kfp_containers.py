"""The harness's pods as containers: each task of the compiled spec in the image it names.

`ContainerRuntime` replaces kfp_launcher.Pod's host process with `podman run` (or docker) of
the image the spec names, as built by `make images`. What a pod of the KFP 2.5 backend gets
(paths under backend/src/v2 at tag 2.5.0), and how it is played here:
- the main container's command is the launcher, `/kfp-launcher/launch ... --` followed by the
  spec's command and args (driver/driver.go initPodSpecPatch); the launcher runs them without
  changing environment or directory (component/launcher_v2.go execute). So: the spec's
  command and args verbatim, replacing the image's ENTRYPOINT as a pod's `command` does, in
  the image's WORKDIR, as the image's USER;
- cpuLimit ("%v") and memoryLimit ("%vG", a decimal quantity; driver.go getPodResource) as
  --cpus and --memory, with --memory-swap equal (the kubelet gives containers no swap); a
  container over its memory limit is killed by the kernel's OOM killer (exit 137; Kubernetes
  reports OOMKilled);
- the emptyDir volumes /s3, /gcs, /minio, /.local, /.cache, /.config
  (compiler/argocompiler/container.go); the launcher runs in the main container as the image's
  user, so what it downloads and the output folders it makes (launcher_v2.go
  prepareOutputFolders, MkdirAll 0755) belong to that user: the harness, which plays the
  launcher on the host, hands them over. Until 2.15 the ExecutorOutput goes to
  /tmp/kfp_outputs, the container's own /tmp in a pod (launcher_v2.go OutputMetadataFilepath);
  here it is a mount, so that the host can read it; since 2.15 it is in the task's folder on
  /s3 (kfp_versions.py);
- 2.16.0+: the container without capabilities and without new privileges
  (argocompiler/security_context.go: drop ALL, allowPrivilegeEscalation false; podman's default
  seccomp profile plays RuntimeDefault);
- the environment: the image's ENV, then kfp_launcher.pod_environment (the spec's env, the
  secretAsEnv keys, KFP's pod variables);
- the network: loopback only, shared with a sidecar that forwards 127.0.0.1:<store port> to
  the host's SeaweedFS through a Unix socket, so a step reaches the object store at the
  endpoint its Secret names and nothing else.
Harness choices, not KFP's: an image that is not on this machine fails the task at once
(ErrImageNeverPull, as imagePullPolicy Never would; a cluster with the default IfNotPresent
tries to pull it and leaves the pod Pending in ImagePullBackOff); the step's own exit code is
reported (KFP's launcher exits 1 for any failure of the step).
Per attempt it records the start-up (`podman run` → the entry point's "<executor> starts" line,
pipelines/kubeflow/kfp_entrypoint.py) and the peak memory from the container's memory cgroup.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.kubeflow import images as pipeline_images
from pipelines.kubeflow.images import Engine
from pipelines.kubeflow.kfp_entrypoint import EXECUTOR_STARTS
from tests.stand_ins.kfp_launcher import EMPTY_DIRS, OOM_KILLED, TaskFailed
from tests.stand_ins.kfp_versions import NEWEST, KfpBackend

_SOCKET_IN_SIDECAR = "/run/tkp-store/store.sock"
# One direction of a forwarded connection; the host side and the sidecar both run this text.
_PIPE = """
async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.close()
"""
_namespace: dict = {}
exec(_PIPE, _namespace)
_pipe = _namespace["pipe"]
# The sidecar's forwarder: the image's own Python, standard library only.
_FORWARDER = (
    """
import asyncio, sys
port, path = int(sys.argv[1]), sys.argv[2]
"""
    + _PIPE
    + """
async def serve(reader, writer):
    try:
        upstream_reader, upstream_writer = await asyncio.open_unix_connection(path)
    except OSError:
        writer.close()
        return
    await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer),
                         return_exceptions=True)
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", port)
    async with server:
        await server.serve_forever()
asyncio.run(main())
"""
)


class StoreTunnel:
    """Host side: a Unix socket that forwards every connection to 127.0.0.1:port (SeaweedFS)."""

    def __init__(self, port: int, folder: Path):
        self.port, self.socket_path = port, folder / "store.sock"
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o755)
        self._loop = asyncio.new_event_loop()
        self._server = None
        started = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(started,), daemon=True)
        self._thread.start()
        if not started.wait(10) or self._server is None:
            raise RuntimeError(f"the store tunnel could not listen on {self.socket_path}")
        self.socket_path.chmod(0o777)  # the sidecar connects as the image's user

    def _serve(self, started: threading.Event) -> None:
        async def forward(reader, writer):
            try:
                upstream = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                writer.close()
                return
            await asyncio.gather(_pipe(reader, upstream[1]), _pipe(upstream[0], writer),
                                 return_exceptions=True)  # fmt: skip

        async def main():
            try:
                self._server = await asyncio.start_unix_server(forward, str(self.socket_path))
            finally:
                started.set()
            await self._server.serve_forever()

        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(main())
        except (asyncio.CancelledError, OSError):
            pass

    def close(self) -> None:
        if self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
        self._thread.join(5)


@dataclass
class ContainerRuntime:
    """The node: a container engine, the images it holds, and the pods' shared network."""

    engine: Engine
    store_port: int
    work_dir: Path
    network: str = ""
    figures: list[dict] = field(default_factory=list)
    # A guard of the entry point's message, not something a KFP pod meets (its emptyDirs are
    # 0777): False leaves the volumes root's (0755), as a volume from elsewhere could be.
    hand_over_volumes: bool = True
    version: KfpBackend = NEWEST  # the backend played (the harness sets it)

    def volumes(self) -> tuple[str, ...]:
        """The emptyDirs, and (2.5.0) /tmp/kfp_outputs, the ExecutorOutput's folder."""
        if self.version.output_file_in_task_root:
            return EMPTY_DIRS
        return (*EMPTY_DIRS, "tmp/kfp_outputs")

    def __enter__(self) -> ContainerRuntime:
        suffix = uuid.uuid4().hex[:8]
        self._tunnel = StoreTunnel(self.store_port, self.work_dir / f"tunnel-{suffix}")
        self.network = f"tkp-pod-network-{suffix}"
        self._sidecar_image: str | None = None
        return self

    def __exit__(self, *exc) -> None:
        self.engine.run("rm", "-f", "--time", "1", self.network, check=False)
        self._tunnel.close()

    def _ensure_network(self, image: str) -> None:
        """The sidecar starts with the first pod, on its image (the only Python at hand)."""
        if self._sidecar_image:
            return
        self.engine.run(
            "run", "-d", "--pull=never", "--name", self.network, "--network", "none",
            "-v", f"{self._tunnel.socket_path.parent}:{Path(_SOCKET_IN_SIDECAR).parent}",
            "--entrypoint", "python", image, "-c", _FORWARDER, str(self.store_port),
            _SOCKET_IN_SIDECAR,
        )  # fmt: skip
        self._sidecar_image = image

    def pod(
        self, root: Path, image: str, environment: dict[str, str], resources: dict, task: str
    ) -> ContainerPod:
        if not self.engine.image_exists(image):
            raise TaskFailed(
                f"ErrImageNeverPull: container image {image!r} is not present on the node; "
                "build it with `make images` (or push it where the cluster pulls from)"
            )
        for name, value in environment.items():
            if "\n" in value or "\0" in value:  # an env file holds one variable per line
                raise TaskFailed(f"environment variable {name}: a value with a line break")
        self._ensure_network(image)
        for volume in self.volumes():
            (root / volume).mkdir(parents=True, exist_ok=True)
        user = self.engine.run("image", "inspect", "--format", "{{.Config.User}}", image).stdout
        return ContainerPod(root, environment, resources, image, user.strip(), self, task)


@dataclass
class ContainerPod:
    """One attempt of a task: the same interface as kfp_launcher.Pod, run in a container."""

    root: Path
    environment: dict[str, str]
    resources: dict
    image: str
    user: str
    runtime: ContainerRuntime
    task: str

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def step_path(self, absolute: str) -> str:
        return absolute  # the container sees the launcher's paths as they are

    def _hand_over_volumes(self) -> None:
        """What the launcher wrote belongs to the container's user (it runs as that user)."""
        if not self.runtime.hand_over_volumes:
            return
        uid, _, gid = self.user.partition(":")
        for volume in self.runtime.volumes():
            for folder, _, files in os.walk(self.root / volume):
                for name in [folder, *(os.path.join(folder, f) for f in files)]:
                    if uid.isdigit():
                        os.chown(name, int(uid), int(gid or uid))
                    else:  # a named user: emptyDir's own mode instead
                        os.chmod(name, 0o777)

    def _arguments(self, name: str, command: list[str], env_file: Path) -> list[str]:
        memory, cpus = self.resources.get("memoryLimit"), self.resources.get("cpuLimit")
        limits = []
        if self.runtime.version.hardened_container:  # 2.16.0+ security_context.go
            limits += ["--cap-drop=ALL", "--security-opt", "no-new-privileges"]
        if memory:
            limits += ["--memory", f"{int(memory * 1e9)}", "--memory-swap", f"{int(memory * 1e9)}"]
        if cpus:
            limits += ["--cpus", str(cpus)]
        mounts = [part for volume in self.runtime.volumes()
                  for part in ("-v", f"{self.root / volume}:/{volume}")]  # fmt: skip
        return [
            *self.runtime.engine.command, "run", "--pull=never", "--name", name,
            "--network", f"container:{self.runtime.network}", "--env-file", str(env_file),
            *limits, *mounts, "--entrypoint", command[0], self.image, *command[1:],
        ]  # fmt: skip

    def run(self, command: list[str], log_path: Path, cwd: Path, kill_when=None) -> int:
        del cwd  # the image's WORKDIR, as in a pod
        self._hand_over_volumes()
        name = f"{self.task}-{uuid.uuid4().hex[:8]}"
        env_file = self.root / "pod.env"
        env_file.write_text("".join(f"{k}={v}\n" for k, v in self.environment.items()))
        memory = self.resources.get("memoryLimit")
        started = time.monotonic()
        first_work: list[float] = []
        peak, oom_kills, cgroup, killed = 0, 0, None, False
        try:
            with open(log_path, "ab") as log:
                # cwd: podman 4.3's conmon writes its `oom` marker into its working directory.
                process = subprocess.Popen(
                    self._arguments(name, command, env_file), cwd=self.root,
                    env=self.runtime.engine.process_environment,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                )  # fmt: skip
                reader = threading.Thread(
                    target=_copy_lines, args=(process.stdout, log, first_work)
                )
                reader.start()
                lookups = 0
                while process.poll() is None:
                    if cgroup is None and lookups < 100:  # 20 s: then the step goes unmeasured
                        cgroup, lookups = _memory_cgroup(self.runtime.engine, name), lookups + 1
                    if cgroup:
                        peak = max(peak, _peak_bytes(cgroup))
                        oom_kills = max(oom_kills, _oom_kills(cgroup))
                    # Killed only once the container exists: `kill` fails before, and retries.
                    if not killed and kill_when is not None and kill_when():
                        killed = self.runtime.engine.run(
                            "kill", "--signal", "KILL", name, check=False
                        ).returncode == 0  # fmt: skip
                    time.sleep(0.2)
                reader.join()
                if killed:
                    log.write(b"\nKilled: SIGKILL (interrupted by the test)\n")
            inspected = self.runtime.engine.run("inspect", "--format", "{{json .State}}", name,
                                                check=False)  # fmt: skip
            state = json.loads(inspected.stdout or "{}")
        finally:
            self.runtime.engine.run("rm", "-f", "--time", "1", name, check=False)
            env_file.unlink(missing_ok=True)
        # podman 4.3 with runc on cgroup v1 does not set State.OOMKilled: its conmon writes the
        # `oom` marker into its working directory instead, and the cgroup counts the OOM kills.
        oom = not killed and bool(
            state.get("OOMKilled") or (self.root / "oom").exists() or oom_kills
        )  # fmt: skip
        self.runtime.figures.append({
            "task": self.task,
            "start_up_s": first_work[0] - started if first_work else None,
            "peak_memory_bytes": peak or None,
            "memory_limit_bytes": memory * 1e9 if memory else None,
            "wall_s": time.monotonic() - started,
            "exit_code": state.get("ExitCode", process.returncode),
            "oom_killed": oom,
        })  # fmt: skip
        if oom:
            with open(log_path, "ab") as log:
                log.write(f"\nOOMKilled: over its limit of {memory:g}G\n".encode())
            return OOM_KILLED
        if process.returncode in (125, 126, 127) and not first_work:
            with open(log_path, "ab") as log:
                log.write(b"\nthe container engine could not start the container (above)\n")
        return process.returncode


def _copy_lines(stream, log, first_work: list[float]) -> None:
    for line in stream:
        log.write(line)
        if not first_work and EXECUTOR_STARTS.encode() in line:
            first_work.append(time.monotonic())
    log.flush()


def _memory_cgroup(engine: Engine, name: str) -> Path | None:
    """The container's memory cgroup folder, from its first process's /proc/PID/cgroup."""
    pid = engine.run("inspect", "--format", "{{.State.Pid}}", name, check=False).stdout.strip()
    try:
        lines = Path(f"/proc/{int(pid)}/cgroup").read_text().splitlines()
    except (ValueError, OSError):
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1
            folder = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
            return folder if folder.exists() else None
        if controllers == "":  # cgroup v2: one hierarchy
            folder = Path("/sys/fs/cgroup") / path.lstrip("/")
            return folder if (folder / "memory.peak").exists() else None
    return None


def _oom_kills(cgroup: Path) -> int:
    """`oom_kill` of memory.oom_control (v1) or memory.events (v2): kills in this cgroup."""
    for name in ("memory.oom_control", "memory.events"):
        try:
            for line in (cgroup / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            continue
    return 0


def _peak_bytes(cgroup: Path) -> int:
    v1 = str(cgroup).startswith("/sys/fs/cgroup/memory/")
    try:
        return int((cgroup / ("memory.max_usage_in_bytes" if v1 else "memory.peak")).read_text())
    except (OSError, ValueError):
        return 0


def missing_for_images() -> str | None:
    """What this machine lacks to build and run the images, or None."""
    try:
        engine = pipeline_images.engine()
    except pipeline_images.ImageBuildFailed as missing:
        return str(missing)
    if engine.run("info", check=False).returncode != 0:
        return f"{engine.name} is installed but cannot run here (`{engine.name} info` fails)"
    if engine.image_exists(pipeline_images.LOCAL_BASE):
        return None
    if os.geteuid() != 0:
        return "building the local base image needs root (debootstrap, chroot)"
    if not shutil.which("debootstrap"):
        return "debootstrap is missing (apt-get install debootstrap)"
    return None
