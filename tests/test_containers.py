"""Real containers: Gradescope's recipe and the Kubernetes image, run in a Docker daemon of the tests' own.

The environment matrix (tests/test_environments.py) emulates these places on the machine itself; here they
are real: Debian's docker.io (runc, Docker's default seccomp profile and capabilities, the host's control
groups read-only), images made from a debootstrap'd Debian 12 (tests/docker_env.py). What runs, three
containers at a time, once the images are built:

| container | what it shows |
| --- | --- |
| Gradescope's image (`make gradescope`'s zip, setup.sh run unmodified), `--memory 768m --cpus 0.5`, one fresh container per submission | the sample class graded within Gradescope's default memory (the figures are printed); ada (the reference's twin) 100 with every speed point, brook's loop over heads none; hostile submissions gain nothing and leave nothing running |
| the Kubernetes image, as uid 1000 (`--user 1000`, as `runAsUser: 1000`), Docker's defaults | `doctor` and `grade` refuse (exit 2, results.json saying why and what to change); `grade-class` refuses and the course folder is left as it was; with `--isolation process` the class is graded right and `extra_data.machine` says so |
| either image, with exactly the `docker run` options the grader's advice names | the advice followed literally: doctor then says `namespace`, and a grading runs in it |
| Debian 12 with git, make and bubblewrap, as root with Docker's defaults: the project cloned with `git clone`, `make setup` and `make grade` | the grader closes its own files itself (`.venv` inside the checkout kept) and grades the sample class right; the same checkout given to another user, then mounted read-only, is refused, and the command it names, run as written, lets ada be graded 100 |

A machine where the daemon cannot start skips these tests, saying why (`.ci/run` repeats it at its end).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import docker_env
from docker_env import Daemon, Ran, checked
from helpers import ROOT, SAMPLES, part_scores
from hostile import BACKGROUND_BURNER, BROKEN_MHA_FORWARD, escape_attempts, reference_theft, with_cells

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(5400)]

SKIPPED = "real containers not tested"  # what .ci/run looks for in the skip summary
# Containers at once: two of Gradescope's (half a CPU each: with more, a container's share of a busy machine
# falls below what starting Python and torch in the grader and three workers within the rubric's 60 s takes),
# beside one of the Kubernetes image's.
GRADESCOPE_AT_ONCE = 2
GRADER_UID = "1000"  # the Kubernetes image's grader as a normal user: `runAsUser: 1000` alone (docs/clusters.md)
GRADESCOPE_SOURCE = Path("/autograder/source")
SAMPLE_STUDENTS = sorted(p.name for p in SAMPLES.iterdir() if p.is_dir())

# Around run_autograder in each Gradescope container, written to /autograder/results/container: the container's
# memory sampled every 0.2 s, what the kernel can never take back (anonymous memory: the processes' own, as
# no swap is there) and that with the files they map (torch's libraries: the kernel may drop those pages,
# but they are read back at once), the peak the kernel saw (page cache included), its OOM kills, and every
# process left once run_autograder has returned.
AROUND_RUN_AUTOGRADER = r"""
out=/autograder/results/container
mkdir -p $out
mem=/sys/fs/cgroup/memory anon_keys=" total_rss total_shmem " mapped_key=total_mapped_file  # cgroup v1
[ -e $mem/memory.stat ] || mem=/sys/fs/cgroup anon_keys=" anon shmem " mapped_key=file_mapped  # v2
sample() {
  local anon_peak=0 mapped_peak=0 anon mapped key value
  while :; do
    anon=0 mapped=0
    while read -r key value; do
      [[ $anon_keys == *" $key "* ]] && anon=$(( anon + value ))
      [[ $key == "$mapped_key" ]] && mapped=$value
    done < $mem/memory.stat
    if (( anon > anon_peak )); then anon_peak=$anon; echo $anon_peak > $out/anon_peak; fi
    if (( anon + mapped > mapped_peak )); then mapped_peak=$(( anon + mapped )); echo $mapped_peak > $out/mapped_peak; fi
    sleep 0.2
  done
}
sample & sampler=$!
/autograder/run_autograder > $out/run_autograder.log 2>&1
echo $? > $out/exit_status
kill $sampler; wait $sampler 2>/dev/null
sleep 3
cat $mem/memory.max_usage_in_bytes $mem/memory.peak > $out/memory_max_usage 2>/dev/null
grep -h oom_kill $mem/memory.oom_control $mem/memory.events > $out/oom 2>/dev/null
/autograder/venv/bin/python -I -c '
import json, os
found = []
for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())):
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        command = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        continue
    found.append({"pid": int(pid), "state": state, "command": command[:300]})
