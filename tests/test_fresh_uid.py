"""A worker's fresh uid is one the grader can become, also in a user namespace that maps only a few uids (a
Kubernetes pod with `hostUsers: false` maps 65,536)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import environments
from autograder.sandbox import probe
from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import emulate  # noqa: E402  (tools/ is not a package)


def test_mapped_ranges_are_read_and_intersected(tmp_path):
    uid_map, gid_map = tmp_path / "uid_map", tmp_path / "gid_map"
    uid_map.write_text("         0     100000      65536\n")
    gid_map.write_text("         0     100000      65536\n     70000     300000         10\n")
    mapped = probe._mapped_ids(str(uid_map)) & probe._mapped_ids(str(gid_map))
    assert mapped.ranges == ((0, 65536),)
    assert not mapped.contains(*probe.UID_RANGE)  # the usual fresh uids cannot be entered there
    assert probe._mapped_ids(str(tmp_path / "missing")).contains(*probe.UID_RANGE)


def test_here_fresh_uids_come_from_the_usual_range():
    start, count = probe.UID_RANGE
    assert probe.fresh_uid_range() == probe.UID_RANGE
    assert start <= probe.fresh_uid() < start + count


@pytest.mark.skipif(os.geteuid() != 0, reason="the pod's user namespace is emulated as root")
def test_root_of_a_pods_user_namespace_can_become_a_fresh_uid():
    """Root of a user namespace mapping 0..65535 (a pod's): the fresh uid is one of those, and the grader can
    change to it; the usual range would fail with EINVAL."""
    code = (
        f"import os, sys; sys.path.insert(0, {str(readable_package())!r})\n"
        "from autograder.sandbox import procfs, probe\n"
        "uid = probe.fresh_uid()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    procfs.become_uid(uid)\n"
        "    os._exit(0 if os.getuid() == uid else 1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print(uid, probe.fresh_uid_range(), os.waitstatus_to_exitcode(status))\n"
    )
    emulate.ensure_tools()
    line = emulate.command_for("kubernetes-userns", [emulate.SYSTEM_PYTHON, "-c", code])
    done = subprocess.run(line, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    uid, start, count, became = done.stdout.replace("(", "").replace(")", "").replace(",", "").split()
    assert int(start) <= int(uid) < int(start) + int(count) < 65536 and became == "0"


def readable_package() -> Path:
    """The folder above the `autograder` package, one the pod's root (uid 100000 outside) can reach: the
    checkout where everyone may read it, else a copy of the package where everyone may (a checkout made
    with mktemp, or under root's home, is closed to other users)."""
    if environments.readable_by_others(ROOT / "autograder"):
        return ROOT
    folder = environments.base() / "fresh-uid"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(ROOT / "autograder", folder / "autograder", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
    return folder
