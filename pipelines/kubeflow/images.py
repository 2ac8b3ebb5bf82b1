"""`tkp images` / `make images`: build the step images with podman, or docker where it runs.

The images are the config's `cpu_image` (kubeflow/Dockerfile) and, with `gpu=True`,
`gpu_image` (kubeflow/Dockerfile.gpu), built from the repository root. Their tags come from the
config, whose defaults carry the project version (tests/pipelines/kubeflow/test_containers.py keeps
them equal);
PIPELINE_CPU_IMAGE / PIPELINE_GPU_IMAGE name others, as CI does with a tag per commit
(.github/workflows/train-on-merge.yml); `push=True` then pushes them with the engine's login.

The base is the Dockerfile's own pinned public image unless `base` names another. `base="local"`
uses (and first builds, when it is missing) LOCAL_BASE: a Debian bookworm minbase root file
system from debootstrap plus this interpreter's CPython 3.10 copied to /usr/local, the paths
of the official python:3.10-slim image. It is for machines that reach PyPI and Debian's
mirror but no image registry; building it needs root (debootstrap, chroot). It trusts the CA
certificates this machine trusts (a TLS-inspecting proxy's, where there is one).

Caching: the engine's own layer cache, in its storage (for podman as root,
/var/lib/containers), which outlives a clone. The lock is copied and installed before the code,
so a code-only change rebuilds the last layers only; the local base is built once per machine.

podman on a machine whose cgroups are v1 or hybrid (no /sys/fs/cgroup/cgroup.controllers)
cannot use its default runtime crun there: where CONTAINERS_CONF is unset and runc is
installed, a private containers.conf selects runc, sets explicit ulimits for builds and
containers (without them runc fails with "error setting rlimit") and logs events to a file
(no journald in containers and CI machines).
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from components.base.config import REPO_ROOT, WORK_DIR, PipelineConfig
from components.base.errors import ActionableError

LOCAL_BASE = "localhost/tkp-python:{}.{}.{}-bookworm".format(*sys.version_info[:3])
DOCKERFILES = {
    "cpu": REPO_ROOT / "kubeflow" / "Dockerfile",
    "gpu": REPO_ROOT / "kubeflow" / "Dockerfile.gpu",
}
# What CPython 3.10 and its standard library load at run time, beyond minbase; as in the
# official slim image (which also carries ca-certificates, netbase and tzdata).
_BASE_PACKAGES = (
    "ca-certificates,netbase,tzdata,libssl3,libsqlite3-0,libreadline8,libncursesw6,libffi8,"
    "libbz2-1.0,liblzma5,zlib1g,libexpat1,libuuid1,libgdbm6,libdb5.3"
)
_DEBIAN_MIRROR = "http://deb.debian.org/debian"


class ImageBuildFailed(ActionableError, RuntimeError):
    """The container engine is missing or a build failed."""


@dataclass
class Engine:
    """A container engine's command line and the environment it runs with."""

    command: list[str]
    environment: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return Path(self.command[0]).name

    @property
    def process_environment(self) -> dict[str, str]:
        """This process's environment with the engine's settings on top."""
        return {**os.environ, **self.environment}

    def run(self, *arguments: str, check: bool = True, **options) -> subprocess.CompletedProcess:
        result = subprocess.run(
            [*self.command, *arguments], env=self.process_environment,
            capture_output=True, text=True, **options,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise ImageBuildFailed(
                f"{self.name} {' '.join(arguments[:2])} failed (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()[-2000:]}"
            )
        return result

    def image_exists(self, reference: str) -> bool:
        return self.run("image", "inspect", reference, check=False).returncode == 0

    def image_size(self, reference: str) -> int:
        return int(self.run("image", "inspect", "--format", "{{.Size}}", reference).stdout)


def engine(preferred: str | None = None) -> Engine:
    """podman, else docker (or CONTAINER_ENGINE); podman gets this machine's settings."""
    preferred = preferred or os.environ.get("CONTAINER_ENGINE")
    for name in [preferred] if preferred else ["podman", "docker"]:
        path = shutil.which(name)
        if path and name == "docker" and not _docker_runs(path):
            if preferred or not shutil.which("podman"):
                raise ImageBuildFailed("docker is installed but its daemon does not answer "
                                       "(`docker info`): start it, or install podman")  # fmt: skip
            continue
        if path:
            return Engine([path], _podman_environment() if name == "podman" else {})
    raise ImageBuildFailed(
        f"no container engine found ({preferred or 'podman or docker'}): install podman "
        "(Debian: apt-get install podman runc) or docker, or set CONTAINER_ENGINE"
    )


def _docker_runs(path: str) -> bool:
    return subprocess.run([path, "info"], capture_output=True).returncode == 0


def _podman_environment() -> dict[str, str]:
    unified = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    if os.environ.get("CONTAINERS_CONF") or unified or not shutil.which("runc"):
        return {}
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    conf = WORK_DIR / "podman" / "containers.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc=4096:4096"]\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'events_logger = "file"\n'
    )
    return {"CONTAINERS_CONF": str(conf)}


