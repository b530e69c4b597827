"""MultiHeadAttention.forward: the weight-split parallel pass, all heads in one batched computation."""
import pytest
import torch

from autograder.checks.harness import (assert_close, book_pair, build_pair, check_gradients, count_matmuls,
                                       fail, first_match, reference_forward)
from autograder.checks.mistakes import mha_dropout_variants, mha_variants

# (batch, tokens, d_in, d_out, context_length, heads, qkv_bias)
CASES = {
    "book sizes": (2, 6, 3, 2, 6, 2, False),
    "d_in != d_out, bias": (3, 7, 10, 8, 7, 4, True),
    "short sequence": (4, 3, 6, 12, 9, 3, False),
    "12 heads": (1, 8, 12, 24, 8, 12, True),
    "1 head": (2, 5, 4, 6, 5, 1, False),
}
# The fused attention entry points, by the ATen ops (or Python calls) they show up as in the trace.
SDPA_OPS = ("scaled_dot_product", "_flash_attention", "_efficient_attention", "_cudnn_attention")
MHA_OPS = ("_native_multi_head_attention", "_transformer_encoder_layer")
MHA_CALLS = ("nn.MultiheadAttention", "F.multi_head_attention_forward")
FORBIDDEN = {
    "scaled_dot_product_attention": lambda ops, calls: any(name in op for op in ops for name in SDPA_OPS),
    "nn_multihead_attention": lambda ops, calls: (any(call in MHA_CALLS for call in calls)
                                                  or any(name in op for op in ops for name in MHA_OPS)),
    "flex_attention": lambda ops, calls: any("flex_attention" in op for op in ops),
}


def pair(submission, inputs, case, dtype=torch.float64, device="cpu", dropout=0.0):
    batch, tokens, d_in, d_out, context, heads, bias = CASES[case]
    reference, module = build_pair(submission, inputs, "MultiHeadAttention", d_in, d_out, context, dropout, heads,
                                   dtype=dtype, device=device, qkv_bias=bias)
    return reference, module, (batch, tokens, d_in)


@pytest.mark.part("mha")
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(submission, inputs, rubric, device, dtype_name, case):
    """the parallel forward equals the reference's on hidden weights and inputs"""
    dtype = getattr(torch, dtype_name)
    reference, module, shape = pair(submission, inputs, case, dtype, device)
    x = inputs.randn(*shape, dtype=dtype)
    answer = submission.forward(module, x)
    x_ref = x.to(device)
    assert_close(answer.y, reference_forward(reference, x_ref).cpu(), dtype_name, rubric, f"output ({case})",
                 diagnose=lambda y: first_match(y, {k: v.cpu() for k, v in mha_variants(reference, x_ref).items()}))
    if answer.y_info.device != str(x_ref.device):
        fail(f"the output is on {answer.y_info.device}, the input on {x_ref.device}: keep the input's device")


@pytest.mark.part("mha")
def test_book_example(submission, rubric):
    """the book's example: MultiHeadAttention(3, 2, 6, 0.0, num_heads=2) gives (2, 6, 2)"""
    reference, module, x = book_pair(submission, "MultiHeadAttention", 3, 2, 6, 0.0, 2)
    assert_close(submission.forward(module, x).y, reference_forward(reference, x), "float32", rubric,
                 "output for the book's example", diagnose=lambda y: first_match(y, mha_variants(reference, x)))


@pytest.mark.part("mha")
def test_new_inputs_new_answers(submission, inputs, rubric):
    """the same module gives the right answer for new inputs of the same shape (no caching)"""
    reference, module, shape = pair(submission, inputs, "d_in != d_out, bias")
    for attempt in range(3):
        x = inputs.randn(*shape)
        assert_close(submission.forward(module, x).y, reference_forward(reference, x), "float64", rubric,
                     f"output for new input number {attempt + 1} of the same shape")


@pytest.mark.part("mha")
def test_gradients(submission, inputs, rubric):
    """gradients reach the input and every weight, equal to the reference's"""
    reference, module, shape = pair(submission, inputs, "d_in != d_out, bias")
    x = inputs.randn(*shape)
    grad_out = inputs.randn(*shape[:2], reference.d_out)
    answer = submission.forward(module, x, grad_out=grad_out)
    x_ref = x.clone().requires_grad_(True)
    reference(x_ref).backward(grad_out)
    check_gradients(answer, {"x": x_ref.grad, **{f"param:{n}": p.grad for n, p in reference.named_parameters()}},
                    rubric)