print(json.dumps(found))
' > $out/left_running.json
"""


# In a container with the sandbox's `docker run` options but no bubblewrap: the doctor's advice, and the
# command it names run as it is written, then the doctor again.
FOLLOW_INSTALL_ADVICE = r"""
import json, re, subprocess, sys
doctor = [sys.executable, "-m", "autograder", "doctor", "--no-speed", "--json"]
before = json.loads(subprocess.run(doctor, capture_output=True, text=True).stdout)
command = re.search(r"`(apt-get install [^`]*)`", before["advice"])
done = subprocess.run(command.group(1), shell=True, stdin=subprocess.DEVNULL, capture_output=True, text=True) if command else None
after = json.loads(subprocess.run(doctor, capture_output=True, text=True).stdout)
print(json.dumps({
    "before": before["machine"]["isolation"], "advice": before["advice"], "ran": command and command.group(1),
    "exit_status": done and done.returncode, "after": after["machine"]["isolation"],
}))
"""


@dataclass
class Submission:
    source: Callable[[], tuple[str, str]]  # () -> (file name, text)
    lost: set[str] = field(default_factory=set)  # parts it must not earn in full; the others keep ada's marks


def sample(student: str) -> Callable[[], tuple[str, str]]:
    def read() -> tuple[str, str]:
        path = next((SAMPLES / student / "mha").iterdir())
        return path.name, path.read_text()

    return read


HOSTILE = {
    # a process and a thread burning the CPU, left behind if the grader let them; they run only in its own
    # requests, and what is timed is its forward's graph, replayed where they are not: they earn nothing
    "background_burner": Submission(
        lambda: ("mha.py", with_cells(last=BACKGROUND_BURNER.replace("{marker}", "hostile-burner")))
    ),
    # fake results and a conftest.py wherever it can write, then a broken forward
    "fake_results": Submission(
        lambda: (
            "mha.py",
            with_cells(
                first=escape_attempts(
                    [Path("/autograder/results/results.json")],
                    [Path("/autograder"), Path("/autograder/results"), GRADESCOPE_SOURCE],
                    parents=True,
                ),
                last=BROKEN_MHA_FORWARD,
            ),
        ),
        {"mha", "speed"},
    ),
    # imports or reads the reference and the rubric from the grader's source
    "reference_theft": Submission(
        lambda: ("mha.py", with_cells(last=reference_theft(GRADESCOPE_SOURCE))), {"mha", "speed"}
    ),
}


@pytest.fixture(scope="module")
def daemon():
    started = Daemon().start()
    if started.unavailable:
        pytest.skip(f"{SKIPPED}: {started.unavailable}")
    yield started
    started.stop()


@dataclass
class Images:
    gradescope: str
    kubernetes: str
    seconds: float


@pytest.fixture(scope="module")
def images(daemon, tmp_path_factory) -> Images:
    """Gradescope's image from the zip `make gradescope` builds, and the Kubernetes image, built side by side."""
    started = time.monotonic()
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "autograder", "gradescope", "--out", str(out)],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    docker_env.base_image(daemon)
    docker_env.wheelhouse()
    with ThreadPoolExecutor(2) as pool:
        gradescope = pool.submit(docker_env.gradescope_image, daemon, out / "mha-gradescope.zip")
        kubernetes = pool.submit(docker_env.kubernetes_image, daemon)
        built = Images(gradescope.result(), kubernetes.result(), 0.0)
    built.seconds = time.monotonic() - started
    print(f"\nimages ready in {built.seconds:.0f} s: {built.gradescope}, {built.kubernetes}")
    return built


# -- running containers ------------------------------------------------------------------------------------


def docker_run(
    daemon: Daemon, folder: Path, options: list[str], image: str, command: list[str], timeout: float = 1500
) -> Ran:
    """`docker run --rm OPTIONS IMAGE COMMAND`, its output kept in `folder`."""
    name = f"mha-tests-{uuid.uuid4().hex[:12]}"
    try:
        done = daemon.docker("run", "--rm", "--name", name, *options, image, *command, timeout=timeout)
    except subprocess.TimeoutExpired:
        daemon.docker("kill", name, timeout=120)
        return Ran(124, f"timed out after {timeout} s", folder)
    (folder / "docker-run.log").write_text(done.stdout + done.stderr)
    return Ran(done.returncode, done.stdout + done.stderr, folder, done.stdout)


