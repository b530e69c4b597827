"""The two multiple-choice questions."""
import pytest

from autograder.checks.harness import fail
from reference import mha as ref

CHOICES = {"HEADS_RUN": ("A", "B"), "OUTPUT_SHAPE_STEP": ("A", "B", "C", "D")}
WHY = {
    "HEADS_RUN": "The wrapper's forward is `[head(x) for head in self.heads]`: a list comprehension runs "
                 "one head to completion, then the next. Nothing in it runs two heads at once; that is "
                 "what the weight-split version changes.",
    "OUTPUT_SHAPE_STEP": "The heads' job stays the same; what decides the combined output's shape is how "
                         "their results are gathered (the combine step, and the argument that sizes it).",
}


def answer(submission, name):
    value = submission.value(name)
    if value is None:
        fail(f"{name} is still None: set it to one of {', '.join(map(repr, CHOICES[name]))}")
    if not isinstance(value, str) or value.strip().upper() not in CHOICES[name]:
        fail(f"{name} is {value!r}; it must be one letter, one of {', '.join(map(repr, CHOICES[name]))}")
    return value.strip().upper()


@pytest.mark.part("quiz")
@pytest.mark.parametrize("name", list(CHOICES))
def test_answer_is_a_choice(submission, name):
    """the answer is one of the letters offered"""
    answer(submission, name)


@pytest.mark.part("quiz")
@pytest.mark.parametrize("name", list(CHOICES))
def test_answer(submission, name):
    """the answer is right"""
    given = answer(submission, name)
    if given != getattr(ref, name):
        fail(f"{name} = {given!r} is not right. {WHY[name]}")
