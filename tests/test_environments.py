"""The environment matrix: the same class graded where courses run graders, each emulated on this machine.

Each environment grades, with `grade-class` (long-lived grading processes, one submission at a time), the
reference's own definitions (full marks, the speed part included), a loop over heads with the right values
(no speed points) and a few hostile submissions (no points gained, nothing left running, results.json
written), and says what held the worker in (`extra_data.machine`, `isolation`, `sandbox`):

| environment | emulated here by | grading there |
| --- | --- | --- |
| `root`: a lab machine or VM as root | this machine as it is | bubblewrap, writable control groups |
| `docker`: root in a Docker-like container (Gradescope) | `tools/emulate.py docker`: a seccomp filter refusing new namespaces, Docker's default capabilities, /sys/fs/cgroup read-only | a fresh uid per worker, limits by rlimits |
| `slurm`: a normal user with user namespaces (a Slurm job, a lab account) | `tools/emulate.py slurm`: uid 1000 (the control groups are root's) | bubblewrap in a user namespace |
| `kubernetes-userns`: deploy/kubernetes/'s pods, root of a user namespace of their own (`hostUsers: false`) | `tools/emulate.py kubernetes-userns`: uids 0-65535 mapped to 100000-165535, a container's capabilities, the seccomp filter, /sys/fs/cgroup read-only | a fresh uid of the pod's per worker, limits by rlimits |
| `kubernetes`: a normal user in a pod, default seccomp profile | `tools/emulate.py kubernetes`: uid 1000, the same seccomp filter | `auto` refuses (exit 2, saying why and what fixes it); `--isolation process` grades |

What a real environment adds is `emulate.REAL[environment]`, printed with each run. The normal-user and
container cases grade with a copy of the project readable by every user and a virtualenv of Debian's
Python (`environments.system_project`), as such a machine would have.

Without writable control groups the grader checks the submission's CPU budget by walking /proc; that walk
happens between timed requests, never inside one, so the reference earns its speed points in every
environment, and the same loop over heads earns none.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import environments
from environments import NORMAL_UID, emulate, shared_files
from helpers import ROOT, class_results, part_scores, wait_until
from hostile import (
    BACKGROUND_BURNER,
    BROKEN_MHA_FORWARD,
    EXIT_IN_FORWARD,
    escape_attempts,
    processes_with,
    reference_theft,
    with_cells,
)
from speed_variants import LOOP_OVER_HEADS, definitions, with_cell

pytestmark = [
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the emulation runs as root (it makes namespaces, drops to other users)"
    ),
]


@dataclass(frozen=True)
class Environment:
    name: str
    emulation: str  # tools/emulate.py's environment
    user: int | None  # the normal user's uid; None: root
    owner: int | None  # who must own the course's folder, as the machine sees it (None: root)
    isolation: str  # what grade-class is given
    expected_isolation: str  # what grading must use there
    cgroups: bool  # whether control groups are writable there


ENVIRONMENTS = [
    Environment("root", "root", None, None, "auto", "namespace", True),
    Environment("docker", "docker", None, None, "auto", "process", False),
    Environment("slurm", "slurm", NORMAL_UID, NORMAL_UID, "auto", "namespace", False),
    # deploy/kubernetes/'s pods: root of a user namespace of their own, fresh uids for the workers
    Environment("kubernetes-userns", "kubernetes-userns", None, emulate.POD_IDS[0], "auto", "process", False),
    # a pod as a normal user (no user namespace to be had): only the documented opt-in grades
    Environment("kubernetes-process", "kubernetes", NORMAL_UID, NORMAL_UID, "process", "process", False),
]


@dataclass
class Submission:
    build: object  # (course folder, marker, the grader's project folder) -> source
    lost: dict[str, str] = field(default_factory=dict)  # part -> "all": every other part keeps full marks


SUBMISSIONS = {
    "reference": Submission(lambda course, marker, project: definitions()),
    "loop_over_heads": Submission(
        lambda course, marker, project: with_cell(LOOP_OVER_HEADS), {"mha": "some", "speed": "all"}
    ),
    # a process and a thread burning the CPU, left behind at the end if the grader let them; they run only in its
    # own requests, and what is timed is its forward's graph, replayed where they are not: they earn nothing
    "background_burner": Submission(
        lambda course, marker, project: with_cells(
            first=LEAVES_FILES.replace("{marker}", marker), last=BACKGROUND_BURNER.replace("{marker}", marker)
        ),
    ),
    "exit_in_mha_forward": Submission(
        lambda course, marker, project: with_cells(last=EXIT_IN_FORWARD), {"mha": "all", "speed": "all"}
    ),
    # writes a perfect results.json and a conftest.py that passes everything wherever it can
    "fake_results": Submission(
        lambda course, marker, project: with_cells(
            first=escape_attempts(
                [course / "autograded" / "fake_results" / "mha" / "results.json"],
                [course, course / "submitted" / "fake_results" / "mha"],
                parents=False,  # never the shared machine's /tmp
            ),
            last=BROKEN_MHA_FORWARD,
        ),
        {"mha": "all", "speed": "all"},
    ),
    # imports or reads the reference and the rubric, from the installed package or the project's folder
    "reference_theft": Submission(
        lambda course, marker, project: with_cells(last=reference_theft(project)),
        {"mha": "all", "speed": "all"},
    ),
}


# files in the machine's shared folders, where a later worker would see them under process isolation
LEAVES_FILES = """
import os
for _folder in ("/tmp", "/var/tmp", "/dev/shm"):
    try:
        os.makedirs(os.path.join(_folder, "{marker}-tree", "deep"), exist_ok=True)
        with open(os.path.join(_folder, "{marker}-file"), "w") as _handle:
            _handle.write("left for a later worker")
    except OSError:
        pass
