"""Column ranges, the 8-column/4-head answer, and split_columns: which columns belong to which head.

split_columns is graded on what it adds: blocks W[:, start:stop] for the ranges of the student's own
head_column_ranges are right, so a mistake in the ranges is charged once, in test_head_column_ranges.
"""

from __future__ import annotations

import pytest
import torch

from autograder.grading.checks.harness import (
    Inputs,
    Raised,
    Submission,
    attempt,
    explained,
    fail,
    matches,
    note,
    stub_left,
)
from autograder.grading.checks.mistakes import (
    ROWS_INSTEAD_OF_COLUMNS,
    column_range_variants,
    split_variants,
    wrong_ranges,
)
from autograder.model import NOT_DONE_UNANSWERED
from reference import mha as ref

SIZES = [(6, 3), (8, 4), (2, 2), (5, 1), (12, 12), (64, 8), (768, 12), (30, 5)]
UNEVEN = [(7, 2), (8, 3), (10, 4), (0, 4), (4, 0), (-6, 3), (6, -3)]


def as_ranges(value: object) -> list[tuple[int, int]] | None:
    """The student's ranges as a list of (int, int) tuples, or None when they are not that shape."""
    if not isinstance(value, (list, tuple)):
        return None
    ranges = []
    for item in value:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and all(isinstance(v, int) for v in item)):
            return None
        ranges.append((item[0], item[1]))
    return ranges


def check_ranges(
    given: object, expected: list[tuple[int, int]], what: str, variants: dict[str, list[tuple[int, int]]]
) -> None:
    note("compared", what=what, expected=expected, actual=given)
    ranges = as_ranges(given)
    if ranges is None:
        fail(
            f"{what}: expected a list of (start, stop) pairs of ints, got {given!r:.120}",
            diagnosis="not a list of (start, stop) pairs of ints",
        )
    if ranges != expected:
        mistake = next((d for d, v in variants.items() if v == ranges), None)
        said = f"{what}: got {ranges!r:.160}, expected " + (
            f"{len(expected)} ranges starting {expected[:3]!r}." if len(expected) > 1 else f"{expected!r}."
        )
        if mistake:
            fail(explained(said, mistake, mistake))
        fail(said, diagnosis="the ranges are not the expected ones")


@pytest.mark.part("columns")
@pytest.mark.parametrize("num_columns,num_heads", SIZES, ids=[f"{c}c-{h}h" for c, h in SIZES])
def test_head_column_ranges(submission: Submission, num_columns: int, num_heads: int) -> None:
    """head_column_ranges gives one half-open range per head, covering every column once"""
    given = submission.call("head_column_ranges", num_columns, num_heads)
    check_ranges(
        given,
        ref.head_column_ranges(num_columns, num_heads),
        f"head_column_ranges({num_columns}, {num_heads})",
        column_range_variants(num_columns, num_heads),
    )


@pytest.mark.part("columns")
@pytest.mark.parametrize("num_columns,num_heads", UNEVEN, ids=[f"{c}c-{h}h" for c, h in UNEVEN])
def test_rejects_bad_splits(submission: Submission, num_columns: int, num_heads: int) -> None:
    """head_column_ranges raises ValueError with a message when the columns cannot be split evenly"""
    given = submission.try_call("head_column_ranges", num_columns, num_heads)
    if isinstance(given, Raised):
        if given.stub:
            stub_left(given)
        if given.type != "ValueError":
            fail(
                f"head_column_ranges({num_columns}, {num_heads}) raised {given.type}: {given.message}; "
                "raise ValueError when the columns do not split evenly or a count is not positive",
                diagnosis=f"raises {given.type}, not ValueError",
            )
        if not given.message.strip():
            fail(
                f"head_column_ranges({num_columns}, {num_heads}) raised ValueError without a message; "
                "say why, e.g. '7 columns do not split evenly into 2 heads'",
                diagnosis="raises ValueError without a message",
            )
        return
    fail(
        f"head_column_ranges({num_columns}, {num_heads}) returned {given!r:.80} "
        "instead of raising ValueError: these columns cannot be shared equally by the heads",
        diagnosis="returns instead of raising ValueError",
    )