def gradescope_submission(daemon: Daemon, image: str, folder: Path, name: str, text: str, extra: list[str]) -> Ran:
    """One submission in a fresh container of Gradescope's image, as Gradescope runs it: the file in
    /autograder/submission, /autograder/run_autograder, Gradescope's default memory and CPUs."""
    (folder / "submission").mkdir(parents=True)
    (folder / "results").mkdir()
    (folder / "submission" / name).write_text(text)
    options = ["--memory", docker_env.GRADESCOPE_MEMORY, "--cpus", docker_env.GRADESCOPE_CPUS, *extra]
    options += [
        "-v",
        f"{folder / 'submission'}:/autograder/submission",
        "-v",
        f"{folder / 'results'}:/autograder/results",
    ]
    return docker_run(daemon, folder / "results", options, image, ["bash", "-c", AROUND_RUN_AUTOGRADER])


def gradescope_doctor(daemon: Daemon, image: str, folder: Path, extra: list[str]) -> Ran:
    folder.mkdir(parents=True)
    command = "cd /autograder/source && PYTHONPATH=/autograder/source /autograder/venv/bin/python -m autograder"
    return docker_run(daemon, folder, extra, image, ["bash", "-c", f"{command} doctor --no-speed --json"])


KUBERNETES_PYTHON = [".venv/bin/python", "-m", "autograder"]  # the manifests' command, in workingDir /opt/mha-exercise


def kubernetes(daemon: Daemon, image: str, folder: Path, extra: list[str], *arguments: str) -> Ran:
    """The Kubernetes image as uid 1000 (its group, 1000, from the image's own user), /course and /out mounted
    from `folder`."""
    options = ["--user", GRADER_UID, "-v", f"{folder / 'course'}:/course", "-v", f"{folder / 'out'}:/out", *extra]
    return docker_run(daemon, folder / "out", options, image, [*KUBERNETES_PYTHON, *arguments])


def advised_options(advice: str) -> list[str]:
    """The `docker run` options the advice names, exactly as it names them."""
    found = re.search(r"`docker run ([^`]+)`", advice)
    assert found, f"the advice names no `docker run` options: {advice!r}"
    return shlex.split(found.group(1))


def course_folder(folder: Path, students: list[str], owner: int = 1000) -> Path:
    """A course with the sample class's `students`, owned by `owner` (the pod's user), open to others as a
    fresh checkout is."""
    course = folder / "course"
    for student in students:
        shutil.copytree(SAMPLES / student, course / "submitted" / student)
    (folder / "out").mkdir(parents=True, exist_ok=True)
    subprocess.run(["chown", "-R", f"{owner}:{owner}", str(folder)], check=True)
    subprocess.run(["chmod", "-R", "u+rwX,go+rX", str(folder)], check=True)
    return course


