"""`python -m autograder doctor` and the machine survey behind it (and behind results.json's `machine`)."""

from __future__ import annotations

import json

import pytest

from autograder import doctor
from autograder.sandbox import machine, probe
from autograder.sandbox.machine import Bubblewrap, Container, ControlGroups, Cuda, Machine, Namespaces
from helpers import autograder


def a_machine(**changes) -> Machine:
    """A machine where everything works (root, bubblewrap, writable control groups), with `changes`."""
    found = Machine(
        user="root",
        root=True,
        python="python (3.11.7)",
        namespaces=Namespaces(True, "mount, pid, network, IPC and UTS namespaces", "", {}, "none"),
        bubblewrap=Bubblewrap("/usr/bin/bwrap", "0.8.0", None),
        fresh_uid=True,
        fresh_uid_problem="",
        cgroups=ControlGroups(["v2 at /sys/fs/cgroup"], True, ["v2"], ["memory", "pids", "cpu"], {}, ""),
        cuda_found=Cuda(False, [], [], "2.13.0+cpu"),
        isolation="namespace",
        refusal="",
        guarantees={},
        advice="",
    )
    for key, value in changes.items():
        setattr(found, key, value)
    found.advice = machine._advice(found)
    return found


READ_ONLY = ControlGroups(["v2 at /sys/fs/cgroup"], False, [], [], {}, "read-only")


def refused(sysctls=None, seccomp="none", tried="a user namespace") -> Namespaces:
    return Namespaces(False, tried, "Operation not permitted", sysctls or {}, seccomp, "")


@pytest.mark.parametrize(
    "changes, says",
    [
        ({}, ""),  # nothing to improve
        (
            {"bubblewrap": Bubblewrap(None, "", "not installed"), "isolation": "process"},
            "apt-get install -y bubblewrap",
        ),
        (  # GitHub's ubuntu-24.04 runners, as a normal user
            {
                "root": False,
                "user": "uid 1001",
                "isolation": None,
                "namespaces": refused({"kernel.apparmor_restrict_unprivileged_userns": "1"}),
            },
            "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
        ),
        (
            {"root": False, "isolation": None, "namespaces": refused({"kernel.unprivileged_userns_clone": "0"})},
            "sysctl -w kernel.unprivileged_userns_clone=1",
        ),
        (  # a Kubernetes pod as a normal user, default seccomp profile
            {"root": False, "isolation": None, "namespaces": refused(seccomp="a filter"), "cgroups": READ_ONLY},
            "hostUsers: false",
        ),
        (  # Docker, Gradescope: root, namespaces refused, read-only cgroups
            {
                "isolation": "process",
                "namespaces": refused(seccomp="a filter", tried="mount, pid, network, IPC and UTS namespaces"),
                "cgroups": READ_ONLY,
            },
            "seccomp=unconfined",
        ),
        ({"root": False, "user": "uid 1000", "cgroups": READ_ONLY}, "Delegate=yes"),  # a Slurm job
        ({"cgroups": READ_ONLY}, "/sys/fs/cgroup writable"),
        (  # Docker's defaults as root: every option bubblewrap needs, in one `docker run`
            {
                "isolation": "process",
                "namespaces": refused(seccomp="a filter", tried="mount, pid, network, IPC and UTS namespaces"),
                "cgroups": READ_ONLY,
                "container": Container("Docker", ["SYS_ADMIN", "NET_ADMIN"], True, ""),
            },
            "`docker run --security-opt seccomp=unconfined --cap-add SYS_ADMIN --cap-add NET_ADMIN`",
        ),
        (  # seccomp=unconfined and SYS_ADMIN given, bubblewrap still fails on the loopback: NET_ADMIN is missing
            {
                "isolation": "process",
                "bubblewrap": Bubblewrap(
                    "/usr/bin/bwrap", "0.8.0", "bubblewrap exited with status 1 (bwrap: loopback: Failed RTM_NEWADDR)"
                ),
                "cgroups": READ_ONLY,
                "container": Container("Docker", ["NET_ADMIN"], True, ""),
            },
            "`docker run --cap-add NET_ADMIN`",
        ),
        (  # a normal user in Docker: no capability helps, an unmasked /proc does
            {
                "root": False,
                "user": "uid 1000",
                "isolation": None,
                "namespaces": refused(seccomp="a filter"),
                "cgroups": READ_ONLY,
                "container": Container("Docker", [], True, ""),
            },
            "`docker run --security-opt seccomp=unconfined --security-opt systempaths=unconfined`",
        ),
        (  # under AppArmor's docker-default profile
            {
                "isolation": "process",
                "namespaces": refused(seccomp="a filter", tried="mount, pid, network, IPC and UTS namespaces"),
                "cgroups": READ_ONLY,
                "container": Container("Docker", ["SYS_ADMIN"], True, "docker-default (enforce)"),
            },
            "--cap-add SYS_ADMIN --security-opt apparmor=unconfined`",
        ),
    ],
    ids=[
        "all-there",
        "no-bwrap",
        "apparmor",
        "userns-clone",
        "kubernetes",
        "docker",
        "slurm",
        "root-read-only",
        "docker-root",
        "docker-net-admin",
        "docker-user",
        "docker-apparmor",
    ],
)
def test_the_advice_names_the_one_change_and_its_command(changes, says):
    advice = a_machine(**changes).advice
    assert (says in advice) if says else advice == ""


