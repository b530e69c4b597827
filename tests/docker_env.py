"""A Docker daemon of the tests' own, and the images the real-container tests grade in.

No image registry is reachable from the machines the tests run on, so every image starts from a Debian 12
root file system made here by debootstrap. Everything lives under `CACHE` (/var/tmp/mha-exercise-docker): the
daemon's data root, so images built once serve later runs on the same machine; its socket and exec root; the
wheelhouse. What is missing is installed here, as root, with apt-get (Debian's `docker.io` and
`debootstrap`), as on a fresh CI machine.

- `Daemon.start()`: `dockerd` on its own socket and data root, started by the tests and stopped after them
  (`stop`); one at a time on a machine (a lock file). `Daemon.unavailable` says why it could not start. It
  keeps out of the way of a Docker installed on the machine (Debian's docker.io starts one where systemd
  runs): its own containerd namespace, and no bridge or iptables rules of its own, so its containers have
  no network unless they ask for the host's (`HOST_NETWORK`: the builds, which run apt-get).
- `base_image`: Debian 12 (debootstrap's minbase, with python3), imported once per recipe.
- `python_image`: the base with the venv module: what `python:3.11-slim-bookworm` (the Kubernetes
  Dockerfile's default `BASE`) gives, a Debian 12 with Python 3.11.
- `gradescope_image`: the zip of `make gradescope` unpacked into /autograder/source of the base image, and
  its `setup.sh` run there unmodified, in a container with Docker's defaults, as Gradescope builds an
  autograder; committed, once per zip.
- `kubernetes_image`: deploy/kubernetes/Dockerfile built from the files a clone has, as written, with the
  CPU build of torch.

pip in a container may reach no index at all (a machine may reach PyPI only through a proxy of its own, and
PyTorch's index not at all): every wheel the containers install is fetched once by the host's pip, wherever
its configuration points, into a wheelhouse here (`wheelhouse`), and pip in the containers installs from it
alone. setup.sh and the Dockerfile run as written; only pip's settings say where the wheels are.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import apt_packages  # noqa: E402  (tools/ is not a package)

CACHE = Path("/var/tmp/mha-exercise-docker")
SUITE, MIRROR = "bookworm", "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3",)  # Gradescope's base images have python3; setup.sh installs the rest
TORCH_CPU = "torch==2.13.0+cpu"  # what setup.sh installs by default, and the Kubernetes image is built with here
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PACKAGES = {"dockerd": "docker.io", "debootstrap": "debootstrap"}
HOST_NETWORK = ("--network", "host")  # the daemon makes no network of its own: what needs one uses the host's
GRADESCOPE_MEMORY, GRADESCOPE_CPUS = "768m", "0.5"  # Gradescope's default container


def run(command: list[str], timeout: float = 1800, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)


def ensure_packages() -> str:
    """Debian's docker.io and debootstrap, installed when missing; "" when they are there, else why not."""
    missing = [package for program, package in PACKAGES.items() if not _program(program)]
    if not missing:
        return ""
    why = apt_packages.install(missing)
    return f"{', '.join(missing)} not installed, and could not be installed: {why}" if why else ""


def _program(name: str) -> str | None:
    for folder in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):  # Debian's own, before anything on PATH
        if os.access(f"{folder}/{name}", os.X_OK):
            return f"{folder}/{name}"
    return shutil.which(name)


