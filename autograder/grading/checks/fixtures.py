"""Fixtures the checks ask for, handed over by the grading run (registered as a plugin object)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass, field

import pytest

from autograder.grading.checks.harness import Inputs, Notes, Submission, check_seed, dtypes_for
from autograder.grading.devices import QuietLock
from autograder.grading.plugin import part_of
from autograder.grading.workers import REFERENCE, BackgroundWorker, trusted_worker
from autograder.model import SpeedFigures
from autograder.rubric import Rubric
from autograder.sandbox.client import Worker


@dataclass
class GradingContext:
    submission: Submission
    rubric: Rubric
    device: str
    run_seed: int
    speed: SpeedFigures | None = None  # what the speed part measured, for the model
    flags: list[str] = field(default_factory=list)  # what checks flag for the instructor
    # the reference's timing workers by target, started early
    timing_workers: dict[str, BackgroundWorker] = field(default_factory=dict)
    notes: Notes | None = None  # what the checks sent and compared, when the grading keeps it (explain)
    quiet: QuietLock = field(default_factory=QuietLock)  # its timing holds; its submission's requests' lock


class GradingFixtures:
    def __init__(self, context: GradingContext):
        self._context = context

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        """The speed part's checks run first: the submission's module is timed in a worker that has only
        loaded its file, like the reference's (a worker that has run every other check is slower)."""
        items.sort(key=lambda item: part_of(item) != "speed")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        """What the harness notes while a check runs (its fixtures' setup and teardown too) is that check's."""
        notes = self._context.notes
        if notes is not None:
            notes.check = item.nodeid
        try:
            return (yield)
        finally:
            if notes is not None:
                notes.check = ""

    @pytest.fixture(scope="session")
    def submission(self) -> Submission:
        return self._context.submission

    @pytest.fixture(scope="session")
    def rubric(self) -> Rubric:
        return self._context.rubric

    @pytest.fixture(scope="session")
    def device(self) -> str:
        return self._context.device

    @pytest.fixture(scope="session")
    def context(self) -> GradingContext:
        return self._context

    @pytest.fixture(scope="session")
    def replayer(self) -> Iterator[Worker]:
        """The trusted worker that replays the graphs captured from the submission's forward: the speed part's
        reference worker (started when the grading starts, `workers.start_trusted_workers`), else one of its own
        kind."""
        started = self._context.timing_workers.get(REFERENCE)
        own = None
        if started is None:
            own = started = trusted_worker(self._context.submission.worker.config)
        yield started.get()
        if own is not None:
            own.close()

    @pytest.fixture
    def inputs(self, request: pytest.FixtureRequest) -> Inputs:
        """Hidden inputs drawn from (the run's seed, this check's id) alone."""
        return Inputs(check_seed(self._context.run_seed, request.node.nodeid))

    @pytest.fixture(autouse=True)
    def _check_budget(self) -> None:
        self._context.submission.begin_check()

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Checks that take `dtype_name` run once per dtype of the device: fp64 and fp32 on the CPU,
        fp32, bf16 and fp16 on CUDA; checks that take `speed_workload` once per workload of the device."""
        if "dtype_name" in metafunc.fixturenames:
            metafunc.parametrize("dtype_name", dtypes_for(self._context.device))
        if "speed_workload" in metafunc.fixturenames:  # the rubric's speed workloads for the grading device
            speed = self._context.rubric.speed
            workloads = speed.workloads_for(self._context.device) if speed else []
            metafunc.parametrize("speed_workload", workloads, ids=[w.name for w in workloads])