def build_images(
    config: PipelineConfig, base: str | None = None, gpu: bool = False, say: Callable = print,
    container_engine: Engine | None = None,
) -> dict[str, int]:  # fmt: skip
    """Builds the CPU image (and the GPU image); returns image reference -> size in bytes."""
    if gpu and base:
        raise ImageBuildFailed("--gpu builds on NVIDIA's CUDA base: leave out --base")
    container_engine = container_engine or engine()
    build_args = ["--build-arg", f"BASE_IMAGE={base}"] if base else []
    if base == "local":  # built here, never pulled (docker does not pull an image it has)
        base = ensure_local_base(container_engine, say=say)
        build_args = ["--build-arg", f"BASE_IMAGE={base}"]
        build_args += ["--pull=never"] if container_engine.name == "podman" else []
    sizes = {}
    for kind, reference in _wanted(config, gpu).items():
        say(f"Building {reference} from {DOCKERFILES[kind].relative_to(REPO_ROOT)} with "
            f"{container_engine.name} (base: {base or 'the Dockerfile default'}) ...")  # fmt: skip
        started = time.monotonic()
        _stream(container_engine, ["build", "--network=host", *build_args,
                                   "-f", str(DOCKERFILES[kind]), "-t", reference, str(REPO_ROOT)],
                say)  # fmt: skip
        sizes[reference] = container_engine.image_size(reference)
        say(f"Built {reference} in {time.monotonic() - started:.0f} s: "
            f"{sizes[reference] / 1e9:.2f} GB")  # fmt: skip
    return sizes


def push_images(
    config: PipelineConfig, gpu: bool = False, say: Callable = print,
    container_engine: Engine | None = None,
) -> list[str]:  # fmt: skip
    """Pushes the CPU image (and the GPU image) under the config's tags; returns the references.
    The registry's credentials are the engine's own (`docker login`, `podman login`)."""
    container_engine = container_engine or engine()
    wanted = list(_wanted(config, gpu).values())
    for reference in wanted:
        if not container_engine.image_exists(reference):
            raise ImageBuildFailed(f"{reference} is not built here: run `make images` first")
        say(f"Pushing {reference} with {container_engine.name} ...")
        started = time.monotonic()
        _stream(container_engine, ["push", reference], say, _PUSH_PROGRESS,
                advice=f"check that `{container_engine.name} login` reaches the registry of "
                f"{reference} and may push there")  # fmt: skip
        say(f"Pushed {reference} in {time.monotonic() - started:.0f} s")
    return wanted


def _wanted(config: PipelineConfig, gpu: bool) -> dict[str, str]:
    """Image kind (a DOCKERFILES key) -> the config's reference for it."""
    return {"cpu": config.cpu_image, **({"gpu": config.gpu_image} if gpu else {})}


_BUILD_PROGRESS = r"(STEP \d+/\d+|Step \d+/\d+ ?):?\s*(.{0,90})"
# podman: "Copying blob sha256:abc..."; docker: "abc123def456: Pushed"
_PUSH_PROGRESS = r"(Copying (?:blob|config)|\w{12}: Pushed)\s*(sha256:\w{12})?"