@dataclass
class Daemon:
    """dockerd with its data root, exec root and socket under CACHE."""

    root: Path = CACHE
    process: subprocess.Popen[bytes] | None = None
    unavailable: str = ""
    _lock: object = None
    log: Path = field(init=False)

    def __post_init__(self):
        self.log = self.root / "dockerd.log"

    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    def docker(self, *args: str, timeout: float = 1800, **kwargs) -> subprocess.CompletedProcess[str]:
        """The docker client of docker.io, talking to this daemon."""
        return run([_program("docker") or "docker", "-H", f"unix://{self.socket}", *args], timeout=timeout, **kwargs)

    def start(self) -> Daemon:
        if os.geteuid() != 0:
            self.unavailable = "the container tests start a Docker daemon, which needs root"
            return self
        self.unavailable = ensure_packages()
        if self.unavailable:
            return self
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.root / "lock", "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)  # one daemon on this data root at a time
        self._stop_leftover()
        exec_root = self.root / "exec"
        command = [
            _program("dockerd") or "dockerd",
            f"--data-root={self.root / 'data'}",
            f"--exec-root={exec_root}",
            f"--pidfile={self.root / 'dockerd.pid'}",
            f"--host=unix://{self.socket}",
            "--containerd-namespace=mha-tests",  # beside a system Docker sharing its containerd: apart
            "--containerd-plugins-namespace=mha-tests-plugins",
            "--bridge=none",  # no docker0 and no iptables rules: the host's network is left as it was
            "--iptables=false",
        ]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if self.socket.exists() and self.docker("version", timeout=30).returncode == 0:
                return self
            time.sleep(1)
        self.stop()
        tail = self.log.read_text(errors="replace").strip().splitlines()[-5:]
        self.unavailable = "the Docker daemon did not start: " + " | ".join(tail)
        return self

    def _stop_leftover(self):
        """A daemon of ours left running by a run that was killed: it holds the pid file and the data root."""
        try:
            pid = int((self.root / "dockerd.pid").read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return
        if b"dockerd" in cmdline and str(self.root).encode() in cmdline:
            os.kill(pid, signal.SIGTERM)
            for _ in range(60):
                if not Path(f"/proc/{pid}").exists():
                    return
                time.sleep(1)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # dockerd stops its containers and its containerd
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def has_image(self, tag: str) -> bool:
        return self.docker("image", "inspect", tag, timeout=600).returncode == 0

    def image_id(self, tag: str) -> str:
        return self.docker("image", "inspect", "--format", "{{.Id}}", tag, timeout=600).stdout.strip()


class BuildError(RuntimeError):
    pass


def checked(done: subprocess.CompletedProcess[str], what: str) -> subprocess.CompletedProcess[str]:
    if done.returncode != 0:
        raise BuildError(f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def digest(*parts: bytes | str) -> str:
    found = hashlib.sha256()
    for part in parts:
        found.update(hashlib.sha256(part.encode() if isinstance(part, str) else part).digest())
    return found.hexdigest()[:16]


def base_image(daemon: Daemon) -> str:
    """Debian 12 from debootstrap (minbase, python3), imported as an image: built once per recipe."""
    tag = f"mha-tests/debian12:{digest(SUITE, MIRROR, *BASE_PACKAGES)}"
    if daemon.has_image(tag):
        return tag
    with tempfile.TemporaryDirectory(dir=CACHE) as folder:
        rootfs = Path(folder) / "rootfs"
        checked(
            run(
                ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), MIRROR]
            ),
            "debootstrap",
        )
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = daemon.docker("import", "-", tag, stdin=tar.stdout)
        tar.wait()
        checked(imported, "docker import")
    return tag


def python_image(daemon: Daemon) -> str:
    """The base image with Debian's venv module: Python 3.11 on Debian 12, as python:3.11-slim-bookworm."""
    base = base_image(daemon)
    tag = f"mha-tests/python:3.11-bookworm-{base.rsplit(':', 1)[1]}"
    if not daemon.has_image(tag):
        with tempfile.TemporaryDirectory(dir=CACHE) as context:
            Path(context, "Dockerfile").write_text(
                f"FROM {base}\nRUN apt-get update && apt-get install -y --no-install-recommends python3-venv "
                "&& rm -rf /var/lib/apt/lists/*\n"
            )
            checked(daemon.docker("build", *HOST_NETWORK, "-q", "-t", tag, context), "the Python image")
    return tag


