"""bubblewrap from 0.4 on: the grader uses only the options the installed one has, or refuses the namespace
sandbox naming the version and the option, and falls back as the doctor says.

The versions (tests/bwrap_versions.py): Debian 11's real bubblewrap 0.4.1 (no `--perms`, `--size` or
`--disable-userns`), releases emulated over the installed one (0.4.0, 0.5.0, 0.6.1: Ubuntu 22.04's, 0.7.0),
and the installed one itself (Debian 12's 0.8.0).

| version | as root | as a normal user |
| --- | --- | --- |
| 0.4.x | refused: no `--perms` (the worker's fresh uid could not write its /tmp); a fresh uid per worker instead | the sandbox, without `--size` and `--disable-userns` |
| 0.5.0, 0.6.1 | the sandbox, its /tmp without a size limit | the same, without `--disable-userns` too |
| 0.7.0 | the sandbox | the sandbox, without `--disable-userns` |
| 0.8.0 and later | the sandbox, every option | the sandbox, every option |
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import bwrap_versions
from autograder.sandbox import bwrap, machine, probe
from environments import NORMAL_UID
from hostile import reference_theft, with_cells

EMULATED = ("0.4.0", "0.5.0", "0.6.1", "0.7.0")
needs_bwrap = pytest.mark.skipif(not probe.bwrap_path(), reason="bubblewrap is not installed here")


def shim(version: str) -> str:
    return str(bwrap_versions.emulated(version, probe.bwrap_path() or "/usr/bin/bwrap") / "bwrap")


@needs_bwrap
@pytest.mark.parametrize("version", EMULATED)
def test_the_options_are_read_from_the_bubblewrap_itself(version):
    found = bwrap.features(shim(version))
    assert found.version == version
    assert found.lacking(as_root=False) == bwrap_versions.lacks(version)
    assert found.has("--ro-bind") and found.has("--unshare-pid") and found.has("--die-with-parent")


@needs_bwrap
@pytest.mark.parametrize("version", EMULATED)
@pytest.mark.parametrize("as_root", [True, False], ids=["root", "user"])
def test_the_command_uses_only_the_options_this_bubblewrap_has(version, as_root):
    executable = shim(version)
    command = bwrap.command(executable, "cpu", 1 << 20, as_root=as_root, allowed=bwrap.expected_allow_list())
    for option in bwrap_versions.lacks(version):
        assert option not in command, (version, option)
    if as_root != probe.is_root():
        return
    if bwrap.features(executable).refusal(as_root):  # the grader never starts it: see the next test
        return
    started = subprocess.run(
        [*command, sys.executable, "-I", "-S", "-c", "print('sandboxed')"],
        env=bwrap.worker_env(),
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert started.returncode == 0 and started.stdout == "sandboxed\n", started.stderr


@needs_bwrap
def test_an_emulated_release_refuses_an_option_it_lacks_as_bubblewrap_does():
    """The emulation itself: what the grader's command did with Ubuntu 22.04's bubblewrap before."""
    refused = subprocess.run(
        [shim("0.6.1"), "--size", "1024", "--tmpfs", "/tmp", "true"], capture_output=True, text=True
    )
    assert refused.returncode == 1 and refused.stderr.strip() == "bwrap: Unknown option --size"


@needs_bwrap
def test_as_root_a_bubblewrap_without_perms_is_refused_naming_its_version_and_the_option():
    found = bwrap.features(shim("0.4.0"))
    said = found.refusal(as_root=True)
    assert said and "bubblewrap 0.4.0" in said and "--perms" in said and "0.5.0" in said
    assert found.refusal(as_root=False) is None
    assert "without --size (bubblewrap 0.7.0)" in found.costs(as_root=False)
    assert bwrap.features(shim("0.7.0")).refusal(as_root=True) is None


def test_the_doctor_advises_a_newer_bubblewrap_where_it_is_too_old():
    from test_doctor import a_machine

    too_old = machine.Bubblewrap(
        "/usr/bin/bwrap", "0.4.1", "bubblewrap 0.4.1 (/usr/bin/bwrap) has no --perms ...", needs="0.5.0"
    )
    advice = a_machine(bubblewrap=too_old, isolation="process").advice
    assert advice.startswith("install bubblewrap 0.5.0 or later")


# -- each version in a real grading, as root and as a normal user -------------------------------------------


def versions() -> list[tuple[str, str]]:
    return [("0.4.1", "Debian 11's, real"), ("0.6.1", "Ubuntu 22.04's, emulated"), ("0.7.0", "emulated")]


@pytest.fixture(scope="module")
def bubblewraps() -> dict[str, str]:
    """version -> a folder holding its `bwrap`."""
    found = {version: str(bwrap_versions.emulated(version)) for version, _ in versions()[1:]}
    real = bwrap_versions.debian_bullseye()
    if real is not None:
        found["0.4.1"] = str(real)
    return found


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.timeout(1800)
@pytest.mark.skipif(not probe.is_root(), reason="the normal-user case is emulated as root (tools/emulate.py)")
@pytest.mark.parametrize("user", ["root", "user"])
@pytest.mark.parametrize("version", [v for v, _ in versions()], ids=[f"{v} ({how})" for v, how in versions()])
def test_each_version_grades_in_the_sandbox_it_can_build(bubblewraps, version, user, tmp_path_factory):
    """The doctor says what grading will have with this bubblewrap, and a grading has exactly that: the
    namespace sandbox with only the options it has (a submission reading the reference gets nothing), or,
    as root without `--perms`, a fresh uid per worker, as the doctor's advice and the refusal say."""
    if version not in bubblewraps:
        pytest.skip(f"bubblewrap {version} could not be fetched here (Debian 11's archive)")
    import environments
    from test_environments import ENVIRONMENTS, grader_command, run_in

    # The system Python's copy of the project (readable by a worker's fresh uid), as root or as uid 1000
    slurm = next(e for e in ENVIRONMENTS if e.name == "slurm")
    environment = slurm if user == "user" else type(slurm)("root", "root", None, None, "auto", "", True)
    grader, project, env = grader_command(slurm)
    env["PATH"] = f"{bubblewraps[version]}:{env['PATH']}"
    folder = environments.workspace(f"bwrap-{version}-{user}", None if user == "root" else NORMAL_UID)
    submission = folder / "mha.py"
    submission.write_text(with_cells(last=reference_theft(project)))
    environments.give_to(folder, None if user == "root" else NORMAL_UID)
    home = folder / "home"
    doctor = run_in(environment, [*grader, "doctor", "--no-speed", "--json"], project, env, home, 300)
    findings = json.loads(doctor.stdout)
    said = findings["machine"]["bubblewrap"]
    assert said["version"] == version, doctor.stderr[-2000:]
    out = folder / "results.json"
    graded = run_in(
        environment,
        [*grader, "grade", str(submission), "--part", "columns", "--device", "cpu", "--out", str(out)],
        project,
        env,
        home,
        600,
    )
    assert graded.returncode == 0, graded.stderr[-3000:]
    results = json.loads(out.read_text())
    extra = results["extra_data"]
    refused_as_root = user == "root" and "--perms" in bwrap_versions.lacks(version)
    if refused_as_root:
        assert findings["machine"]["isolation"] == "process"
        assert "has no --perms" in said["problem"] and f"bubblewrap {version}" in said["problem"]
        assert findings["advice"].startswith("install bubblewrap 0.5.0 or later")
        assert extra["isolation"] == "process" and "fresh unprivileged uid" in extra["sandbox"]["user"]
    else:
        assert findings["machine"]["isolation"] == "namespace", said
        assert extra["isolation"] == "namespace"
        assert ("no size limit" in extra["sandbox"]["filesystem"]) == ("--size" in bwrap_versions.lacks(version))
        assert "THEFT SUCCEEDED" not in results["output"]
    assert "THEFT BLOCKED" in results["output"]
    assert results["score"] == results["max_score"] > 0, results["output"][-2000:]
