"""Fixtures shared by the project's tests; the helpers they use live in helpers.py."""

import sys
import textwrap

import pytest

from browser import find_or_install_chromium
from helpers import REFERENCE, grade
from sharding import shards_of

pytest_plugins = ["root_report"]  # the tests that need root and did not run, said apart


@pytest.fixture(scope="session")
def reference_results(tmp_path_factory) -> dict:
    """The reference solution graded once per test session."""
    results, run = grade(REFERENCE, tmp_path_factory.mktemp("reference"))
    assert run.returncode == 0, run.stderr
    return results


@pytest.fixture
def make_worker(request):
    """`make_worker(source, **settings)`: a worker of `source` (dedented), with `WorkerConfig`'s settings; a test
    module's `WORKER_DEFAULTS` (a dict of them) sets its own defaults. Every worker is closed after the test."""
    from autograder.sandbox.client import Worker
    from autograder.sandbox.settings import WorkerConfig

    defaults = getattr(request.module, "WORKER_DEFAULTS", {})
    made = []

    def make(source: str, **settings) -> Worker:
        made.append(Worker([(1, 1, textwrap.dedent(source))], "mha.py", WorkerConfig(**{**defaults, **settings})))
        return made[-1]

    yield make
    for worker in made:
        worker.close()


def forget_the_interpreter() -> None:
    """Clear what this process found out about its interpreter (`sys.executable`) and keeps: the sandbox's allow
    lists and the probes that ran it. A test that swaps the interpreter clears them before and after, so that
    what it found is never what a later test's grading compares its early workers with (their allow list was
    another interpreter's: none were adopted)."""
    from autograder.sandbox import bwrap, probe

    for cached in (
        bwrap.allow_list,
        bwrap.expected_allow_list,
        probe.namespace_sandbox_problem,
        probe.separate_uid_available,
    ):
        cached.cache_clear()


@pytest.fixture
def swapped_interpreter(monkeypatch):
    """`swap(python)`: the worker's interpreter (`sys.executable`, what the launcher starts) is `python` for this
    test only, and nothing found out with it outlives the test."""
    forget_the_interpreter()
    yield lambda python: monkeypatch.setattr(sys, "executable", python)
    monkeypatch.undo()
    forget_the_interpreter()


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's headless Chromium, installed by the test when it is missing (as root)."""
    return find_or_install_chromium()


# -- shards of a run: `--shard K/N` (tests/sharding.py) ---------------------------------------------------------


def pytest_addoption(parser):
    parser.addoption(
        "--shard",
        action="append",
        default=[],
        metavar="K/N",
        help="run only shard K of N (K from 1) of the selected test modules; repeatable",
    )


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected theirs
def pytest_collection_modifyitems(config, items):
    wanted = config.getoption("shard")
    if not wanted:
        return
    parsed = set()
    for text in wanted:
        shard, _, count = text.partition("/")
        if not (shard.isdigit() and count.isdigit() and 1 <= int(shard) <= int(count)):
            raise pytest.UsageError(f"--shard {text}: K/N with 1 <= K <= N")
        parsed.add((int(shard), int(count)))
    counts = {count for _, count in parsed}
    if len(counts) != 1:
        raise pytest.UsageError("--shard: every K/N of one run has the same N")
    modules: dict[str, tuple[int, int]] = {}
    for item in items:
        long, other = modules.get(item.path.name, (0, 0))
        is_long = item.get_closest_marker("long") is not None
        modules[item.path.name] = (long + is_long, other + (not is_long))
    shard_of = shards_of(modules, counts.pop())
    keep = {shard for shard, _ in parsed}
    selected = [item for item in items if shard_of[item.path.name] in keep]
    deselected = [item for item in items if shard_of[item.path.name] not in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