@functools.cache
def wheelhouse() -> Path:
    """A folder with every wheel the containers install (torch's CPU build, the grader's dependencies at the
    lock's pins, and setuptools, which builds the project): fetched by the host's pip, wherever its
    configuration points, for Debian 12's own Python (the images'), so that pip in a container needs no
    index (some machines reach PyPI only through a proxy of their own). Kept between runs."""
    from autograder.rubric import tomllib

    folder = CACHE / "wheelhouse"
    folder.mkdir(parents=True, exist_ok=True)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [TORCH_CPU, "setuptools>=68", *project["dependencies"], *project["optional-dependencies"]["test"]]
    stamp = folder / ".wanted"
    said = digest(*wanted, (ROOT / "requirements.lock").read_bytes())
    if stamp.exists() and stamp.read_text() == said:
        return folder
    command = [str(downloader()), "-m", "pip", "download", "--dest", str(folder), "--only-binary=:all:"]
    command += ["--constraint", str(ROOT / "requirements.lock"), *wanted]
    if reachable(TORCH_CPU_INDEX):  # else the host's pip configuration must know where torch's CPU build is
        command += ["--extra-index-url", TORCH_CPU_INDEX]
    checked(run(command), "downloading the wheels")
    stamp.write_text(said)
    return folder


def downloader() -> Path:
    """A virtualenv of the host's Debian Python, the very Python of the images (the lock's markers and the
    wheels' tags are those of its version), whose pip reads the host's configuration."""
    from environments import SYSTEM_PYTHON, ensure_venv_module

    python = CACHE / "pip-venv" / "bin" / "python"
    if not python.exists():
        ensure_venv_module()
        checked(run([SYSTEM_PYTHON, "-m", "venv", str(python.parent.parent)]), "a virtualenv for pip")
    return python


def reachable(url: str) -> bool:
    """Whether a connection to `url`'s host can be made (pip retries an index it cannot reach for minutes)."""
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=10).close()
    except OSError:
        return False
    return True


PIP_SETTINGS = {"PIP_FIND_LINKS": "/wheelhouse", "PIP_NO_INDEX": "1"}  # pip in the containers: the wheelhouse only


def gradescope_image(daemon: Daemon, archive: Path) -> str:
    """Gradescope's autograder image: the zip unpacked into /autograder/source, run_autograder copied to
    /autograder, and setup.sh run, unmodified, as root in a container with Docker's defaults. Built once per
    zip."""
    base = base_image(daemon)
    tag = f"mha-tests/gradescope:{digest(archive.read_bytes(), daemon.image_id(base))}"
    if daemon.has_image(tag):
        return tag
    with tempfile.TemporaryDirectory(dir=CACHE) as folder:
        source = Path(folder) / "autograder" / "source"
        with zipfile.ZipFile(archive) as opened:
            for info in opened.infolist():
                target = source / info.filename
                opened.extract(info, source)
                target.chmod((info.external_attr >> 16) & 0o777 or 0o644)  # as unzip keeps them
        name = f"mha-tests-gradescope-setup-{os.getpid()}"
        create = ["create", "--name", name, "--workdir", "/autograder/source", *HOST_NETWORK]  # setup.sh: apt-get
        create += ["-v", f"{wheelhouse()}:/wheelhouse:ro", "-v", f"{CACHE / 'pip-cache'}:/root/.cache/pip"]
        for key, value in PIP_SETTINGS.items():
            create += ["-e", f"{key}={value}"]
        create += [base, "bash", "-c", "cp /autograder/source/run_autograder /autograder/ && bash ./setup.sh"]
        daemon.docker("rm", "-f", name)
        checked(daemon.docker(*create), "docker create")
        try:
            checked(daemon.docker("cp", f"{source.parent}", f"{name}:/"), "docker cp")
            setup = daemon.docker("start", "-a", name)
            (CACHE / "gradescope-setup.log").write_text(setup.stdout + setup.stderr)
            checked(setup, "setup.sh")
            checked(daemon.docker("commit", name, tag), "docker commit")
        finally:
            daemon.docker("rm", "-f", name)  # a large container's removal is slow on a busy machine
    return tag


