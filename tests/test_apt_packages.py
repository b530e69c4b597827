"""tools/apt_packages.py: what it asks of apt-get, with a stand-in apt-get that writes down its arguments.
Once the packages are installed, apt's cache of downloaded packages is emptied (`apt-get clean`: Chromium's
and Docker's packages are 2.4 GB, on a CI machine whose disk may be small); when the install fails, the
reason is said and nothing more is run."""

from __future__ import annotations

import os
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import apt_packages  # noqa: E402  (tools/ is not a package)


@pytest.fixture
def fake_apt(tmp_path, monkeypatch):
    """apt-get and dpkg-query on PATH that log their arguments; `install` fails when FAIL_INSTALL is set."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    (bin_dir / "apt-get").write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'case "$*" in *" install "*) if [ -n "$FAIL_INSTALL" ]; then echo "E: Unable to locate package x" >&2; '
        "exit 100; fi;; esac\n"
    )
    (bin_dir / "dpkg-query").write_text("#!/bin/sh\nexit 1\n")  # nothing is installed
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(apt_packages.os, "geteuid", lambda: 0)
    monkeypatch.setattr(apt_packages, "LOCK", str(tmp_path / "apt.lock"))
    return log


def test_installed_packages_leave_no_downloads_behind(fake_apt):
    assert apt_packages.install(["chromium", "docker.io"]) == ""
    lines = fake_apt.read_text().splitlines()
    assert [line.split()[-1] for line in lines[:1]] == ["update"]
    assert lines[1].endswith("install -y chromium docker.io")
    assert lines[2].endswith("clean")
    assert len(lines) == 3


def test_a_failed_install_says_why_and_cleans_nothing(fake_apt, monkeypatch):
    monkeypatch.setenv("FAIL_INSTALL", "1")
    why = apt_packages.install(["x"])
    assert "failed" in why and "Unable to locate package x" in why
    assert not any(line.endswith("clean") for line in fake_apt.read_text().splitlines())