@pytest.mark.part("mha")
@pytest.mark.evidence("worker")
def test_input_not_modified(submission, inputs):
    """the forward leaves its input unchanged"""
    _, module, shape = pair(submission, inputs, "short sequence")
    x = inputs.randn(*shape)
    if not torch.equal(submission.forward(module, x).x_after, x):
        fail("the forward modified its input x in place; work on new tensors instead")


@pytest.mark.part("mha")
def test_keeps_dtype(submission, inputs):
    """a float32 input gives a float32 output, a float64 input a float64 output"""
    for dtype in (torch.float32, torch.float64):
        _, module, shape = pair(submission, inputs, "book sizes", dtype)
        y = submission.forward(module, inputs.randn(*shape, dtype=dtype)).y
        if not isinstance(y, torch.Tensor) or y.dtype != dtype:
            fail(f"a {dtype} input gave {getattr(y, 'dtype', type(y).__name__)}: keep the input's dtype "
                 "(no hard-coded .float() or torch.float32 tensors)")


@pytest.mark.part("mha")
def test_dropout(submission, inputs, rubric):
    """dropout acts on the attention weights in training mode, and not at all in eval mode"""
    reference, module, shape = pair(submission, inputs, "d_in != d_out, bias", dropout=0.5)
    x = inputs.randn(*shape)
    assert_close(submission.forward(module, x).y, reference_forward(reference, x), "float64", rubric,
                 "eval-mode output with dropout=0.5 (dropout must be inert in eval mode)")
    seed = inputs.seed_value()
    assert_close(submission.forward(module, x, train=True, seed=seed).y,
                 reference_forward(reference, x, train=True, seed=seed), "float64", rubric,
                 "training-mode output with dropout=0.5 (apply self.dropout once, to the attention weights)",
                 diagnose=lambda y: first_match(y, mha_dropout_variants(reference, x, seed)))


def traced_matmuls(submission, inputs, rubric, heads):
    """The matrix multiplies of one traced forward. The trace is the worker's word, so what the traced
    forward computed must be right, and the same as an untraced forward of the same module and input:
    a forward that behaves differently when observed gains nothing."""
    reference, module = build_pair(submission, inputs, "MultiHeadAttention", 12, 24, 6, 0.0, heads)
    x = inputs.randn(2, 6, 12)
    answer = submission.forward(module, x, trace=True)
    assert_close(answer.y, reference_forward(reference, x), "float64", rubric,
                 f"output of the traced forward ({heads} heads)")
    if not torch.equal(submission.forward(module, x).y, answer.y):
        fail("the forward gave different outputs for the same input when its operations were traced and when "
             "they were not: it must compute the same way whether or not it is observed")
    return count_matmuls(answer.ops or []), answer


@pytest.mark.part("mha")
@pytest.mark.evidence("worker")
def test_one_pass_for_all_heads(submission, inputs, rubric):
    """the forward issues as many matrix multiplies for 12 heads as for 2 (no loop over heads)"""
    two, _ = traced_matmuls(submission, inputs, rubric, 2)
    twelve, _ = traced_matmuls(submission, inputs, rubric, 12)
    if twelve != two:
        fail(f"the forward issued {two} matrix multiplies for 2 heads and {twelve} for 12: the work grows "
             "with the number of heads, so the heads are computed one at a time (a loop over heads?). "
             "Project once, view as (b, T, H, head_dim), transpose to (b, H, T, head_dim) and let one "
             "batched matmul serve every head.")
    if two == 0:
        fail("the forward issued no matrix multiplies at all that the grader could see")


@pytest.mark.part("mha")
@pytest.mark.evidence("worker")
def test_no_ready_made_attention(submission, inputs, rubric):
    """the forward writes the attention itself (no scaled_dot_product_attention, nn.MultiheadAttention, flex)"""
    _, answer = traced_matmuls(submission, inputs, rubric, 4)
    used = [name for name, found in FORBIDDEN.items()
            if not rubric.apis.get(name, False) and found(answer.ops or [], answer.python_calls or [])]
    if used:
        fail(f"the forward calls {', '.join(used)}; the exercise is to write the computation yourself "
             "(scores, mask, softmax, weighted sum), so these are not allowed here")
