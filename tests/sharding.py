"""`--shard K/N` (repeatable; conftest.py) runs only the test modules of shard K of N (K from 1): `.ci/run`
runs the quick suite and the long suites as several pytest processes at once, since a grading waits more than
it computes. Whole modules go to one shard (their module-scoped gradings are made once), each to the shard
with the least work so far, heaviest first. A module's work: its long tests share its weight below (seconds
in CI; 5 s a test for a module not listed), each of its other tests weighs 1 s. Every selected test is in
exactly one shard of N.
"""

from __future__ import annotations

# the seconds that each module's long tests took in CI, together
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


def shards_of(modules: dict[str, tuple[int, int]], count: int) -> dict[str, int]:
    """{module: its shard (1..count)}, from {module: (its selected long tests, its other selected tests)}."""
    weight = {
        name: (SHARD_WEIGHTS.get(name, 5 * long) if long else 0) + other for name, (long, other) in modules.items()
    }
    load = [0] * count
    found = {}
    for name in sorted(weight, key=lambda name: (-weight[name], name)):
        shard = load.index(min(load))
        found[name] = shard + 1
        load[shard] += weight[name]
    return found
