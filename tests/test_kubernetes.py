"""deploy/kubernetes/: the manifests are valid Kubernetes objects (checked offline against the
schemas kubernetes-validate ships), and the grading Job shards the class the way the grader expects."""

import fnmatch
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from autograder.course.shard import Shard, parse_shard
from helpers import ROOT

MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSION = "1.33.0"  # backoffLimitPerIndex is stable from 1.33


def documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def test_there_are_a_grading_job_a_merge_job_and_their_volume():
    kinds = sorted((doc["kind"], doc["metadata"]["name"]) for path in MANIFESTS for doc in documents(path))
    assert kinds == [("Job", "mha-grade-class"), ("Job", "mha-merge"), ("PersistentVolumeClaim", "mha-course")]


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_manifest_is_valid_against_the_kubernetes_schema(path):
    for doc in documents(path):
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises on any error


@pytest.mark.parametrize(
    "change, complaint",
    [
        (lambda job: job["spec"].update(completionMod="Indexed"), "completionMod"),  # a misspelt field
        (lambda job: job["spec"].update(completions="four"), "four"),
        (lambda job: job["spec"]["template"]["spec"]["containers"][0].pop("name"), "name"),
    ],
)
def test_the_schema_check_catches_a_broken_job(change, complaint):
    job = documents(ROOT / "deploy" / "kubernetes" / "grade-class-job.yaml")[0]
    change(job)
    with pytest.raises(kubernetes_validate.ValidationError, match=complaint):
        kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)


def test_the_grading_job_gives_each_pod_one_shard_and_one_gpu():
    job = documents(ROOT / "deploy" / "kubernetes" / "grade-class-job.yaml")[0]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    container = spec["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    command = container["command"]
    assert command[:4] == [".venv/bin/python", "-m", "autograder", "grade-class"]
    shard = command[command.index("--shard") + 1]
    assert re.fullmatch(r"auto/\d+", shard)
    # every completion index Kubernetes hands out is a shard of the same class, and together they cover it
    shards = [parse_shard(shard, environ={"JOB_COMPLETION_INDEX": str(i)}) for i in range(spec["completions"])]
    assert shards == [Shard(i, spec["completions"]) for i in range(spec["completions"])]
    assert spec["parallelism"] <= spec["completions"]
    merge = documents(ROOT / "deploy" / "kubernetes" / "merge-job.yaml")[0]
    assert merge["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["/course", "--merge"]
    assert "nvidia.com/gpu" not in str(merge)  # merging grades nothing: no GPU


def test_the_pods_grade_as_root_of_a_user_namespace_of_their_own():
    """Root in the pod's own user namespace gives each worker a fresh uid (tests/test_environments.py grades
    a class so, emulated); as a normal user without user namespaces nothing could isolate the student's code
    and grading would refuse. The image closes the grader's source to the workers' uids."""
    for name in ("grade-class-job.yaml", "merge-job.yaml"):
        pod = documents(ROOT / "deploy" / "kubernetes" / name)[0]["spec"]["template"]["spec"]
        assert pod["hostUsers"] is False, name
        assert pod["securityContext"]["runAsUser"] == 0, name
    command = documents(ROOT / "deploy" / "kubernetes" / "grade-class-job.yaml")[0]["spec"]["template"]["spec"][
        "containers"
    ][0]["command"]
    assert "--isolation" not in command  # auto: a fresh uid per worker, or bubblewrap where the pod allows it
    dockerfile = (ROOT / "deploy" / "kubernetes" / "Dockerfile").read_text()
    assert "chmod -R g+rX,g-w,o-rwx" in dockerfile and "bubblewrap" in dockerfile and "USER 1000" not in dockerfile


def test_the_image_context_leaves_out_what_git_ignores():
    """An instructor builds the image from their checkout: what git ignores there (the other Pythons'
    virtualenvs, 4.7 GB each after `make test-pythons`; builds, caches, a class's outputs) is never sent to
    Docker. Each .gitignore entry, as a path at the top of the tree, is matched by a .dockerignore pattern
    (Docker's: anchored at the context's root, `**` for any folders)."""
    ignored = [
        line.strip().strip("/")
        for line in (ROOT / ".gitignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    patterns = [
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines() if line.strip() and line[0] != "#"
    ]

    def excluded(path: str) -> bool:
        return any(fnmatch.fnmatchcase(path, pattern.removeprefix("**/")) for pattern in patterns)

    assert ignored and patterns
    missing = [entry for entry in ignored if not excluded(entry.replace("*", "x"))]
    assert not missing, f"sent to Docker though git ignores them: {missing}"
    assert not excluded("autograder/__init__.py") and not excluded("requirements.lock")  # what the image needs
