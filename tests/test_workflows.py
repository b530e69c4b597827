"""The GitHub workflows: actionlint finds nothing wrong in them, and the sharded grading workflow's
own commands, read from its YAML, grade a class here shard by shard and merge the artifacts."""

from __future__ import annotations

import csv
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, course_of_samples

WORKFLOWS = ROOT / ".github" / "workflows"
GRADE_CLASS = WORKFLOWS / "grade-class.yml"
ACTIONLINT = Path(sys.executable).with_name("actionlint")


def actionlint(*paths) -> subprocess.CompletedProcess:
    if not ACTIONLINT.exists():
        pytest.skip("actionlint is not installed (`make setup` installs it on Linux, where its wheels exist)")
    return subprocess.run(
        [str(ACTIONLINT), "-no-color", "-config-file", str(ROOT / ".github" / "actionlint.yaml"), *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )


def test_actionlint_finds_nothing_wrong_in_any_workflow():
    workflows = sorted(WORKFLOWS.glob("*.yml"))
    assert GRADE_CLASS in workflows
    run = actionlint(*workflows)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(
    "old, new, complaint",
    [
        (
            "${{ matrix.shard }}/${{ inputs.shards }}",
            "${{ matrix.shards }}/${{ inputs.shards }}",
            'property "shards" is not defined',
        ),
        ("needs: shard\n", "needs: shards\n", 'job "merge" needs job "shards" which does not exist'),
        ("merge-multiple: true", "merge-multipel: true", 'input "merge-multipel" is not defined'),
        ("runs-on: [self-hosted, gpu]", "runs-on: [self-hosted, gpus]", 'label "gpus" is unknown'),
    ],
)
def test_actionlint_would_catch_a_broken_grading_workflow(tmp_path, old, new, complaint):
    text = GRADE_CLASS.read_text()
    assert text.count(old) >= 1
    broken = tmp_path / "grade-class.yml"
    broken.write_text(text.replace(old, new))
    run = actionlint(broken)
    assert run.returncode == 1 and complaint in run.stdout, run.stdout + run.stderr


# --- the workflow's own commands, run here -------------------------------------------------------


def load_workflow() -> dict:
    workflow = yaml.safe_load(GRADE_CLASS.read_text())
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as true
    return workflow


def expand(text: str, values: dict[str, object]) -> str:
    """The workflow's ${{ ... }} expressions replaced by `values`; any other expression is a test error."""

    def one(match):
        expression = match.group(1).strip()
        assert expression in values, f"the test does not know the value of ${{{{ {expression} }}}}"
        return str(values[expression])

    return re.sub(r"\$\{\{(.*?)\}\}", one, text)


def step(job: dict, name_or_action: str) -> dict:
    return next(
        s
        for s in job["steps"]
        if name_or_action in (s.get("name", ""), s.get("uses", "").split("@")[0])
        or s.get("name", "").startswith(name_or_action)
    )


def run_step(found: dict, values: dict, extra_env: dict) -> subprocess.CompletedProcess:
    """A `run:` step as a runner runs it (bash -e -o pipefail), from the project root, with its own env."""
    env = {**os.environ, **{k: expand(str(v), values) for k, v in found.get("env", {}).items()}, **extra_env}
    return subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", expand(found["run"], values)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )


CLASS = {"ann": "ada", "cai": "casey", "dee": "devon"}


@pytest.mark.slow
@pytest.mark.long
def test_the_workflow_grades_a_class_shard_by_shard_and_merges_the_artifacts(tmp_path):
    if not (Path(sys.prefix) / ".inputs").exists():
        pytest.skip(
            "runs `make`, which needs the project's virtualenv made by `make setup`; these tests are not running in it"
        )
    workflow = load_workflow()
    inputs = {name: spec.get("default") for name, spec in workflow["on"]["workflow_dispatch"]["inputs"].items()}
    assert {"shards", "device"} <= set(inputs)
    shards = 2
    values = {"inputs.shards": shards, "inputs.device": "cpu"}
    make_env = {"VENV": sys.prefix}  # the virtualenv these tests run in: `make setup` finds it up to date

    # plan: the matrix of shards
    plan = workflow["jobs"]["plan"]
    output = tmp_path / "github-output"
    output.write_text("")
    run = run_step(step(plan, "List the shards"), values, {"GITHUB_OUTPUT": str(output)})
    assert run.returncode == 0, run.stderr
    listed = json.loads(dict(line.split("=", 1) for line in output.read_text().splitlines())["list"])
    assert listed == list(range(shards))
    shard_job = workflow["jobs"]["shard"]
    assert shard_job["needs"] == "plan" and shard_job["runs-on"] == ["self-hosted", "gpu"]
    assert shard_job["strategy"]["matrix"]["shard"] == "${{ fromJSON(needs.plan.outputs.shards) }}"
    assert shard_job["strategy"]["fail-fast"] is False

    # each shard, in its own checkout, keeps its results as an artifact
    artifacts: dict[str, Path] = {}
    for index in listed:
        checkout = course_of_samples(tmp_path / f"shard-{index}", CLASS)
        shard_values = {**values, "matrix.shard": index, "env.COURSE": checkout}
        run = run_step(step(shard_job, "Grade shard"), shard_values, {**make_env, "COURSE": str(checkout)})
        assert run.returncode == 0, run.stdout + run.stderr
        upload = step(shard_job, "actions/upload-artifact")
        assert upload["if"] == "always()"
        name, path = expand(upload["with"]["name"], shard_values), Path(expand(upload["with"]["path"], shard_values))
        artifacts[name] = path
        assert not (checkout / "grades.csv").exists()  # a shard writes no class output
    graded = {name: sorted(p.name for p in path.iterdir()) for name, path in artifacts.items()}
    assert graded == {"results-shard-0": ["ann", "dee"], "results-shard-1": ["cai"]}

    # the merge job downloads every shard's artifact into one folder, then merges
    merge_job = workflow["jobs"]["merge"]
    assert merge_job["needs"] == "shard" and merge_job["if"] == "${{ !cancelled() }}"
    download = step(merge_job, "actions/download-artifact")["with"]
    assert download["merge-multiple"] is True
    assert all(fnmatch.fnmatch(name, download["pattern"]) for name in artifacts)

    def merge(artifact_names) -> tuple[subprocess.CompletedProcess, Path]:
        checkout = course_of_samples(tmp_path / f"merge-{len(artifact_names)}", CLASS)
        target = Path(expand(download["path"], {"env.COURSE": checkout}))
        for name in artifact_names:  # as download-artifact does: files written anew, at download time
            shutil.copytree(artifacts[name], target, dirs_exist_ok=True, copy_function=shutil.copyfile)
        return run_step(step(merge_job, "Merge"), values, {**make_env, "COURSE": str(checkout)}), checkout

    run, merged = merge(list(artifacts))
    assert run.returncode == 0, run.stdout + run.stderr
    with (merged / "grades.csv").open(newline="") as handle:
        rows = {row["student"]: row for row in csv.DictReader(handle)}
    assert sorted(rows) == sorted(CLASS)
    for student, row in rows.items():
        results = json.loads((merged / "results" / student / "mha" / "results.json").read_text())
        assert float(row["score"]) == results["score"]
    assert float(rows["ann"]["score"]) == 100 and float(rows["dee"]["score"]) == 0

    # a shard that failed before uploading: the merge still runs, and fails naming its students
    run, incomplete = merge(["results-shard-0"])
    assert run.returncode != 0
    assert "cai: not graded" in run.stdout and not (incomplete / "grades.csv").exists()
