"""`--shard K/N` (repeatable; conftest.py) runs only the test modules of shard K of N (K from 1): `.ci/run`
runs the long suites as two pytest processes at once, beside the quick suite, since a grading waits more than
it computes. Whole modules go to one shard (their module-scoped gradings are made once), each to the shard
with the least work so far, heaviest first: the weights are each long module's seconds in CI; a module not
listed weighs 5 s a test. Every selected test is in exactly one shard of N.
"""

from __future__ import annotations

SHARD_WEIGHTS = {
    "test_environments.py": 330,
    "test_containers.py": 300,
    "test_hostile_submissions.py": 250,
    "test_bwrap_versions.py": 120,
    "test_vanishing_cpu.py": 90,
    "test_wrong_submissions.py": 70,
    "test_class_report.py": 60,
    "test_packaging.py": 60,
    "test_slurm.py": 50,
    "test_forkserver.py": 35,
    "test_gradebook.py": 25,
    "test_grade_class.py": 25,
    "test_workflows.py": 21,
    "test_timed_is_checked.py": 15,
    "test_cli.py": 10,
}


def shards_of(modules: dict[str, int], count: int) -> dict[str, int]:
    """{module: its shard (1..count)}, from {module: number of its selected tests}."""
    weight = {name: SHARD_WEIGHTS.get(name, 5 * tests) for name, tests in modules.items()}
    load = [0] * count
    found = {}
    for name in sorted(weight, key=lambda name: (-weight[name], name)):
        shard = load.index(min(load))
        found[name] = shard + 1
        load[shard] += weight[name]
    return found
