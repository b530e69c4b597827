"""deploy/slurm/ on a real Slurm: a one-node cluster (slurmctld and slurmd from Debian's slurm-wlm,
installed by the test where missing) started here, the class graded as a job array plus a merge
job, compared with grading it locally."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import ROOT, course_of_samples

sys.path.insert(0, str(ROOT / "tools"))
import apt_packages  # noqa: E402
from local_slurm import LocalSlurm  # noqa: E402

SUBMIT = ROOT / "deploy" / "slurm" / "submit.sh"
DEBIAN_PACKAGES = ("slurmctld", "slurmd", "slurm-client")


def ensure_slurm_installed():
    """Install Slurm's daemons and client from Debian when missing; skip, saying why, only if that is impossible."""
    if all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "sbatch", "sinfo", "scontrol")):
        return
    if os.geteuid() != 0:
        pytest.skip("Slurm is not installed, and installing Debian's slurm-wlm packages needs root")
    why = apt_packages.install(DEBIAN_PACKAGES)
    if why:
        pytest.skip(f"Slurm is not installed, and Debian's slurm-wlm packages could not be installed: {why}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running one-node cluster (tools/local_slurm.py); yields the environment that points
    Slurm's commands at it. The daemons, and any job left over, are always stopped at the end."""
    if os.geteuid() != 0:
        pytest.skip("slurmd must run as root to start jobs, and this test is not root")
    ensure_slurm_installed()
    with LocalSlurm(tmp_path_factory.mktemp("slurm")) as env:
        yield env


def read_grades(course: Path) -> dict[str, dict]:
    with (course / "grades.csv").open(newline="") as handle:
        return {row["student"]: row for row in csv.DictReader(handle)}


def submit(env: dict, course: Path, logs: Path, **settings) -> subprocess.CompletedProcess:
    env = {
        **env,
        "COURSE": str(course),
        "LOGS": str(logs),
        "VENV": sys.prefix,
        "WAIT": "1",
        **{name: str(value) for name, value in settings.items()},
    }
    return subprocess.run(["bash", str(SUBMIT)], capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)


CLASS = {"ann": "ada", "ben": "brook", "cai": "casey", "dee": "devon"}


@pytest.mark.slow
@pytest.mark.long
def test_a_job_array_and_its_merge_grade_the_class_as_a_local_run_does(slurm, tmp_path):
    local = course_of_samples(tmp_path / "local", CLASS)
    run = subprocess.run(
        [sys.executable, "-m", "autograder", "grade-class", local, "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout + run.stderr

    cluster = course_of_samples(tmp_path / "cluster", CLASS)
    logs = tmp_path / "logs"
    # 3 shards over 4 students: one shard grades two. Each task gets 1 CPU, so two run at once.
    submitted = submit(slurm, cluster, logs, SHARDS=3, CPUS=1)
    merge_logs = sorted(logs.glob("merge-*.out"))
    assert submitted.returncode == 0, (
        submitted.stdout + submitted.stderr + "".join(p.read_text() for p in sorted(logs.glob("*.out")))
    )
    assert "device cpu" in submitted.stdout  # the partition has no GPU, so none was asked for

    task_logs = sorted(logs.glob("grade-*_*.out"))
    assert len(task_logs) == 3
    shares = sorted(
        int(share)
        for log in task_logs
        for share in re.findall(r"^shard \d+/3: (\d+) of the class's 4 students", log.read_text(), re.M)
    )
    assert shares == [1, 1, 2], [log.read_text() for log in task_logs]
    assert len(merge_logs) == 1 and "merged the results of 4 students" in merge_logs[0].read_text()

    expected, got = read_grades(local), read_grades(cluster)
    assert sorted(got) == sorted(CLASS)
    assert got == expected  # every student's score, part by part
    assert float(got["ann"]["score"]) == 100 and float(got["dee"]["score"]) == 0


@pytest.mark.slow
@pytest.mark.long
def test_when_array_tasks_fail_the_merge_still_runs_and_names_who_is_missing(slurm, tmp_path):
    course = course_of_samples(tmp_path / "course", {"ann": "ada", "ben": "brook"})
    logs = tmp_path / "logs"
    # asking for CUDA on a node without a GPU: every task fails before grading anyone
    submitted = submit(slurm, course, logs, SHARDS=2, CPUS=1, DEVICE="cuda")
    assert submitted.returncode != 0
    task_logs = sorted(logs.glob("grade-*_*.out"))
    assert len(task_logs) == 2 and all("no CUDA device" in log.read_text() for log in task_logs)
    merge_log = next(logs.glob("merge-*.out")).read_text()
    assert "cannot merge: 2 of 2 students have no up-to-date results" in merge_log
    assert "ann: not graded" in merge_log and "ben: not graded" in merge_log
    assert not (course / "grades.csv").exists()


FAKE_SINFO = """#!/bin/sh
# sinfo as a cluster with a CPU partition (the default) and a GPU partition would answer
case "$*" in
  *%P*) printf 'cpu*\\ngpu\\n' ;;
  *--partition=gpu*%G*) echo 'gpu:a100:4(S:0-1)' ;;
  *%G*) echo '(null)' ;;
esac
"""


@pytest.mark.parametrize(
    "settings, expected, unexpected",
    [
        ({}, ["--partition=cpu", "device cpu"], ["--gres"]),
        ({"PARTITION": "gpu"}, ["--partition=gpu", "--gres=gpu:1", "device cuda"], []),
        ({"PARTITION": "gpu", "GPUS": "0"}, ["device cpu"], ["--gres"]),
        ({"GPUS": "2"}, ["--gres=gpu:2", "device cuda"], []),
        ({"PARTITION": "gpu", "GRES": "gpu:h100:1", "DEVICE": "auto"}, ["--gres=gpu:h100:1", "device auto"], []),
    ],
)
def test_submit_asks_for_a_gpu_only_where_the_partition_has_one(tmp_path, settings, expected, unexpected):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sinfo").write_text(FAKE_SINFO)
    (bin_dir / "sinfo").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "DRY_RUN": "1",
        "VENV": sys.prefix,
        "LOGS": str(tmp_path / "logs"),
        **settings,
    }
    run = subprocess.run(["bash", str(SUBMIT)], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    printed = run.stdout + run.stderr
    assert "--array=0-3" in printed and "--dependency=afterany:ARRAY_JOB_ID" in printed
    for text in expected:
        assert text in printed
    for text in unexpected:
        assert text not in printed


def test_a_dry_run_needs_no_slurm(tmp_path):
    """DRY_RUN=1 prints what would be submitted on a machine without Slurm (no sinfo on the PATH)."""
    tools = tmp_path / "bin"  # the tools the script uses, and no Slurm command
    tools.mkdir()
    for name in ("dirname", "mkdir", "sed", "grep", "head", "cut"):
        (tools / name).symlink_to(shutil.which(name))
    bash = shutil.which("bash")
    env = {**os.environ, "PATH": str(tools), "DRY_RUN": "1", "VENV": sys.prefix, "LOGS": str(tmp_path / "logs")}
    run = subprocess.run([bash, str(SUBMIT)], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert "--array=0-3" in run.stderr and "--gres" not in run.stderr and "GPUS=auto is taken as 0" in run.stderr
    env.pop("DRY_RUN")
    run = subprocess.run([bash, str(SUBMIT)], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert run.returncode == 2 and "sinfo is not found" in run.stderr


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"SHARDS": "0"}, "SHARDS must be a whole number of at least 1"),
        ({"GPUS": "many", "PARTITION": "x"}, "GPUS must be auto or a whole number"),
        ({"VENV": "/nonexistent"}, "run 'make setup' first"),
        ({"COURSE": "/nonexistent"}, "has no submitted/ folder"),
    ],
)
def test_submit_refuses_bad_settings_before_submitting_anything(settings, message):
    env = {**os.environ, "DRY_RUN": "1", "VENV": sys.prefix, **settings}
    run = subprocess.run(["bash", str(SUBMIT)], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert run.returncode == 2 and message in run.stderr
