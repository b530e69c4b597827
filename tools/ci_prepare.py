"""What the long suites install and build, done ahead: `.ci/run` starts this in a lane of its own while lint
and the quick suite run in the others, since most of it waits on the network and the disk.

- Debian's packages the tests install when missing (tools/apt_packages.py: one apt-get at a time, so that a
  test installing at the same time waits instead of failing);
- the copy of the project with a virtualenv of Debian's Python (tests/environments.py `system_project`);
- Debian 11's bubblewrap (tests/bwrap_versions.py);
- the Docker images' Debian 12 base, its Python image and the wheelhouse (tests/docker_env.py).

Each is what the tests would do themselves, through the same functions, which find the work done and do it
again only when its inputs changed; a step that fails here is said and left to the tests, which then fail
or skip saying why, as they would without this. Exit status 0 always. (The other Pythons' virtualenvs,
which only `make test-pythons` needs, `.ci/run` makes beside this: `make test-pythons PYTHONS_ARGS=--setup-only`.)
"""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tools")]

# What the tests install with apt-get when missing: bubblewrap (tools/setup_venv.py), python3-seccomp and
# util-linux (tools/emulate.py), python3-venv (tests/environments.py), chromium (tests/browser.py), docker.io
# and debootstrap (tests/docker_env.py), Slurm's daemons and client (tests/test_slurm.py).
PACKAGES = (
    "bubblewrap",
    "python3-seccomp",
    "util-linux",
    "python3-venv",
    "chromium",
    "docker.io",
    "debootstrap",
    "slurmctld",
    "slurmd",
    "slurm-client",
)


def packages() -> str:
    import apt_packages

    return apt_packages.install(PACKAGES)


def system_project() -> str:
    import environments

    environments.system_project()
    return ""


def old_bubblewrap() -> str:
    import bwrap_versions

    return "" if bwrap_versions.debian_bullseye() else "Debian 11's bubblewrap could not be fetched"


def docker_images() -> str:
    import docker_env

    daemon = docker_env.Daemon().start()
    if daemon.unavailable:
        return daemon.unavailable
    try:
        docker_env.python_image(daemon)  # and the base image under it
        docker_env.wheelhouse()
    finally:
        daemon.stop()
    return ""


def step(name: str, work: Callable[[], str]) -> str:
    started = time.monotonic()
    try:
        why = work()
    except Exception:
        why = traceback.format_exc(limit=3)[-2000:]
    seconds = time.monotonic() - started
    return f"prepare: {name}: " + (f"done in {seconds:.0f} s" if not why else f"NOT done ({seconds:.0f} s): {why}")


def main() -> int:
    print(step("Debian packages", packages), flush=True)
    steps = {
        "the copy of the project for Debian's Python": system_project,
        "Debian 11's bubblewrap": old_bubblewrap,
        "the Docker base images and the wheelhouse": docker_images,
    }
    with ThreadPoolExecutor(len(steps)) as pool:
        for said in as_completed([pool.submit(step, name, work) for name, work in steps.items()]):
            print(said.result(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