def test_a_refusal_names_what_is_missing_in_whole_sentences():
    """The refusal quotes bubblewrap's own words whole (its full stop dropped, not a fragment ">., and"), and
    never tells to install a bubblewrap that is installed."""
    said = probe.bubblewrap_said(
        "bwrap: No permissions to create a new namespace, likely because the kernel does not allow\n"
        "non-privileged user namespaces. See <https://deb.li/bubblewrap> or\n"
        "<file:///usr/share/doc/bubblewrap/README.Debian.gz>.\n"
    )
    assert said.endswith("README.Debian.gz>") and "\n" not in said
    in_docker = a_machine(
        root=False,
        user="uid 1000",
        isolation=None,
        namespaces=refused(seccomp="a filter"),
        container=Container("Docker", [], True, ""),
    )
    assert "install bubblewrap" not in in_docker.advice.lower()


def test_results_say_the_isolation_the_grading_used():
    """`extra_data.machine` describes the isolation asked for with --isolation, not what `auto` would do."""
    refusing = a_machine(root=False, user="uid 1000", isolation=None, refusal="no sandbox", fresh_uid=False)
    summary = refusing.summary(used="process")
    assert summary["isolation"].startswith("process (asked for; `auto` would refuse here)")
    assert "grader's own user" in summary["guarantee_isolation"]
    assert refusing.summary()["isolation"] == "none: no sandbox"


def test_the_survey_agrees_with_what_grading_chooses():
    found = machine.survey()
    try:
        chosen = probe.choose_isolation("auto")
    except OSError:
        chosen = None
    assert found.isolation == chosen
    assert found.user == ("root" if probe.is_root() else f"uid {__import__('os').geteuid()}")
    assert (found.bubblewrap.problem is None) == probe.namespace_sandbox_available()
    summary = found.summary()
    assert {"user", "user_namespaces", "bubblewrap", "fresh_uid", "control_groups", "cuda", "isolation"} <= set(summary)
    assert all(isinstance(value, str) for value in summary.values())


def run(submission, score, top=10.0):
    return doctor.SpeedRun(submission, score, top, None, "", True)


def test_the_speed_verdict_trusts_only_a_reference_that_always_earns_and_a_loop_that_never_does():
    assert doctor.speed_verdict([run("reference", 10), run("loop over heads", 0)])[0]
    trusted, why = doctor.speed_verdict([run("reference", 10), run("reference", 0), run("loop over heads", 0)])
    assert not trusted and "reference lost speed points in 1 of 2" in why
    trusted, why = doctor.speed_verdict([run("reference", 10), run("loop over heads", 4)])
    assert not trusted and "loop over heads earned" in why
    broken = doctor.SpeedRun("reference", 0, 0, None, "the grader itself failed", False)
    assert not doctor.speed_verdict([broken])[0]


def test_doctor_without_the_self_test_says_what_this_machine_allows():
    done = autograder("doctor", "--no-speed", "--json", timeout=120)
    findings = json.loads(done.stdout)
    assert done.returncode == (0 if findings["machine"]["isolation"] else 2), done.stderr
    assert findings["machine"]["cgroups"]["writable"] == bool(findings["machine"]["cgroups"]["hierarchies"])
    assert "speed" not in findings


@pytest.mark.slow
@pytest.mark.long
@pytest.mark.verdicts
def test_doctor_trusts_the_speed_part_here(tmp_path):
    """The self-test through the real grader: here (a machine the speed part was calibrated on) the reference
    earns its speed points and the loop over heads none. A speed verdict, so it runs with the others in `make
    test-speed`, alone, never beside the rest of `make test` (it failed there on a busy machine)."""
    done = autograder("doctor", "--gradings", "1", timeout=600)
    assert "Speed self-test" in done.stdout, done.stdout + done.stderr
    assert done.returncode == 0, done.stdout[-2000:]
    assert "can be trusted" in done.stdout


@pytest.mark.slow
def test_results_carry_the_machine_summary(reference_results):
    summary = reference_results["extra_data"]["machine"]
    assert summary == machine.survey().summary()


