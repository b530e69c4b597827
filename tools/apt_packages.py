"""Debian packages installed with apt-get, one apt-get at a time on this machine.

Several of the project's processes may install at once: `.ci/run` installs everything the tests need in the
background (tools/ci_prepare.py) while the first tests run, and each test still installs what it needs
itself when run alone. `apt-get update` does not wait for another apt-get's lock (it fails at once), so every
caller here takes one lock file first, and an apt-get of some other program is waited for too (dpkg's
`DPkg::Lock::Timeout`, and a few tries of `apt-get update`). Standard library only: tools/setup_venv.py uses
it before the virtualenv exists.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time

LOCK = "/var/tmp/mha-exercise-apt.lock"
WAIT_S = 900  # for another apt-get, and for dpkg's own lock


def missing(packages: list[str] | tuple[str, ...]) -> list[str]:
    """The packages of `packages` that dpkg does not list as installed."""
    found = []
    for package in packages:
        done = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", package], capture_output=True, text=True, check=False
        )
        if done.returncode != 0 or "install ok installed" not in done.stdout:
            found.append(package)
    return found


def install(packages: list[str] | tuple[str, ...], timeout: float = 1800) -> str:
    """`apt-get update` and `apt-get install -y` of those of `packages` not installed yet, as root, then
    `apt-get clean`; "" when they are all installed afterwards, else why not (the last lines apt-get printed)."""
    if not shutil.which("apt-get"):
        return "this machine has no apt-get"
    if os.geteuid() != 0:
        return "installing with apt-get needs root"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        wanted = missing(packages) if shutil.which("dpkg-query") else list(packages)
        if not wanted:
            return ""
        wait = f"DPkg::Lock::Timeout={WAIT_S}"
        for command in (
            ["apt-get", "-q", "-o", wait, "update"],
            ["apt-get", "-q", "-o", wait, "install", "-y", *wanted],
        ):
            for attempt in range(10):  # update does not wait for the lists' lock another apt-get holds
                done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout, check=False)
                if done.returncode == 0 or "Could not get lock" not in done.stderr:
                    break
                time.sleep(min(5 * (attempt + 1), 30))
            if done.returncode != 0:
                lines = (done.stderr or done.stdout).strip().splitlines()
                return f"`{' '.join(command)}` failed: {' '.join(lines[-3:])[-500:]}"
        # The downloaded packages stay in apt's cache otherwise (Chromium's and Docker's: 2.4 GB on a fresh
        # CI machine, whose disk may be small): installed, they are not needed again.
        subprocess.run(["apt-get", "-q", "clean"], capture_output=True, env=env, timeout=timeout, check=False)
    return ""
