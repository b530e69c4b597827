"""combine: the gathering step, per-head (b, T, d_h) tensors -> (b, T, sum d_h).

The checks run in this order, so the first failure shown is the most telling: the book's example
(visible), hidden cases, then the dtype (which counts only when the values are right).
"""

from __future__ import annotations

import re

import pytest
import torch

from autograder.grading.checks.harness import (
    DTYPE_NOT_KEPT,
    Inputs,
    Submission,
    assert_close,
    attempt,
    book_batch,
    explained,
    fail,
    first_match,
    seed_torch,
    value_problem,
    values_first,
)
from autograder.grading.checks.mistakes import WRONG_DIMENSION, combine_variants
from autograder.rubric import Rubric
from reference import mha as ref

# (batch, tokens, widths of the heads)
CASES: dict[str, tuple[int, int, list[int]]] = {
    "2 heads": (2, 6, [2, 2]),
    "4 heads": (3, 5, [3, 3, 3, 3]),
    "12 heads": (1, 7, [4] * 12),
    "uneven widths": (2, 4, [1, 3, 2]),
    "1 head": (4, 3, [5]),
}


def head_outputs(
    inputs: Inputs, batch: int, tokens: int, widths: list[int], dtype: torch.dtype = torch.float64
) -> list[torch.Tensor]:
    return [inputs.randn(batch, tokens, width, dtype=dtype) for width in widths]


def check_combine(
    submission: Submission, rubric: Rubric, outputs: list[torch.Tensor], dtype_name: str, what: str
) -> None:
    got, problem = attempt(submission.call, "combine", outputs)
    if problem:
        widths = [o.shape[-1] for o in outputs]
        if len(set(widths)) > 1:  # the same combine on heads of one width may show what it does
            equal = [o[..., : min(widths)] for o in outputs]
            same, failed = attempt(submission.call, "combine", equal)
            hint = first_match(same, combine_variants(equal)) if failed is None else None
            if hint:
                said = (
                    f"{what}: combine fails on heads of different widths {widths}; on heads of one width it "
                    f"returns what this mistake gives.\n{problem}"
                )
                fail(explained(said, hint, hint))
        joined = re.search(r"Sizes of tensors must match except in dimension (\d+)", problem.message)
        if joined and int(joined.group(1)) in WRONG_DIMENSION:
            said = (
                f"{what}: heads of different widths do not line up along dimension {joined.group(1)}; only the last "
                f"dimension may differ between heads.\n{problem}"
            )
            fail(explained(said, WRONG_DIMENSION[int(joined.group(1))], WRONG_DIMENSION[int(joined.group(1))]))
        fail(problem)
    assert_close(
        got,
        ref.combine(outputs),
        dtype_name,
        rubric,
        what,
        diagnose=lambda y: first_match(y, combine_variants(outputs)),
    )


@pytest.mark.part("combine")
def test_book_example(submission: Submission, rubric: Rubric) -> None:
    """combine gathers the book's two heads into (2, 6, 4) context vectors"""
    batch = book_batch()
    seed_torch(123)
    heads = ref.MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2).heads
    with torch.no_grad():
        outputs = [head(batch) for head in heads]
    check_combine(submission, rubric, outputs, "float32", "combine of the book's example")


@pytest.mark.part("combine")
@pytest.mark.parametrize("case", list(CASES))
def test_concatenates_heads(submission: Submission, inputs: Inputs, rubric: Rubric, case: str) -> None:
    """combine puts the heads side by side in the last dimension, head 0 first"""
    check_combine(submission, rubric, head_outputs(inputs, *CASES[case]), "float64", f"combine of {case}")


@pytest.mark.part("combine")
def test_keeps_dtype(submission: Submission, inputs: Inputs, rubric: Rubric) -> None:
    """combine keeps the heads' dtype (float32 in, float32 out)"""
    outputs = head_outputs(inputs, 2, 3, [2, 2], dtype=torch.float32)
    got, problem = attempt(submission.call, "combine", outputs)
    if problem:
        fail(problem)
    if isinstance(got, torch.Tensor) and got.dtype != torch.float32:
        fail(explained(f"combine of float32 heads gave {got.dtype}.", DTYPE_NOT_KEPT, DTYPE_NOT_KEPT))
    # its values: a property of a wrong answer earns nothing, and accuses nothing (the values are charged above)
    values_first(value_problem(got, ref.combine(outputs), "float32", rubric, "combine"), "Keeping the dtype")