@pytest.mark.part("columns")
def test_eight_columns_four_heads(submission: Submission) -> None:
    """EIGHT_COLUMNS_FOUR_HEADS is the list of ranges for 8 columns and 4 heads"""
    expected = ref.EIGHT_COLUMNS_FOUR_HEADS
    if expected is None:  # the grader's own fault: the run cannot grade
        raise RuntimeError("the reference does not answer EIGHT_COLUMNS_FOUR_HEADS")
    given = submission.value("EIGHT_COLUMNS_FOUR_HEADS")
    if given is None:
        fail(
            "EIGHT_COLUMNS_FOUR_HEADS is still None: write the list of ranges for 8 columns and 4 heads",
            mistake=NOT_DONE_UNANSWERED,
            diagnosis="EIGHT_COLUMNS_FOUR_HEADS is still None",
        )
    check_ranges(
        given,
        expected,
        "EIGHT_COLUMNS_FOUR_HEADS",
        column_range_variants(8, 4),
    )


SPLITS = [(3, 6, 3), (4, 8, 4), (8, 8, 2), (5, 12, 12), (16, 4, 1)]


@pytest.mark.part("columns")
@pytest.mark.parametrize("d_in,d_out,num_heads", SPLITS, ids=[f"{a}x{b}-{h}h" for a, b, h in SPLITS])
def test_split_columns(submission: Submission, inputs: Inputs, d_in: int, d_out: int, num_heads: int) -> None:
    """split_columns returns each head's block of columns W[:, start:stop], head 0 first"""
    W = inputs.randn(d_in, d_out)
    given, problem = attempt(submission.call, "split_columns", W, num_heads)
    if problem:
        note = wrong_ranges(submission, d_out, num_heads)
        if (
            note is None and d_in % num_heads and "split evenly" in problem.message
        ):  # the rows were split, not the columns
            said = f"{problem}\n({d_in} rows do not split into {num_heads} heads)"
            fail(explained(said, ROWS_INSTEAD_OF_COLUMNS, ROWS_INSTEAD_OF_COLUMNS))
        fail(
            problem.reworded(
                problem.message
                + (
                    f"\nIf split_columns uses head_column_ranges: {note}; fix that first (see its checks)."
                    if note
                    else ""
                )
            ),
            mistake=problem.mistake,
            diagnosis=f"{problem.diagnosis}{' (and head_column_ranges is wrong)' if note else ''}"
            if problem.diagnosis
            else "",
        )
    expected = ref.split_columns(W, num_heads)
    what = f"split_columns(W of shape ({d_in}, {d_out}), {num_heads})"
    if not isinstance(given, (list, tuple)) or not all(isinstance(b, torch.Tensor) for b in given):
        fail(
            f"{what}: expected a list of {num_heads} tensors, got {type(given).__name__}",
            diagnosis=f"not a list of tensors: {type(given).__name__}",
        )
    if same_blocks(given, expected):
        return
    own = as_ranges(submission.try_call("head_column_ranges", d_out, num_heads))
    if (
        own is not None
        and own != ref.head_column_ranges(d_out, num_heads)
        and same_blocks(given, [W[:, start:stop] for start, stop in own])
    ):
        return  # the blocks of your own ranges: the ranges are charged in test_head_column_ranges
    for description, blocks in split_variants(W, num_heads).items():
        if same_blocks(given, blocks):
            fail(explained(f"{what}: wrong blocks.", description, description))
    shapes = [tuple(b.shape) for b in given]
    fail(
        f"{what}: got {len(given)} blocks of shapes {shapes[:4]}, expected {num_heads} blocks of shape "
        f"{tuple(expected[0].shape)} equal to W[:, start:stop] for each head's range",
        diagnosis="the blocks are not each head's columns",
    )


def same_blocks(given: list[torch.Tensor] | tuple[torch.Tensor, ...], blocks: list[torch.Tensor]) -> bool:
    return len(given) == len(blocks) and all(matches(g, b, atol=0) for g, b in zip(given, blocks))