def _stream(
    container_engine: Engine, arguments: list[str], say: Callable,
    progress: str = _BUILD_PROGRESS, advice: str = "",
) -> None:  # fmt: skip
    """Runs a build or a push: every line to this command's log (stdout), each step (a line
    matching `progress`) to the console."""
    started = time.monotonic()
    process = subprocess.Popen(
        [*container_engine.command, *arguments], env=container_engine.process_environment,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    tail: list[str] = []
    current = {"step": "starting", "since": started}
    done = threading.Event()

    def heartbeat() -> None:  # a step such as the lock's install runs for minutes in silence
        while not done.wait(30):
            say(f"  [{time.monotonic() - started:5.0f} s] still at {current['step']} "
                f"({time.monotonic() - current['since']:.0f} s)")  # fmt: skip

    threading.Thread(target=heartbeat, daemon=True).start()
    for line in process.stdout:
        sys.stdout.write(line)
        tail = (tail + [line.rstrip()])[-30:]
        step = re.search(progress, line)
        if step:
            current.update(step=step.group(1), since=time.monotonic())
            say(f"  [{time.monotonic() - started:5.0f} s] {step.group(1)} {step.group(2) or ''}")
    done.set()
    if process.wait() != 0:
        raise ImageBuildFailed(
            f"{container_engine.name} {arguments[0]} failed (exit {process.returncode})"
            + (f": {advice}" if advice else "")
            + ":\n"
            + "\n".join(tail)
        )


def ensure_local_base(
    container_engine: Engine, reference: str = LOCAL_BASE, rebuild: bool = False,
    say: Callable = print,
) -> str:  # fmt: skip
    """LOCAL_BASE, built once per machine: Debian minbase + this CPython 3.10 in /usr/local."""
    if not rebuild and container_engine.image_exists(reference):
        say(f"Base image {reference}: present")
        return reference
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        raise ImageBuildFailed(
            f"building the local base image {reference} needs root and debootstrap "
            "(apt-get install debootstrap); or build on the public base (no --base)"
        )
    python_home = Path(sys.base_prefix)
    if sys.version_info[:2] != (3, 10) or not (python_home / "bin" / "python3.10").exists():
        raise ImageBuildFailed(f"the local base needs CPython 3.10; this is {sys.executable}")
    if python_home == Path("/usr"):
        raise ImageBuildFailed(
            "the local base copies a self-contained CPython 3.10 (pyenv, or one built with "
            "--prefix); this one is the system's /usr: install one with `pyenv install 3.10.13`"
        )
    started = time.monotonic()
    say(f"Building base image {reference}: Debian bookworm minbase + {python_home} ...")
    with tempfile.TemporaryDirectory(prefix="tkp-base-", dir=WORK_DIR) as scratch:
        root = Path(scratch) / "rootfs"
        mirror = _debian_mirror()
        _step(["debootstrap", "--variant=minbase", f"--include={_BASE_PACKAGES}", "bookworm",
               str(root), mirror],
              f"check that this machine reaches the Debian mirror {mirror}")  # fmt: skip
        say(f"  [{time.monotonic() - started:5.0f} s] Debian root file system ready")
        _install_python(python_home, root)
        _trust_what_this_machine_trusts(root)
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(root / cache, ignore_errors=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        changes = ["ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin",
                   "ENV LANG=C.UTF-8", 'CMD ["python3"]']  # fmt: skip
        container_engine.run(
            "import", *[part for change in changes for part in ("--change", change)], "-",
            reference, stdin=tar.stdout,
        )  # fmt: skip
        if tar.wait() != 0:
            container_engine.run("rmi", reference, check=False)
            raise ImageBuildFailed(f"tar of the base's root file system exited {tar.returncode}")
    say(f"  [{time.monotonic() - started:5.0f} s] base image {reference}: "
        f"{container_engine.image_size(reference) / 1e6:.0f} MB")  # fmt: skip
    return reference


def _step(command: list[str], advice: str) -> None:
    result = subprocess.run(command, stdout=sys.stdout, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        raise ImageBuildFailed(f"{' '.join(command[:2])} ... exited {result.returncode}: {advice}")


def _install_python(python_home: Path, root: Path) -> None:
    """CPython at /usr/local as the official image has it. Its binary names libpython by its
    build prefix (RUNPATH); ldconfig's cache finds it in /usr/local/lib instead."""
    target = root / "usr" / "local"
    # As the official image leaves out: test suites and the static library; and the host's own
    # site-packages (its .pth files would run in the image). The bytecode stays: the images set
    # PYTHONDONTWRITEBYTECODE, so without it every start would compile the standard library.
    skip = shutil.ignore_patterns("test", "tests", "idle_test", "*.a", "pkgconfig", "site-packages")
    for part in ("bin", "lib", "include"):
        if (python_home / part).exists():
            shutil.copytree(python_home / part, target / part, symlinks=True,
                            dirs_exist_ok=True, ignore=skip)  # fmt: skip
    (target / "lib" / "python3.10" / "site-packages").mkdir(exist_ok=True)
    for name in ("python3", "python"):
        link = target / "bin" / name
        if not link.exists():
            link.symlink_to("python3.10")
    # sysconfig keeps the build prefix (headers for a C extension built in the image, as the
    # lock's source-only pyfarmhash is): that prefix leads to /usr/local too.
    if python_home != Path("/usr/local"):
        build_prefix = root / str(python_home).lstrip("/")
        build_prefix.parent.mkdir(parents=True, exist_ok=True)
        build_prefix.symlink_to("/usr/local")
    _step(["chroot", str(root), "ldconfig"], "ldconfig in the base's root file system failed")
    modules = "ssl, sqlite3, ctypes, lzma, bz2, zlib, _uuid, readline, curses, venv, ensurepip"
    _step(["chroot", str(root), "/usr/local/bin/python3.10", "-c", f"import {modules}"],
          f"{python_home} does not run on Debian bookworm (a library missing, or built "
          "against a newer glibc): use a CPython 3.10 built on bookworm or older")  # fmt: skip


def _trust_what_this_machine_trusts(root: Path) -> None:
    """The host's CA bundle as the base's, and pip and uv told to use it (both carry their own
    roots by default). A machine that reaches PyPI through a TLS-inspecting proxy only trusts
    it through its own bundle; the build then installs from PyPI as the host does, and the
    Dockerfile stays as it is. Certificates only: public, nothing secret."""
    bundle = Path("/etc/ssl/certs/ca-certificates.crt")
    if not bundle.exists():
        return
    shutil.copyfile(bundle, root / "etc/ssl/certs/ca-certificates.crt")
    (root / "etc/pip.conf").write_text(f"[global]\ncert = {bundle}\n")
    (root / "etc/uv").mkdir(exist_ok=True)
    (root / "etc/uv/uv.toml").write_text("native-tls = true\n")


def _debian_mirror() -> str:
    """The mirror this machine's apt uses, so that debootstrap reaches what apt reaches."""
    for sources in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        found = re.search(r"^URIs:\s*(\S+/debian)\s*$", sources.read_text(), re.MULTILINE)
        if found:
            return found.group(1)
    return _DEBIAN_MIRROR


def dockerfile_env(dockerfile: Path) -> dict[str, str]:
    """The ENV a container of this image starts with, read from its Dockerfile's `ENV K=V` lines
    (the base image's own ENV, such as LANG or the CUDA image's LD_LIBRARY_PATH, is not known
    here; PATH starts from the OCI default)."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    environment = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    for line in text.splitlines():
        if not line.strip().upper().startswith("ENV "):
            continue
        for pair in shlex.split(line.strip()[4:]):
            name, _, value = pair.partition("=")
            environment[name] = re.sub(
                r"\$\{?(\w+)\}?", lambda m: environment.get(m.group(1), ""), value
            )
    return environment
