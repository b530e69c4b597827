"""Fixtures the checks ask for, handed over by the grading run (registered as a plugin object)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from autograder.checks.harness import Inputs, Submission, dtypes_for
from autograder.rubric import Rubric


@dataclass
class GradingContext:
    submission: Submission
    rubric: Rubric
    device: str
    inputs: Inputs


class GradingFixtures:
    def __init__(self, context: GradingContext):
        self.context = context

    @pytest.fixture(scope="session")
    def submission(self) -> Submission:
        return self.context.submission

    @pytest.fixture(scope="session")
    def rubric(self) -> Rubric:
        return self.context.rubric

    @pytest.fixture(scope="session")
    def device(self) -> str:
        return self.context.device

    @pytest.fixture(scope="session")
    def inputs(self) -> Inputs:
        return self.context.inputs

    def pytest_generate_tests(self, metafunc):
        """Checks that take `dtype_name` run once per dtype of the device: fp64 and fp32 on the CPU,
        fp32, bf16 and fp16 on CUDA."""
        if "dtype_name" in metafunc.fixturenames:
            metafunc.parametrize("dtype_name", dtypes_for(self.context.device))