def test_everything_doctor_prints_is_cleaned(monkeypatch, capsys):
    """What doctor prints quotes what gradings and the machine's tools said (a grading's reason quotes a path,
    a folder's name): every line is cleaned of control characters and bidi controls, as results.json is."""
    import argparse
    import re

    escapes = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\u202e"
    here = a_machine()
    here.advice = f"run {escapes} here"
    monkeypatch.setattr(machine, "survey", lambda: here)
    monkeypatch.setattr(doctor, "survey", lambda: here, raising=False)
    said = doctor.SpeedRun("reference", 0, 10, None, f"cannot read /srv/{escapes}/mha.py: denied", False)
    monkeypatch.setattr(doctor, "speed_self_test", lambda device, isolation, gradings: [said])
    args = argparse.Namespace(device="cpu", isolation="auto", gradings=1, no_speed=False, json=False)
    assert doctor.run(args) == doctor.EXIT_SPEED_UNTRUSTED
    printed = capsys.readouterr().out
    assert "cannot read /srv/" in " ".join(printed.split()) and "run " in printed
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202e]", printed), repr(printed)


def test_the_speed_report_and_the_advice_read_as_sentences():
    """No ".; points" after a sentence that was not measured, and no "do  nothing" when there is no advice."""
    from autograder.doctor import SpeedRun, speed_report

    unmeasured = SpeedRun("loop over heads", 0.0, 10.0, None, "speed: not timed: far too slow. Nothing to score.", True)
    text = speed_report([unmeasured], True, "a loop over heads earns nothing", 12.0)
    assert ".;" not in text and "; points 0/10" in text
    done = autograder("doctor", "--no-speed", timeout=120)
    last = done.stdout.strip().splitlines()[-1]
    assert "do  nothing" not in done.stdout
    assert last.startswith("The one change that would improve grading here") or last.strip().startswith("do ")


def test_doctor_warns_of_another_copy_of_the_reference_that_any_user_can_read(monkeypatch, capsys):
    """A clone or an old release beside the checkout, in a home folder or in /tmp hands the solution to every user
    of the machine, and under process isolation to every worker: doctor names each copy another user could read
    (not one in a folder they cannot enter, a hidden one or one deeper than it looks) and the command that closes
    them."""
    import argparse
    import shutil
    import tempfile
    from pathlib import Path

    from autograder.sandbox import exposure

    base = Path(tempfile.mkdtemp(prefix="mha-copies-", dir="/tmp"))
    base.chmod(0o755)
    try:
        copies = {
            name: base / name / "reference"
            for name in ("ta/old-clone", "closed/clone", ".cache/clone", "a/b/c/clone", "release")
        }
        for copy in copies.values():
            copy.mkdir(parents=True)
            (copy / "mha.py").write_text("the solution\n")
        (base / "closed").chmod(0o700)
        (copies["release"] / "mha.py").chmod(0o600)  # closed already
        readable = [str(copies["ta/old-clone"])]
        assert exposure.readable_copies([str(base)]) == readable

        monkeypatch.setattr(exposure, "places_for_copies", lambda: [str(base)])
        monkeypatch.setattr(machine, "survey", lambda: a_machine())
        monkeypatch.setattr(doctor, "worker_start", lambda device, isolation: (True, "forked"))
        args = argparse.Namespace(device="cpu", isolation="process", gradings=1, no_speed=True, json=False)
        doctor.run(args)
        printed = " ".join(capsys.readouterr().out.split())
        assert "other copies of the reference any user can read" in printed
        assert f"do chmod -R o-rwx {readable[0]}" in printed
        assert "The one change that would improve grading here do close the other copies" in printed
    finally:
        shutil.rmtree(base)


def test_a_root_grader_whose_fresh_uid_cannot_read_the_interpreter_is_never_told_to_run_as_root(monkeypatch):
    """Root in a container whose interpreter a fresh uid cannot read (a virtualenv under a 0700 home, a
    checkout closed whole): the advice is the command that opens the interpreter (`exposure.opening`, which
    tests/test_exposure.py follows literally), never "run the grader as root" to root."""
    monkeypatch.setattr(machine.exposure, "interpreter_paths", lambda: ["/opt/closed/.venv/lib"])
    monkeypatch.setattr(machine.exposure, "opening", lambda paths: f"chmod o+x /opt/closed ({paths[0]})")
    container = {
        "isolation": None,
        "fresh_uid": False,
        "namespaces": refused(seccomp="a filter", tried="mount, pid, network, IPC and UTS namespaces"),
        "cgroups": READ_ONLY,
        "container": Container("Docker", ["SYS_ADMIN", "NET_ADMIN"], True, ""),
    }
    advice = a_machine(**container).advice
    assert "run the grader as root" not in advice, advice
    assert "`chmod o+x /opt/closed (/opt/closed/.venv/lib)`" in advice and "--isolation process" in advice
    assert "docker run --security-opt seccomp=unconfined" in advice
    as_a_user = a_machine(**container, root=False, user="uid 1000").advice
    assert "run the grader as root" in as_a_user and "chmod" not in as_a_user
    outside = a_machine(isolation=None, fresh_uid=False, bubblewrap=Bubblewrap(None, "", "not installed"))
    assert "run the grader as root" not in outside.advice and "`chmod o+x /opt/closed" in outside.advice