"""
SHARED_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm")


def files_with(marker: str) -> list[str]:
    return sorted(str(p) for folder in SHARED_FOLDERS for p in Path(folder).glob(f"*{marker}*"))


@dataclass
class Graded:
    environment: Environment
    returncode: int
    output: str
    results: dict[str, dict]
    left_running: list[str]
    seconds: float
    left_files: list[str]


def grader_command(environment: Environment) -> tuple[list[str], Path, dict[str, str]]:
    """The grader's interpreter and folder in `environment`: the checkout's own for root, else the
    copy everyone may read."""
    if environment.emulation == "root":
        python, project = Path(sys.executable), ROOT
    else:
        project = environments.system_project()
        python = project / ".venv" / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOGRADER_", "PYTEST"))}
    env["PATH"] = f"{python.parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return [str(python), "-m", "autograder"], project, env


def run_in(environment: Environment, command: list[str], cwd: Path, env: dict[str, str], home: Path, timeout: float):
    line = emulate.command_for(environment.emulation, command, environment.user or NORMAL_UID, str(home))
    return subprocess.run(line, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module", params=ENVIRONMENTS, ids=[e.name for e in ENVIRONMENTS])
def graded(request) -> Graded:
    environment: Environment = request.param
    print(f"\n{environment.name}: what a real one adds: {emulate.REAL[environment.emulation]}")
    marker = f"hostile-{uuid.uuid4().hex[:12]}"
    folder = environments.workspace(environment.name, environment.owner)
    course = folder / "course"
    grader, project, env = grader_command(environment)
    for student, submission in SUBMISSIONS.items():
        path = course / "submitted" / student / "mha" / "mha.py"
        path.parent.mkdir(parents=True)
        path.write_text(submission.build(course, marker, project))
    environments.give_to(folder, environment.owner)
    command = [
        *grader,
        "grade-class",
        str(course),
        "--device",
        "cpu",
        "--jobs",
        "1",
        "--isolation",
        environment.isolation,
    ]
    started = time.monotonic()
    run = run_in(environment, command, project, env, folder / "home", timeout=3000)
    seconds = time.monotonic() - started
    # The grading's processes, killed as it ended, may take a moment to be gone; whatever it left behind stays (a
    # burner runs forever, a file is not removed by anyone now), and is still there when the wait ends.
    wait_until(lambda: not processes_with(marker) and not files_with(marker), seconds=10)
    results = class_results(course, SUBMISSIONS)
    left_files = files_with(marker)
    for path in left_files:  # the machine's, so removed whatever the test says of them
        subprocess.run(["rm", "-rf", "--", path], check=False)
    return Graded(
        environment, run.returncode, run.stdout + run.stderr, results, processes_with(marker), seconds, left_files
    )


def test_the_class_is_graded_with_the_isolation_this_environment_allows(graded):
    assert graded.returncode == 0, graded.output[-3000:]
    assert sorted(graded.results) == sorted(SUBMISSIONS), graded.output[-3000:]
    for student, results in graded.results.items():
        extra = results["extra_data"]
        assert extra["status"] == "graded", (student, extra.get("reason"))
        assert extra["isolation"] == graded.environment.expected_isolation, (student, extra["isolation"])
        machine = extra["machine"]
        assert machine["user"] == ("root" if graded.environment.user is None else f"uid {graded.environment.user}")
        assert machine["control_groups"].startswith("writable" if graded.environment.cgroups else "not writable")
    print(f"{graded.environment.name}: graded in {graded.seconds:.0f} s; machine: {machine}")


def test_the_reference_earns_every_point_but_speed(graded):
    scores = part_scores(graded.results["reference"])
    assert {part: s for part, s in scores.items() if part != "speed"} == {
        part: (top, top) for part, (_, top) in scores.items() if part != "speed"
    }


def test_the_reference_earns_the_speed_points(graded):
    score, top = part_scores(graded.results["reference"])["speed"]
    speed = graded.results["reference"]["extra_data"].get("speed") or {}
    assert score == top > 0, f"speed {score}/{top}, relative {speed.get('relative')}: {_speed_output(graded)}"


def test_a_loop_over_heads_earns_no_speed_points(graded):
    score, top = part_scores(graded.results["loop_over_heads"])["speed"]
    assert score == 0 < top


@pytest.mark.parametrize("student", [s for s in SUBMISSIONS if s not in ("reference", "loop_over_heads")])
def test_a_hostile_submission_gains_nothing_and_leaves_nothing_running(graded, student):
    results = graded.results[student]
    assert results["extra_data"]["status"] == "graded"
    assert results["output"] != "hacked" and results["score"] <= results["max_score"] == 100
    reference = part_scores(graded.results["reference"])
    for part, (score, top) in part_scores(results).items():
        if part in SUBMISSIONS[student].lost:
            assert score < top, (student, part)
        elif part != "speed" or graded.environment.cgroups:
            assert (score, top) == reference[part], (student, part)
    if student == "reference_theft":
        assert "THEFT SUCCEEDED by" not in results["output"]
        if graded.environment.user is None or graded.environment.expected_isolation == "namespace":
            # a fresh uid (the grader is root) or the sandbox: not even reading the files
            assert "THEFT SUCCEEDED" not in results["output"], results["output"][-2000:]
    assert not graded.left_running, f"left running after grading: {graded.left_running}"


def test_nothing_a_worker_wrote_in_the_machines_shared_folders_outlives_it(graded):
    """/tmp, /var/tmp and /dev/shm: the sandbox's own, or (process isolation) the machine's, where what a worker's
    fresh uid left is removed when the worker ends. Only a worker run as the grader's own user (the documented
    opt-in) can leave files there: the grader cannot tell them from its own."""
    if graded.environment.user is not None and graded.environment.expected_isolation == "process":
        pytest.skip("process isolation as the grader's own user: what a worker leaves in /tmp stays (documented)")
    assert graded.left_files == [], graded.left_files


def _speed_output(graded) -> str:
    return next((t["output"] for t in graded.results["reference"]["tests"] if t["tags"][0] == "speed"), "")[:400]


# -- where no isolation is possible: refuse clearly ----------------------------------------------------------


KUBERNETES = Environment("kubernetes", "kubernetes", NORMAL_UID, NORMAL_UID, "auto", "", False)


def test_a_pod_without_user_namespaces_refuses_to_grade_and_says_how_to_fix_it():
    """A normal user without user namespaces (a Kubernetes pod as shipped before): `grade` exits 2, and
    results.json says why and what would fix it; grade-class refuses before grading anyone."""
    folder = environments.workspace("kubernetes-refuses", NORMAL_UID)
    submission = folder / "mha.py"
    submission.write_text(definitions())
    course = folder / "course" / "submitted" / "ada" / "mha"
    course.mkdir(parents=True)
    (course / "mha.py").write_text(definitions())
    environments.give_to(folder, NORMAL_UID)
    grader, project, env = grader_command(KUBERNETES)
    out = folder / "results.json"
    run = run_in(KUBERNETES, [*grader, "grade", str(submission), "--out", str(out)], project, env, folder / "home", 600)
    assert run.returncode == 2, run.stderr[-2000:]
    results = json.loads(out.read_text())
    reason = results["extra_data"]["reason"]
    assert results["extra_data"]["status"] == "cannot_grade"
    assert "no sandbox is available here" in reason and "What would fix it here" in reason
    assert "hostUsers: false" in reason and "--isolation process" in reason
    assert results["extra_data"]["machine"]["user_namespaces"].startswith("no: a user namespace refused")
    klass = run_in(
        KUBERNETES,
        [*grader, "grade-class", str(folder / "course"), "--device", "cpu"],
        project,
        env,
        folder / "home",
        600,
    )
    assert klass.returncode == 2, klass.stdout + klass.stderr
    assert "cannot grade" in klass.stdout + klass.stderr and "hostUsers: false" in klass.stdout + klass.stderr
    assert not (folder / "course" / "autograded").exists()


# -- a checkout every user can read, under a fresh uid: refuse, and say how to close it ---------------------


def test_a_world_readable_checkout_is_refused_under_a_fresh_uid_until_closed_as_the_grader_says():
    """In the Docker-like container (process isolation, a fresh uid per worker), a checkout as `git clone`
    leaves it (every file readable by every user), another user's: the worker's uid could read
    reference/mha.py, and once put the solution into a visible check's message. The grader, which closes only
    its own files itself, refuses to start (exit 2, results.json says why and the command that fixes it); with
    that command run as printed, it grades, and the submission that reads the reference's files finds each
    closed. (A checkout of the grader's own is closed by the grader: tests/test_containers.py.)"""
    project = environments.system_project()  # its virtualenv, run from a checkout of the grader beside it
    folder = environments.workspace("readable-checkout", None)
    checkout = folder / "checkout"
    for name in ("pyproject.toml", "autograder", "reference"):
        source, target = ROOT / name, checkout / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    subprocess.run(["chmod", "-R", "a+rX", str(checkout)], check=True)
    subprocess.run(["chown", "-R", f"{environments.NORMAL_UID}:{environments.NORMAL_UID}", str(checkout)], check=True)
    submission = folder / "mha.py"
    submission.write_text(with_cells(last=reference_theft(checkout)))
    docker = next(e for e in ENVIRONMENTS if e.name == "docker")
    _, _, env = grader_command(docker)
    # `python -m autograder` from the checkout's folder imports the checkout's grader and reference
    command = [str(project / ".venv" / "bin" / "python"), "-m", "autograder", "grade", str(submission)]
    command += ["--out", str(folder / "results.json"), "--device", "cpu", "--quiet"]
    refused = run_in(docker, command, checkout, env, folder / "home", timeout=600)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    results = json.loads((folder / "results.json").read_text())
    reason = results["extra_data"]["reason"]
    assert results["extra_data"]["status"] == "cannot_grade" and "could read the grader's own files" in reason
    assert f"the reference's solution ({checkout / 'reference'})" in reason
    assert f"is owned by uid {environments.NORMAL_UID}, not the grader's" in reason
    fix = reason.split("Close them to other users first: ", 1)[1]
    subprocess.run(shlex.split(fix), check=True)  # the advice, followed literally
    graded = run_in(docker, command, checkout, env, folder / "home", timeout=1200)
    assert graded.returncode == 0, graded.stdout[-2000:] + graded.stderr[-2000:]
    results = json.loads((folder / "results.json").read_text())
    assert results["extra_data"]["status"] == "graded" and results["extra_data"]["isolation"] == "process"
    assert "fresh unprivileged uid" in results["extra_data"]["sandbox"]["user"]
    output = results["output"]
    assert "THEFT SUCCEEDED" not in output, output[-2000:]
    for secret in (checkout / "reference" / "mha.py", checkout / "autograder" / "rubric.toml"):
        assert f"THEFT BLOCKED reading {secret} PermissionError" in output, output[-2000:]
    scores = part_scores(results)
    assert scores["mha"][0] == 0 and scores["quiz"] == (scores["quiz"][1], scores["quiz"][1])


# -- Gradescope's zip, as shipped, in the Docker-like container ----------------------------------------------


@pytest.fixture(scope="module")
def gradescope(tmp_path_factory) -> dict:
    """The zip from `make gradescope`, set up by its own setup.sh (as root, with Debian's python3 standing in
    for Ubuntu's; torch from pip's usual sources) and its run_autograder run in the Docker-like emulation on
    the reference's definitions. A real Gradescope image adds Ubuntu 22.04 or 24.04 (Python 3.10 or 3.12,
    checked by `make test-pythons`) and torch's CPU build from PyTorch's index."""
    from test_gradescope import unpack

    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "autograder", "gradescope", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert built.returncode == 0, built.stderr
    root = environments.workspace("gradescope", None) / "autograder"
    unpack(out / "mha-gradescope.zip", root)
    (root / "submission").mkdir()
    (root / "results").mkdir()
    (root / "submission" / "mha.py").write_text(definitions())
    env = dict(os.environ, AUTOGRADER_ROOT=str(root), PYTHON=environments.SYSTEM_PYTHON, TORCH_SPEC="torch==2.13.0")
    setup = subprocess.run(["bash", str(root / "source" / "setup.sh")], capture_output=True, text=True, env=env)
    assert setup.returncode == 0, setup.stdout[-2000:] + setup.stderr[-2000:]
    shared_files.share_identical_files(root / "venv", [environments.system_project() / ".venv"])  # 1.4 GB once
    docker = next(e for e in ENVIRONMENTS if e.name == "docker")
    env = {k: v for k, v in env.items() if not k.startswith(("PYTEST", "AUTOGRADER_ISOLATION"))}
    run = run_in(docker, [str(root / "run_autograder")], root, env, root / "home", timeout=1200)
    assert run.returncode == 0, run.stderr[-3000:]
    return {"results": json.loads((root / "results" / "results.json").read_text()), "root": root}


def test_gradescope_setup_closes_the_source_and_grades_with_a_fresh_uid(gradescope):
    results = gradescope["results"]
    assert (gradescope["root"] / "source").stat().st_mode & 0o077 == 0
    assert results["extra_data"]["status"] == "graded", results["extra_data"].get("reason")
    assert results["extra_data"]["isolation"] == "process"
    assert "fresh unprivileged uid" in results["extra_data"]["sandbox"]["user"]
    scores = part_scores(results)
    assert {p: s for p, s in scores.items() if p != "speed"} == {
        p: (t, t) for p, (_, t) in scores.items() if p != "speed"
    }


def test_gradescope_gives_the_reference_full_marks_speed_included(gradescope):
    results = gradescope["results"]
    assert results["score"] == results["max_score"] == 100, part_scores(results)
