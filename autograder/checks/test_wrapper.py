"""MultiHeadAttentionWrapper.forward: every head on the same x, one after another, then combine."""
import pytest
import torch

from autograder.checks.harness import (assert_close, book_pair, build_pair, check_gradients, fail,
                                       first_match, reference_forward)
from autograder.checks.mistakes import wrapper_variants

# (batch, tokens, d_in, d_out per head, context_length, heads, qkv_bias)
CASES = {
    "2 heads": (2, 6, 3, 2, 6, 2, False),
    "4 heads, bias": (3, 5, 8, 3, 8, 4, True),
    "1 head": (1, 4, 5, 4, 4, 1, False),
    "12 heads, short sequence": (4, 3, 6, 2, 10, 12, False),
}


def case_args(case):
    batch, tokens, d_in, d_out, context, heads, bias = CASES[case]
    return (batch, tokens, d_in), (d_in, d_out, context, 0.0, heads), {"qkv_bias": bias}


@pytest.mark.part("wrapper")
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(submission, inputs, rubric, device, dtype_name, case):
    """the wrapper's output equals the reference's on hidden weights and inputs"""
    dtype = getattr(torch, dtype_name)
    shape, args, kwargs = case_args(case)
    reference, module = build_pair(submission, inputs, "MultiHeadAttentionWrapper", *args, dtype=dtype,
                                   device=device, **kwargs)
    x = inputs.randn(*shape, dtype=dtype)
    got = submission.forward(module, x).y
    x_ref = x.to(device)
    head_outputs = [head(x_ref).detach() for head in reference.heads]
    assert_close(got, reference_forward(reference, x_ref).cpu(), dtype_name, rubric, f"wrapper output ({case})",
                 diagnose=lambda y: first_match(y, wrapper_variants([h.cpu() for h in head_outputs])))


@pytest.mark.part("wrapper")
def test_book_example(submission, rubric):
    """the wrapper reproduces the book's (2, 6, 4) context vectors"""
    reference, module, x = book_pair(submission, "MultiHeadAttentionWrapper", 3, 2, 6, 0.0, 2)
    heads = [h(x).detach() for h in reference.heads]
    assert_close(submission.forward(module, x).y, reference_forward(reference, x), "float32", rubric,
                 "wrapper output for the book's example", diagnose=lambda y: first_match(y, wrapper_variants(heads)))


@pytest.mark.part("wrapper")
@pytest.mark.evidence("worker")
def test_heads_run_once_in_order_on_same_input(submission, inputs):
    """each head is called once, in order, on the same input x"""
    _, module = build_pair(submission, inputs, "MultiHeadAttentionWrapper", 4, 2, 5, 0.0, 4)
    calls = submission.forward(module, inputs.randn(2, 5, 4), hooks=True).head_calls
    order = [c.index for c in calls]
    if order != [0, 1, 2, 3]:
        fail(f"the heads ran in the order {order}; the wrapper must call every head of self.heads once, "
             "in order (head 0 first): [head(x) for head in self.heads]")
    changed = [c.index for c in calls if not c.same_values]
    if changed:
        fail(f"head(s) {changed} did not receive the wrapper's input x unchanged; every head must see the same x")


@pytest.mark.part("wrapper")
def test_gradients(submission, inputs, rubric):
    """gradients reach the input and every head's weights, equal to the reference's"""
    reference, module = build_pair(submission, inputs, "MultiHeadAttentionWrapper", 5, 3, 6, 0.0, 3, qkv_bias=True)
    x = inputs.randn(2, 6, 5)
    grad_out = inputs.randn(2, 6, 9)
    answer = submission.forward(module, x, grad_out=grad_out)
    x_ref = x.clone().requires_grad_(True)
    reference(x_ref).backward(grad_out)
    expected = {"x": x_ref.grad, **{f"param:{n}": p.grad for n, p in reference.named_parameters()}}
    check_gradients(answer, expected, rubric)


@pytest.mark.part("wrapper")
@pytest.mark.evidence("worker")
def test_input_not_modified(submission, inputs):
    """the forward leaves its input unchanged"""
    _, module = build_pair(submission, inputs, "MultiHeadAttentionWrapper", 4, 2, 5, 0.0, 2)
    x = inputs.randn(2, 5, 4)
    if not torch.equal(submission.forward(module, x).x_after, x):
        fail("the wrapper's forward modified its input x in place; work on new tensors instead")


@pytest.mark.part("wrapper")
def test_dropout(submission, inputs, rubric):
    """dropout acts on the attention weights in training mode, and not at all in eval mode"""
    reference, module = build_pair(submission, inputs, "MultiHeadAttentionWrapper", 4, 3, 6, 0.5, 2)
    x = inputs.randn(2, 6, 4)
    assert_close(submission.forward(module, x).y, reference_forward(reference, x), "float64", rubric,
                 "eval-mode output with dropout=0.5 (dropout must be inert in eval mode)")
    seed = inputs.seed_value()
    assert_close(submission.forward(module, x, train=True, seed=seed).y,
                 reference_forward(reference, x, train=True, seed=seed), "float64", rubric,
                 "training-mode output with dropout=0.5 (each head drops its attention weights, heads in order)")