def snapshot(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under `folder` (itself included) with its mode, owner and modification time."""
    found = {}
    for path in [folder, *sorted(folder.rglob("*"))]:
        info = path.lstat()
        found[str(path.relative_to(folder))] = (stat.S_IMODE(info.st_mode), info.st_uid, info.st_mtime_ns)
    return found


@dataclass
class Runs:
    gradescope: dict[str, Ran]
    doctor: dict[str, Ran]  # gradescope/kubernetes, as shipped and with the advice followed
    kubernetes: dict[str, Ran]
    course_before: dict[str, tuple[int, int, int]]
    course_after_refusal: dict[str, tuple[int, int, int]]
    advice: dict[str, list[str]]
    seconds: float
    again: list[str] = field(default_factory=list)  # what could not grade the first time, graded once more


@pytest.fixture(scope="module")
def runs(daemon, images) -> Runs:
    """Every container, three at a time: each submission in Gradescope's, the Kubernetes image's refusals and
    its gradings, and both with the advice followed."""
    started = time.monotonic()
    work = docker_env.CACHE / "runs"  # beside the daemon's data: mounted into containers, kept to be read after
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(mode=0o755)
    submissions = {s: Submission(sample(s)) for s in SAMPLE_STUDENTS} | HOSTILE
    kube = work / "kubernetes"
    course_folder(kube, ["ada", "brook"])
    refusing = work / "kubernetes-refusal"
    refused_course = course_folder(refusing, ["ada"])
    before = snapshot(refused_course)
    advised = work / "kubernetes-advised"
    course_folder(advised, ["ada"])
    advice: dict[str, list[str]] = {}

    def gradescope_job(student: str, folder: str = "gradescope", extra: tuple[str, ...] = ()) -> Ran:
        name, text = submissions[student].source()
        return gradescope_submission(daemon, images.gradescope, work / folder / student, name, text, list(extra))

    def gradescope_advised() -> tuple[Ran, Ran, Ran, Ran]:
        shipped = gradescope_doctor(daemon, images.gradescope, work / "gradescope-doctor", [])
        advice["gradescope"] = advised_options(shipped.findings()["advice"])
        followed = gradescope_doctor(
            daemon, images.gradescope, work / "gradescope-doctor-advised", advice["gradescope"]
        )
        graded = gradescope_job("ada", "gradescope-advised", tuple(advice["gradescope"]))
        (work / "gradescope-no-bubblewrap").mkdir()
        script = "cd /autograder/source && apt-get remove -y -qq bubblewrap > /dev/null && PYTHONPATH=. "
        script += f"/autograder/venv/bin/python -c {shlex.quote(FOLLOW_INSTALL_ADVICE)}"
        installed = docker_run(  # apt-get needs a network: the host's (the tests' daemon makes none)
            daemon,
            work / "gradescope-no-bubblewrap",
            [*advice["gradescope"], *docker_env.HOST_NETWORK],
            images.gradescope,
            ["bash", "-c", script],
        )
        return shipped, followed, graded, installed

    def kubernetes_refusals() -> tuple[Ran, Ran, Ran]:
        doctor = kubernetes(daemon, images.kubernetes, refusing, [], "doctor", "--no-speed", "--json")
        grade = kubernetes(
            daemon, images.kubernetes, refusing, [], "grade", "/course/submitted/ada/mha/mha.ipynb", "--out",
            "/out/results.json",
        )  # fmt: skip
        klass = kubernetes(daemon, images.kubernetes, refusing, [], "grade-class", "/course", "--device", "cpu")
        return doctor, grade, klass

    klass_arguments = (
        daemon, images.kubernetes, kube, [], "grade-class", "/course", "--device", "cpu", "--jobs", "1",
        "--isolation", "process",
    )  # fmt: skip

    def kubernetes_advised_grade() -> Ran:
        return kubernetes(
            daemon, images.kubernetes, advised, advice["kubernetes"], "grade",
            "/course/submitted/ada/mha/mha.ipynb", "--out", "/out/results.json", "--device", "cpu",
        )  # fmt: skip

    def kubernetes_advised() -> tuple[Ran, Ran]:
        shipped = kubernetes(daemon, images.kubernetes, advised, [], "doctor", "--no-speed", "--json")
        advice["kubernetes"] = advised_options(shipped.findings()["advice"])
        followed = kubernetes(
            daemon, images.kubernetes, advised, advice["kubernetes"], "doctor", "--no-speed", "--json"
        )
        return followed, kubernetes_advised_grade()

    with ThreadPoolExecutor(GRADESCOPE_AT_ONCE) as pool, ThreadPoolExecutor(1) as others:
        refusals = others.submit(kubernetes_refusals)
        process = others.submit(kubernetes, *klass_arguments)
        kubernetes_advice = others.submit(kubernetes_advised)
        graded = {student: pool.submit(gradescope_job, student) for student in submissions}
        gradescope_advice = pool.submit(gradescope_advised)
        doctor, grade, klass = refusals.result()
        gradescope_shipped, gradescope_followed, gradescope_namespace, installed = gradescope_advice.result()
        kubernetes_followed, kubernetes_namespace = kubernetes_advice.result()
        result = Runs(
            gradescope={student: job.result() for student, job in graded.items()}
            | {"ada, advice followed": gradescope_namespace},
            doctor={
                "gradescope": gradescope_shipped,
                "gradescope, advice followed": gradescope_followed,
                "kubernetes": doctor,
                "kubernetes, advice followed": kubernetes_followed,
                "gradescope, no bubblewrap, advice followed": installed,
            },
            kubernetes={
                "grade": grade,
                "grade-class": klass,
                "grade-class --isolation process": process.result(),
                "grade, advice followed": kubernetes_namespace,
            },
            course_before=before,
            course_after_refusal=snapshot(refused_course),
            advice=advice,
            seconds=0.0,
        )
    # What could not grade (the grader's fault: a worker that could not start Python and torch within the
    # rubric's limit on a machine this busy) is graded once more, alone, as grade-class and Gradescope's
    # regrade do; what it then says is what the tests check.
    for key, ran in list(result.gradescope.items()):
        if could_not_grade(ran, "results.json"):
            student = key.split(",")[0]
            again = (
                ("gradescope-advised-again", tuple(advice["gradescope"]))
                if student != key
                else ("gradescope-again", ())
            )
            result.gradescope[key] = gradescope_job(student, *again)
            result.again.append(key)
    klass = result.kubernetes["grade-class --isolation process"]
    if any(could_not_grade_path(path) for path in (kube / "course" / "autograded").glob("*/mha/results.json")):
        result.kubernetes["grade-class --isolation process"] = kubernetes(*klass_arguments)  # grades only those
        result.again.append("grade-class --isolation process")
    if could_not_grade(result.kubernetes["grade, advice followed"], "results.json"):
        result.kubernetes["grade, advice followed"] = kubernetes_advised_grade()
        result.again.append("grade, advice followed")
    result.seconds = time.monotonic() - started
    print(
        f"\ncontainers ran in {result.seconds:.0f} s ({GRADESCOPE_AT_ONCE + 1} at a time); graded again: {result.again}"
    )
    return result


def could_not_grade(ran: Ran, results: str) -> bool:
    return could_not_grade_path(ran.folder / results)


def could_not_grade_path(path: Path) -> bool:
    try:
        return json.loads(path.read_text())["extra_data"]["status"] == "cannot_grade"
    except (OSError, ValueError, KeyError):
        return False


def gradescope_results(ran: Ran) -> dict:
    assert ran.returncode == 0, ran.output[-3000:]
    assert ran.text("container/exit_status").strip() == "0", ran.text("container/run_autograder.log")[-3000:]
    return ran.json("results.json")


def memory_figures(ran: Ran) -> dict[str, int]:
    def mib(name: str) -> int:
        return int((ran.text(f"container/{name}").split() or ["0"])[0]) >> 20

    oom = ran.text("container/oom").split()
    return {
        "anonymous_peak_mib": mib("anon_peak"),
        "with_mapped_files_peak_mib": mib("mapped_peak"),
        "kernel_peak_mib": mib("memory_max_usage"),  # page cache included, which the kernel reclaims at the limit
        "oom_kills": int(oom[oom.index("oom_kill") + 1]) if "oom_kill" in oom else -1,
    }


# -- Gradescope ---------------------------------------------------------------------------------------------


def test_setup_sh_installs_the_cpu_build_and_says_so(images):
    said = (docker_env.CACHE / "gradescope-setup.log").read_text()
    assert re.search(r"setup\.sh: installed torch 2\.13\.0\+cpu, the CPU build", said), said[-2000:]


@pytest.mark.parametrize("student", SAMPLE_STUDENTS)
def test_the_sample_class_is_graded_within_gradescopes_default_memory(runs, student):
    ran = runs.gradescope[student]
    results = gradescope_results(ran)
    figures = memory_figures(ran)
    print(f"\n{student}: score {results['score']}, memory {figures} (limit {docker_env.GRADESCOPE_MEMORY})")
    assert results["extra_data"]["status"] == "graded", results["extra_data"].get("reason")
    assert figures["oom_kills"] == 0, figures
    assert 0 < figures["anonymous_peak_mib"] <= figures["with_mapped_files_peak_mib"] < 768, figures
    assert results["extra_data"]["isolation"] == "process"
    assert "fresh unprivileged uid" in results["extra_data"]["sandbox"]["user"]
    assert results["extra_data"]["machine"]["control_groups"].startswith("not writable")


def test_the_reference_twin_earns_everything_speed_included(runs):
    results = gradescope_results(runs.gradescope["ada"])
    assert results["score"] == results["max_score"] == 100, part_scores(results)
    speed = part_scores(results)["speed"]
    assert speed[0] == speed[1] > 0


def test_a_loop_over_heads_earns_no_speed_points(runs):
    results = gradescope_results(runs.gradescope["brook"])
    score, top = part_scores(results)["speed"]
    assert score == 0 < top


@pytest.mark.parametrize("student", sorted(HOSTILE))
def test_a_hostile_submission_gains_nothing_and_leaves_nothing_running(runs, student):
    ran = runs.gradescope[student]
    results = gradescope_results(ran)
    reference = part_scores(gradescope_results(runs.gradescope["ada"]))
    assert results["extra_data"]["status"] == "graded"
    assert results["output"] != "hacked" and results["score"] <= results["max_score"] == 100
    for part, (score, top) in part_scores(results).items():
        if part in HOSTILE[student].lost:
            assert score < top, (student, part)
        elif part != "speed":
            assert (score, top) == reference[part], (student, part)
    if student == "reference_theft":
        assert "THEFT BLOCKED" in results["output"], results["output"][-2000:]  # it did try
        assert "THEFT SUCCEEDED" not in results["output"]
    left = [p for p in ran.json("container/left_running.json") if p["state"] != "Z"]
    assert not left, f"left running after run_autograder: {left}"


# -- the Kubernetes image as a normal user -------------------------------------------------------------------


def test_the_kubernetes_image_refuses_as_a_normal_user_and_says_what_to_change(runs):
    doctor = runs.doctor["kubernetes"]
    assert doctor.returncode == 2, doctor.output[-3000:]
    findings = doctor.findings()
    assert findings["machine"]["isolation"] is None
    assert "No module named" not in doctor.output
    grade = runs.kubernetes["grade"]
    assert grade.returncode == 2, grade.output[-3000:]
    results = grade.json("results.json")
    reason = results["extra_data"]["reason"]
    assert results["extra_data"]["status"] == "cannot_grade"
    assert "no sandbox is available here" in reason and "What would fix it here" in reason
    assert "docker run --security-opt seccomp=unconfined" in reason and "--isolation process" in reason
    assert "Install bubblewrap" not in reason and ">., " not in reason  # bubblewrap is installed; whole sentences


def test_the_kubernetes_image_holds_its_virtualenv_once(daemon, images):
    """The image is its Python base, the virtualenv (torch: 1 GB of it) and the grader's small files: a
    change of mode to a file of an earlier layer would copy it into a later one (the image was 3 GB, torch
    twice)."""
    size = int(checked(daemon.docker("image", "inspect", "--format", "{{.Size}}", images.kubernetes), "inspect").stdout)
    base = int(
        checked(
            daemon.docker("image", "inspect", "--format", "{{.Size}}", docker_env.python_image(daemon)), "inspect"
        ).stdout
    )
    du = daemon.docker("run", "--rm", "--network", "none", images.kubernetes, "du", "-sb", "/opt/mha-exercise/.venv")
    venv = int(checked(du, "du").stdout.split()[0])
    assert venv > 500 * 2**20  # torch is in it
    assert size - base < 1.25 * venv, f"image {size >> 20} MB: base {base >> 20} MB, virtualenv {venv >> 20} MB"


def test_grade_class_refuses_before_it_changes_anything_in_the_course(runs):
    klass = runs.kubernetes["grade-class"]
    assert klass.returncode == 2, klass.output[-3000:]
    said = " ".join(klass.output.split())  # as the terminal wraps it
    assert "cannot grade" in said and "--isolation process" in said and "docker run --security-opt" in said
    assert runs.course_after_refusal == runs.course_before


def test_the_kubernetes_image_grades_with_process_isolation_as_a_normal_user(runs):
    done = runs.kubernetes["grade-class --isolation process"]
    assert done.returncode == 0, done.output[-3000:]
    course = done.folder.parent / "course"
    ada = json.loads((course / "autograded" / "ada" / "mha" / "results.json").read_text())
    brook = json.loads((course / "autograded" / "brook" / "mha" / "results.json").read_text())
    assert ada["score"] == ada["max_score"] == 100, part_scores(ada)
    assert part_scores(brook)["speed"][0] == 0
    for results in (ada, brook):
        extra = results["extra_data"]
        assert extra["isolation"] == "process"
        assert extra["machine"]["isolation"].startswith("process (asked for")
        assert "grader's own user" in extra["machine"]["guarantee_isolation"]
        assert "grader's own user" in extra["sandbox"]["user"]


# -- the advice, followed literally -------------------------------------------------------------------------


def test_gradescopes_container_follows_its_advice_into_the_namespace_sandbox(runs):
    shipped = runs.doctor["gradescope"].findings()
    assert shipped["machine"]["isolation"] == "process"
    assert runs.advice["gradescope"] == [
        "--security-opt",
        "seccomp=unconfined",
        "--cap-add",
        "SYS_ADMIN",
        "--cap-add",
        "NET_ADMIN",
    ]
    followed = runs.doctor["gradescope, advice followed"]
    assert followed.returncode == 0, followed.output[-3000:]
    assert followed.findings()["machine"]["isolation"] == "namespace"
    results = gradescope_results(runs.gradescope["ada, advice followed"])
    assert results["extra_data"]["isolation"] == "namespace"
    assert results["score"] == results["max_score"] == 100, part_scores(results)


def test_a_normal_users_container_follows_its_advice_into_the_namespace_sandbox(runs):
    assert runs.advice["kubernetes"] == [
        "--security-opt",
        "seccomp=unconfined",
        "--security-opt",
        "systempaths=unconfined",
    ]
    followed = runs.doctor["kubernetes, advice followed"]
    assert followed.returncode == 0, followed.output[-3000:]
    assert followed.findings()["machine"]["isolation"] == "namespace"
    graded = runs.kubernetes["grade, advice followed"]
    assert graded.returncode == 0, graded.output[-3000:]
    results = graded.json("results.json")
    assert results["extra_data"]["isolation"] == "namespace"
    assert results["score"] == results["max_score"] == 100, part_scores(results)


def test_without_bubblewrap_the_advice_installs_it_and_the_sandbox_follows(runs):
    """In a container with the sandbox's options but no bubblewrap, the advice names the command that
    installs it; run as it is written, the doctor then says `namespace`."""
    ran = runs.doctor["gradescope, no bubblewrap, advice followed"]
    assert ran.returncode == 0, ran.output[-3000:]
    found = ran.findings()
    assert found["before"] == "process" and found["ran"] == "apt-get install -y bubblewrap", found
    assert found["exit_status"] == 0 and found["after"] == "namespace", found


# -- a newcomer's container: a fresh clone, as root, `make grade` ---------------------------------------------

CHECKOUT = "/opt/mha-exercise"  # where the clone lives in its containers (a virtualenv's paths are absolute)
CLONE_SETTINGS = {**docker_env.PIP_SETTINGS, "TORCH_SPEC": docker_env.TORCH_CPU}  # make's, from the wheelhouse
# In a container as root with Docker's defaults: the README's commands in a fresh clone, its .venv inside it.
CLONE_AND_GRADE = rf"""
git clone -q /source {CHECKOUT} && cd {CHECKOUT} || exit 3
make setup > /out/setup.log 2>&1 || {{ tail -30 /out/setup.log; exit 4; }}
make grade DEVICE=cpu > /out/grade.log 2>&1
echo $? > /out/grade.status
stat -c '%a %n' . .venv .venv/bin .venv/bin/python .venv/lib reference autograder .git assignments README.md > /out/modes
"""
# `make grade-one` on ada; where it refuses, the command its results.json names run as written, and again.
FOLLOW_CLOSING_ADVICE = r"""
import json, shlex, subprocess, sys
grade = ["make", "--no-print-directory", "grade-one", "SUBMISSION=assignments/submitted/ada/mha/mha.ipynb",
         "OUT=/out/results.json", "DEVICE=cpu"]
klass = subprocess.run(["make", "--no-print-directory", "grade", "DEVICE=cpu", "FORCE=1"], capture_output=True, text=True)
first = subprocess.run(grade, capture_output=True, text=True)
reason = json.load(open("/out/results.json"))["extra_data"].get("reason", "")
command = reason.split("Close them to other users first: ", 1)[-1] if "first: " in reason else ""
followed = subprocess.run(shlex.split(command), capture_output=True, text=True) if command else None
again = subprocess.run(grade, capture_output=True, text=True)
print(json.dumps({
    "class_status": klass.returncode, "class_said": klass.stdout + klass.stderr, "status": first.returncode,
    "reason": reason, "command": command, "followed": followed and followed.returncode, "again": again.returncode,
    "said": again.stderr[-3000:], "results": json.load(open("/out/results.json")),
}))
"""
GRADE_ADA = ["make", "--no-print-directory", "grade-one", "SUBMISSION=assignments/submitted/ada/mha/mha.ipynb"]
GRADE_ADA += ["OUT=/out/results.json", "DEVICE=cpu"]


@dataclass
class CloneRuns:
    clone: Path  # the checkout on the host, mounted at CHECKOUT in each container
    graded: Ran  # `make setup` and `make grade` in a fresh clone
    another_users: Ran  # FOLLOW_CLOSING_ADVICE with the checkout given to uid 1000
    read_only: Ran  # grade-one with the checkout mounted read-only
    read_only_command: str  # the command that refusal named
    read_only_again: Ran  # the same once the command ran where the checkout is writable


def in_clone(daemon: Daemon, work: Path, name: str, command: list[str], mount: str = "") -> Ran:
    """`command` as root with Docker's defaults, the clone at CHECKOUT (`mount`: ":ro" read-only) and its working
    folder, the source repository at /source, the output in work/name (at /out)."""
    out = work / name
    out.mkdir(parents=True)
    options = ["-v", f"{work / 'clone'}:{CHECKOUT}{mount}", "-v", f"{out}:/out", "-w", CHECKOUT]
    options += ["-v", f"{docker_env.wheelhouse()}:/wheelhouse:ro", "-v", f"{work / 'source'}:/source:ro"]
    for key, value in CLONE_SETTINGS.items():
        options += ["-e", f"{key}={value}"]
    return docker_run(daemon, out, options, docker_env.clone_image(daemon), command)


def reopened(clone: Path, owner: str) -> None:
    """The checkout as git made it again (every user may read it), owned by `owner`."""
    subprocess.run(["chown", "-R", owner, str(clone)], check=True)
    subprocess.run(["chmod", "-R", "o+rX", str(clone)], check=True)


@pytest.fixture(scope="module")
def clone_runs(daemon) -> CloneRuns:
    """A fresh clone graded as root; then the same checkout given to another user, then mounted read-only."""
    work = docker_env.CACHE / "clone-runs"
    if work.exists():
        shutil.rmtree(work)
    (work / "clone").mkdir(parents=True)
    (work / "clone").chmod(0o755)  # as `git clone` makes it
    docker_env.source_repository(work / "source")
    graded = in_clone(daemon, work, "graded", ["bash", "-c", CLONE_AND_GRADE])
    reopened(work / "clone", "1000:1000")
    python = f"{CHECKOUT}/.venv/bin/python"
    another = in_clone(daemon, work, "another-user", [python, "-c", FOLLOW_CLOSING_ADVICE])
    reopened(work / "clone", "0:0")
    read_only = in_clone(daemon, work, "read-only", GRADE_ADA, ":ro")
    reason = read_only.json("results.json")["extra_data"].get("reason", "") if read_only.text("results.json") else ""
    command = reason.split("in its top folder: ", 1)[-1] if "in its top folder: " in reason else ""
    if command:  # the advice, followed literally where the checkout is writable: here, in its top folder
        subprocess.run(shlex.split(command), cwd=work / "clone", check=True)
    again = in_clone(daemon, work, "read-only-again", GRADE_ADA, ":ro")
    return CloneRuns(work / "clone", graded, another, read_only, command, again)


def grades(clone: Path) -> dict[str, dict[str, str]]:
    import csv

    with open(clone / "assignments" / "grades.csv", newline="") as handle:
        return {row["student"]: row for row in csv.DictReader(handle)}


def test_a_fresh_clone_as_root_closes_its_own_files_and_grades_the_sample_class(clone_runs):
    """Root in a container with Docker's defaults (process isolation, a fresh uid per worker), the README's
    `make grade` in a fresh clone with its .venv inside: the grader closes its own files itself, says which,
    keeps the virtualenv and the way to it open, and grades the sample class right."""
    ran = clone_runs.graded
    assert ran.returncode == 0, ran.output[-3000:]
    said = " ".join(ran.text("grade.log").split())
    assert ran.text("grade.status").strip() == "0", said[-3000:]
    kept = "closed the grader's own files to other users (chmod o-rwx), the virtualenv kept: "
    assert kept in said, said[:3000]
    closed = said.split(kept, 1)[1].split(": each worker runs as a fresh uid", 1)[0].split(", ")
    assert {f"{CHECKOUT}/{name}" for name in ("reference", "autograder", ".git", "assignments")} <= set(closed)
    assert not any(path.startswith(f"{CHECKOUT}/.venv") for path in closed), closed
    modes = dict(reversed(line.split(" ", 1)) for line in ran.text("modes").splitlines())
    for closed in ("reference", "autograder", ".git", "assignments", "README.md"):
        assert int(modes[closed], 8) & 0o007 == 0, (closed, modes)
    for kept in (".", ".venv", ".venv/bin", ".venv/lib"):
        assert int(modes[kept], 8) & 0o005 == 0o005, (kept, modes)
    graded = grades(clone_runs.clone)
    assert sorted(graded) == SAMPLE_STUDENTS and {row["status"] for row in graded.values()} == {"graded"}, graded
    assert float(graded["ada"]["score"]) == float(graded["ada"]["max_score"]) == 100, graded["ada"]
    assert float(graded["brook"]["speed"]) == 0 < float(graded["brook"]["score"]), graded["brook"]
    ada = json.loads((clone_runs.clone / "assignments" / "results" / "ada" / "mha" / "results.json").read_text())
    assert ada["extra_data"]["isolation"] == "process"
    assert "fresh unprivileged uid" in ada["extra_data"]["sandbox"]["user"]


def test_another_users_checkout_is_refused_and_its_advice_followed_literally_grades_it(clone_runs):
    ran = clone_runs.another_users
    assert ran.returncode == 0, ran.output[-3000:]
    found = ran.findings()
    said = " ".join(found["class_said"].split())
    assert found["class_status"] == 2 and "owned by uid 1000, not the grader's" in said, said[-3000:]
    assert found["status"] == 2 and "owned by uid 1000, not the grader's" in found["reason"], found["reason"]
    assert "as root" not in found["reason"] and f"{CHECKOUT}/.venv" not in found["command"]
    assert found["command"].startswith("chmod o-rwx ") and found["followed"] == 0, found
    results = found["results"]
    assert found["again"] == 0 and results["extra_data"]["status"] == "graded", found["said"]
    assert results["score"] == results["max_score"] == 100 and results["extra_data"]["isolation"] == "process"


def test_a_read_only_checkout_is_refused_and_its_advice_followed_where_it_is_writable_grades_it(clone_runs):
    refused = clone_runs.read_only
    assert refused.returncode == 2, refused.output[-3000:]
    reason = refused.json("results.json")["extra_data"]["reason"]
    assert "on a read-only file system" in reason and "as root" not in reason, reason
    assert clone_runs.read_only_command.startswith("chmod o-rwx ") and ".venv" not in clone_runs.read_only_command
    again = clone_runs.read_only_again
    assert again.returncode == 0, again.output[-3000:]
    results = again.json("results.json")
    assert results["extra_data"]["status"] == "graded" and results["score"] == results["max_score"] == 100
