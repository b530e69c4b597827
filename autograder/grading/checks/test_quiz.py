"""The two multiple-choice questions."""

from __future__ import annotations

import pytest

from autograder.grading.checks.harness import Submission, fail
from autograder.model import NOT_DONE_UNANSWERED
from reference import mha as ref

CHOICES = {"HEADS_RUN": ("A", "B"), "OUTPUT_SHAPE_STEP": ("A", "B", "C", "D")}
WHY = {
    "HEADS_RUN": "The wrapper's forward is `[head(x) for head in self.heads]`: the list comprehension calls "
    "one head, waits until it has returned, then calls the next (B). Nothing in it computes two "
    "heads in one operation; that is what the weight-split version changes.",
    "OUTPUT_SHAPE_STEP": "The exercise's rule: when the combined output needs another shape, change only how the "
    "heads' results are sized and gathered (C), and keep each head's role. In part 4, "
    "d_out=1 sizes each head's result; every head still makes the same kind of projections "
    "and runs the same mask, softmax and weighted sum, so neither what a head computes (A) nor "
    "how it forms its attention weights (B) changes, and the input embeddings (D) are not "
    "touched.",
}


def answer(submission: Submission, name: str) -> str:
    value = submission.value(name)
    if value is None:
        fail(
            f"{name} is still None: set it to one of {', '.join(map(repr, CHOICES[name]))}",
            mistake=NOT_DONE_UNANSWERED,
            diagnosis=f"{name} is still None",
        )
    if not isinstance(value, str) or value.strip().upper() not in CHOICES[name]:
        fail(
            f"{name} is {value!r}; it must be one letter, one of {', '.join(map(repr, CHOICES[name]))}",
            diagnosis=f"{name} is not one of the letters offered",
        )
    return value.strip().upper()


@pytest.mark.part("quiz")
@pytest.mark.parametrize("name", list(CHOICES))
def test_answer_is_a_choice(submission: Submission, name: str) -> None:
    """the answer is one of the letters offered"""
    answer(submission, name)


@pytest.mark.part("quiz")
@pytest.mark.parametrize("name", list(CHOICES))
def test_answer(submission: Submission, name: str) -> None:
    """the answer is right"""
    given = answer(submission, name)
    if given != getattr(ref, name):
        fail(f"{name} = {given!r} is not right. {WHY[name]}", diagnosis=f"{name} is not right")
