"""combine: the gathering step, per-head (b, T, d_h) tensors -> (b, T, sum d_h)."""
import pytest
import torch

from autograder.checks.harness import assert_close, book_batch, first_match
from autograder.checks.mistakes import combine_variants
from reference import mha as ref

# (batch, tokens, widths of the heads)
CASES = {
    "2 heads": (2, 6, [2, 2]),
    "4 heads": (3, 5, [3, 3, 3, 3]),
    "12 heads": (1, 7, [4] * 12),
    "uneven widths": (2, 4, [1, 3, 2]),
    "1 head": (4, 3, [5]),
}


def head_outputs(inputs, batch, tokens, widths, dtype=torch.float64):
    return [inputs.randn(batch, tokens, width, dtype=dtype) for width in widths]


@pytest.mark.part("combine")
@pytest.mark.parametrize("case", list(CASES))
def test_concatenates_heads(submission, inputs, rubric, case):
    """combine puts the heads side by side in the last dimension, head 0 first"""
    outputs = head_outputs(inputs, *CASES[case])
    got = submission.call("combine", outputs)
    assert_close(got, ref.combine(outputs), "float64", rubric, f"combine of {case}",
                 diagnose=lambda y: first_match(y, combine_variants(outputs)))


@pytest.mark.part("combine")
def test_keeps_dtype(submission, inputs, rubric):
    """combine keeps the heads' dtype"""
    outputs = head_outputs(inputs, 2, 3, [2, 2], dtype=torch.float32)
    assert_close(submission.call("combine", outputs), ref.combine(outputs), "float32", rubric,
                 "combine of float32 heads")


@pytest.mark.part("combine")
def test_book_example(submission, rubric):
    """combine gathers the book's two heads into (2, 6, 4) context vectors"""
    batch = book_batch()
    torch.manual_seed(123)
    heads = ref.MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2).heads
    outputs = [head(batch).detach() for head in heads]
    assert_close(submission.call("combine", outputs), ref.combine(outputs), "float32", rubric,
                 "combine of the book's example", diagnose=lambda y: first_match(y, combine_variants(outputs)))

