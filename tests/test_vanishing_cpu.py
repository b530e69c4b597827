"""CPU time that could vanish from the speed part's charge, where no control group counts it: each attack of
`cpu_attacks.py` graded in the Docker-like emulation of Gradescope's container (`tools/emulate.py docker`:
root, no writable control groups, no new namespaces, so each worker is a process of a fresh uid), in one
`grade-class` run beside the honest loop over heads it is built on and the reference's own definitions.

Each must be graded as that loop is: a complete results.json, no speed points and a message saying why, and
nothing it started left running (the other parts may lose more than the loop's: the spinners slow every
check down). When the submission's own worker was what was timed, the pinned spinner once earned full speed
points and the unpinned spinners made the grading fail (a math domain error: cannot grade); now what is timed
is a graph of its forward, replayed in a trusted worker while its own worker is stopped.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass

import pytest

import cpu_attacks
import environments
from helpers import class_results, part_scores
from hostile import processes_with
from test_environments import ENVIRONMENTS, grader_command, run_in

pytestmark = [
    pytest.mark.slow,
    pytest.mark.long,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(os.geteuid() != 0, reason="the emulation runs as root (it makes namespaces, drops to users)"),
]

DOCKER = next(e for e in ENVIRONMENTS if e.name == "docker")
STUDENTS = {"reference": cpu_attacks.reference, "loop_over_heads": cpu_attacks.loop_over_heads, **cpu_attacks.ATTACKS}


@dataclass
class Graded:
    returncode: int
    output: str
    results: dict[str, dict]
    left_running: list[str]


@pytest.fixture(scope="module")
def graded() -> Graded:
    marker = f"hostile-{uuid.uuid4().hex[:12]}"
    folder = environments.workspace("vanishing-cpu", DOCKER.owner)
    course = folder / "course"
    for student, build in STUDENTS.items():
        path = course / "submitted" / student / "mha" / "mha.py"
        path.parent.mkdir(parents=True)
        path.write_text(build(marker))
    grader, project, env = grader_command(DOCKER)
    command = [*grader, "grade-class", str(course), "--device", "cpu", "--jobs", "1"]
    run = run_in(DOCKER, command, project, env, folder / "home", timeout=3000)
    time.sleep(2)  # time for anything left behind to show
    results = class_results(course, STUDENTS)
    return Graded(run.returncode, run.stdout + run.stderr, results, processes_with(marker))


def speed_of(results: dict) -> tuple[tuple[float, float], str, dict]:
    """(score, top) of the speed part, its check's message, and the speed figures."""
    message = "\n".join(t.get("output", "") for t in results["tests"] if t["tags"][0] == "speed")
    return part_scores(results)["speed"], message, results["extra_data"].get("speed") or {}


def test_every_submission_is_graded_as_a_fresh_uid_without_control_groups(graded):
    assert graded.returncode == 0, graded.output[-3000:]
    assert sorted(graded.results) == sorted(STUDENTS), graded.output[-3000:]
    for student, results in graded.results.items():
        extra = results["extra_data"]
        assert extra["status"] == "graded", (student, extra.get("reason"), extra.get("grader_errors"))
        assert extra["load"]["cells"] == [], (student, extra["load"])  # every cell ran: the attack is in place
        assert extra["isolation"] == "process" and "fresh unprivileged uid" in extra["sandbox"]["user"]
        assert extra["machine"]["control_groups"].startswith("not writable")
        timing = extra["sandbox"]["timing"]  # what results.json says the speed part's timing rests on
        assert "every process of its uid" in timing and "never ran its code" in timing, timing


@pytest.mark.parametrize("student", list(cpu_attacks.ATTACKS))
def test_an_attack_on_the_cpu_charge_is_graded_as_the_loop_it_is(graded, student):
    results, loop = graded.results[student], graded.results["loop_over_heads"]
    assert results["extra_data"]["status"] == "graded", results["extra_data"].get("grader_errors")
    (score, top), message, figures = speed_of(results)
    print(f"{student}: speed {score}/{top}, relative {figures.get('relative')}: {message[:300]}")
    assert score == 0 < top, (student, figures.get("relative"), message[:600])
    assert message.strip(), "the speed check must say why it earned nothing"
    assert sorted(part_scores(results)) == sorted(part_scores(loop))  # every check reported
    assert not graded.left_running, f"left running after grading: {graded.left_running}"


def test_the_honest_loop_earns_no_speed_points(graded):
    (score, top), message, _ = speed_of(graded.results["loop_over_heads"])
    assert score == 0 < top and "one batched pass" in message


def test_the_reference_earns_every_point(graded):
    """No false alarm: the reference's definitions, its worker a fresh uid stopped while its graph is timed,
    earn the speed points."""
    results = graded.results["reference"]
    assert results["score"] == results["max_score"] == 100, speed_of(results)[1][:600]