class WheelServer:
    """The wheelhouse over HTTP on the loopback, for `docker build --network host` (a build mounts nothing).
    On the same port every time where it is free: the build's cache keys include the URL."""

    PORT = 38427

    def __init__(self, folder: Path):
        handler = functools.partial(_QuietHandler, directory=str(folder))
        try:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.PORT), handler)
        except OSError:
            self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002  (the base class's name)
        pass


def clone_files(target: Path) -> Path:
    """The files a clone of this working tree has (tracked, and new ones git does not ignore): the context
    an instructor builds the Kubernetes image from."""
    listed = checked(
        run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT), "git ls-files"
    )
    if target.exists():
        shutil.rmtree(target)
    for name in filter(None, listed.stdout.split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def kubernetes_image(daemon: Daemon) -> str:
    """deploy/kubernetes/Dockerfile built from a clone's files, on the stand-in for its Python base image,
    with the CPU build of torch."""
    base = python_image(daemon)
    tag = "mha-tests/kubernetes:latest"
    context = clone_files(CACHE / "kubernetes-context")
    server = WheelServer(wheelhouse())
    try:
        build = daemon.docker(
            "build",
            *HOST_NETWORK,
            "-f",
            "deploy/kubernetes/Dockerfile",
            "--build-arg",
            f"BASE={base}",
            "--build-arg",
            f"TORCH_SPEC={TORCH_CPU}",
            "--build-arg",
            "PIP_EXTRA_INDEX_URL=",
            "--build-arg",
            f"PIP_FIND_LINKS={server.url}",
            "--build-arg",
            f"PIP_INDEX_URL={server.url}",  # an index with no projects: every wheel comes from the links
            "-t",
            tag,
            ".",
            cwd=context,
        )
        (CACHE / "kubernetes-build.log").write_text(build.stdout + build.stderr)
        checked(build, "building the Kubernetes image")
    finally:
        server.close()
    daemon.docker("image", "prune", "--force")  # the image this one replaced (3 GB); the build cache stays
    return tag


@dataclass
class Ran:
    """One container's run: its exit status, output, and what it left in its output folder."""

    returncode: int
    output: str  # stdout and stderr
    folder: Path
    stdout: str = ""

    def findings(self) -> dict:
        """What `--json` printed (stdout alone)."""
        return json.loads(self.stdout)

    def json(self, name: str) -> dict:
        return json.loads((self.folder / name).read_text())

    def text(self, name: str) -> str:
        path = self.folder / name
        return path.read_text() if path.exists() else ""


def clone_image(daemon: Daemon) -> str:
    """The Python image with git, make and bubblewrap: what a newcomer's container needs to clone the project and
    run `make grade` in it (the README's two commands; as root, `make setup` would install bubblewrap itself,
    which needs a network these containers do not have)."""
    base = python_image(daemon)
    tag = f"mha-tests/clone:{base.rsplit('-', 1)[1]}"
    if not daemon.has_image(tag):
        with tempfile.TemporaryDirectory(dir=CACHE) as context:
            Path(context, "Dockerfile").write_text(
                f"FROM {base}\nRUN apt-get update && apt-get install -y --no-install-recommends git make bubblewrap "
                "&& rm -rf /var/lib/apt/lists/*\n"
            )
            checked(
                daemon.docker("build", *HOST_NETWORK, "-q", "-t", tag, context),
                "the image with git, make and bubblewrap",
            )
    return tag


def source_repository(target: Path) -> Path:
    """A git repository of this working tree's files (what a clone has), committed once: the containers
    `git clone` it, so that the checkout's modes are those git gives."""
    clone_files(target)
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the working tree"]):
        checked(run(["git", "-c", "user.name=tests", "-c", "user.email=tests@localhost", *command], cwd=target), "git")
    return target
