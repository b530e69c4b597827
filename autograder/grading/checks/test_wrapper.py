"""MultiHeadAttentionWrapper.forward: every head on the same x, one after another, then combine.

The wrapper is graded on what it adds, not on combine: its output is right when it equals the
reference's, or, when the student's combine differs from the reference's, exactly the student's own
combine of the heads' outputs (combine's mistake is charged in combine alone). The checks run from the
most telling to the most specific: the book's example, the heads' calls, hidden cases, then the
properties (input unchanged, gradients, dropout), which count only when the output is right. While
combine raises, the forward runs with a stand-in for it that gives values only: the gradients cannot flow
through it, so the gradient check is not charged then (it earns its points and waits for combine).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from autograder.grading.checks.harness import (
    WORKER_MISTAKES,
    Failure,
    ForwardReply,
    Inputs,
    NotCharged,
    Raised,
    Submission,
    attempt,
    backward,
    book_pair,
    build_pair,
    check_gradients,
    explained,
    fail,
    fail_if,
    first_match,
    in_student_terms,
    mistake_of,
    seed_torch,
    value_problem,
    values_first,
)
from autograder.grading.checks.mistakes import HEADS_REVERSED, wrapper_variants
from autograder.rubric import Rubric
from autograder.sandbox.protocol import ModuleInfo
from reference import mha as ref

FORWARD = "MultiHeadAttentionWrapper.forward"
# The gradient check while combine raises: the forward's values came with a stand-in for combine, values only.
STAND_IN_GRADIENTS = (
    "waiting: the gradients are checked once combine runs: the forward ran with a stand-in for combine that gives "
    "its values only, and no gradient flows through values. This check waits for part combine and costs nothing "
    "here: the mistake is charged once, in part combine"
)

# (batch, tokens, d_in, d_out per head, context_length, heads, qkv_bias)
CASES: dict[str, tuple[int, int, int, int, int, int, bool]] = {
    "2 heads": (2, 6, 3, 2, 6, 2, False),
    "4 heads, bias": (3, 5, 8, 3, 8, 4, True),
    "1 head": (1, 4, 5, 4, 4, 1, False),
    "12 heads, short sequence": (4, 3, 6, 2, 10, 12, False),
}


def case_args(case: str) -> tuple[tuple[int, int, int], tuple[int, int, int, float, int], dict[str, bool]]:
    batch, tokens, d_in, d_out, context, heads, bias = CASES[case]
    return (batch, tokens, d_in), (d_in, d_out, context, 0.0, heads), {"qkv_bias": bias}


def reference_heads(
    reference: ref.MultiHeadAttentionWrapper, x: torch.Tensor, train: bool = False, seed: int = 0
) -> list[torch.Tensor]:
    """Each reference head's output on x, in order, dropout drawn from `seed` as the wrapper draws it."""
    x = x.to(next(reference.parameters()).device)
    reference.train(train)
    seed_torch(seed)
    with torch.no_grad():
        outputs = [head(x).cpu() for head in reference.get_submodule("heads").children()]
    reference.eval()
    return outputs


def own_combine(submission: Submission, inputs: Inputs, heads: list[torch.Tensor]) -> torch.Tensor | None:
    """The student's own combine of these head outputs, when it depends on them. None when it raises, or
    when it gives the same answer for other heads' outputs: then it says nothing about the wrapper."""
    own = submission.try_call("combine", heads)
    if not isinstance(own, torch.Tensor):
        return None
    other = submission.try_call("combine", [inputs.randn(*h.shape, dtype=h.dtype) for h in heads])
    if isinstance(other, torch.Tensor) and other.shape == own.shape and torch.equal(other, own):
        return None
    return own


def output_problem(
    submission: Submission,
    inputs: Inputs,
    rubric: Rubric,
    reference: ref.MultiHeadAttentionWrapper,
    x: torch.Tensor,
    y: object,
    dtype_name: str,
    what: str,
    train: bool = False,
    seed: int = 0,
) -> Failure | None:
    """None when the wrapper's output y is right (see the module's docstring), else the failure message."""
    heads = reference_heads(reference, x, train, seed)
    problem = value_problem(
        y, ref.combine(heads), dtype_name, rubric, what, diagnose=lambda y: first_match(y, wrapper_variants(heads))
    )
    if problem is None:
        return None
    own = own_combine(submission, inputs, heads)
    if own is not None and value_problem(y, own, dtype_name, rubric, what) is None:
        return None  # the wrapper did its part with the student's combine
    return problem


def run_wrapper(
    submission: Submission,
    reference: ref.MultiHeadAttentionWrapper,
    module: ModuleInfo,
    x: torch.Tensor,
    **kwargs: Any,
) -> ForwardReply:
    """The wrapper's forward. When it fails and the student's combine raises (or is missing) on the heads'
    right outputs, the forward runs again with a stand-in for combine that answers this input's heads' outputs
    with their right combination (values, computed here): the wrapper is graded on what it adds, combine's
    mistake is charged in combine alone. Any other failure (a stub left in the forward, an error in its own
    lines, other values handed to combine) is the wrapper's own."""
    answer, problem = attempt(submission.forward, module, x, **kwargs)
    if answer is not None:
        return answer
    heads = reference_heads(reference, x, kwargs.get("train", False), kwargs.get("seed", 0))
    if mistake_of(problem) not in WORKER_MISTAKES.values() and combine_raises(submission, heads):
        with submission.standing_in("combine", [([heads], ref.combine(heads))]):
            answer, problem = attempt(submission.forward, module, x, **kwargs)
        if answer is not None:
            return answer
    fail(in_student_terms(problem or Failure(""), FORWARD))


def combine_raises(submission: Submission, heads: list[torch.Tensor]) -> bool:
    """Whether the student's combine raises, or is not defined, on these (right) heads' outputs."""
    return isinstance(submission.try_call("combine", heads), Raised)


@pytest.mark.part("wrapper")
def test_book_example(submission: Submission, inputs: Inputs, rubric: Rubric) -> None:
    """the wrapper reproduces the book's (2, 6, 4) context vectors"""
    reference, module, x = book_pair(submission, ref.MultiHeadAttentionWrapper, 3, 2, 6, 0.0, 2)
    y = run_wrapper(submission, reference, module, x).y
    fail_if(
        output_problem(submission, inputs, rubric, reference, x, y, "float32", "wrapper output for the book's example")
    )


@pytest.mark.part("wrapper")
@pytest.mark.evidence("worker")
def test_heads_run_once_in_order_on_same_input(submission: Submission, inputs: Inputs, rubric: Rubric) -> None:
    """each head is called once, in order, on the same input x"""
    reference, module = build_pair(submission, inputs, ref.MultiHeadAttentionWrapper, 4, 2, 5, 0.0, 4)
    x = inputs.randn(2, 5, 4)
    answer = run_wrapper(submission, reference, module, x, hooks=True)
    order = [c.index for c in answer.head_calls]
    if order != [0, 1, 2, 3]:
        said = (
            f"the heads ran in the order {order}; the wrapper must call every head of self.heads once, "
            "in order (head 0 first): [head(x) for head in self.heads]"
        )
        fail(explained(said, HEADS_REVERSED, HEADS_REVERSED) if order == [3, 2, 1, 0] else said)
    changed = [c.index for c in answer.head_calls if not c.same_values]
    if changed:
        fail(f"head(s) {changed} did not receive the wrapper's input x unchanged; every head must see the same x")
    values_first(
        output_problem(submission, inputs, rubric, reference, x, answer.y, "float64", "wrapper output"),
        "Calling the heads in order",
    )


@pytest.mark.part("wrapper")
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(
    submission: Submission, inputs: Inputs, rubric: Rubric, device: str, dtype_name: str, case: str
) -> None:
    """the wrapper's output equals the reference's on hidden weights and inputs"""
    dtype = getattr(torch, dtype_name)
    shape, args, kwargs = case_args(case)
    reference, module = build_pair(
        submission, inputs, ref.MultiHeadAttentionWrapper, *args, dtype=dtype, device=device, **kwargs
    )
    x = inputs.randn(*shape, dtype=dtype)
    y = run_wrapper(submission, reference, module, x).y
    fail_if(
        output_problem(submission, inputs, rubric, reference, x.to(device), y, dtype_name, f"wrapper output ({case})")
    )


@pytest.mark.part("wrapper")
@pytest.mark.evidence("worker")
def test_input_not_modified(submission: Submission, inputs: Inputs, rubric: Rubric) -> None:
    """the forward leaves its input unchanged"""
    reference, module = build_pair(submission, inputs, ref.MultiHeadAttentionWrapper, 4, 2, 5, 0.0, 2)
    x = inputs.randn(2, 5, 4)
    answer = run_wrapper(submission, reference, module, x)
    if not torch.equal(answer.x_after, x):
        fail("the wrapper's forward modified its input x in place; work on new tensors instead")
    values_first(
        output_problem(submission, inputs, rubric, reference, x, answer.y, "float64", "wrapper output"),
        "Leaving the input unchanged",
    )


@pytest.mark.part("wrapper")
def test_gradients(submission: Submission, inputs: Inputs, rubric: Rubric) -> None:
    """gradients reach the input and every head's weights, equal to the reference's"""
    reference, module = build_pair(submission, inputs, ref.MultiHeadAttentionWrapper, 5, 3, 6, 0.0, 3, qkv_bias=True)
    x = inputs.randn(2, 6, 5)
    y = run_wrapper(submission, reference, module, x).y
    right = value_problem(y, ref.combine(reference_heads(reference, x)), "float64", rubric, "") is None
    if not right:
        values_first(
            output_problem(submission, inputs, rubric, reference, x, y, "float64", "wrapper output"),
            "The gradient check",
        )
    grad_out = inputs.randn(*y.shape)
    answer, problem = attempt(submission.forward, module, x, grad_out=grad_out)
    if answer is None:
        if mistake_of(problem) not in WORKER_MISTAKES.values() and combine_raises(
            submission, reference_heads(reference, x)
        ):
            raise NotCharged(STAND_IN_GRADIENTS)
        fail(in_student_terms(problem or Failure(""), FORWARD))
    names = ["x", *(f"param:{n}" for n, _ in reference.named_parameters())]
    if not right:
        # The output is your combine's, not the reference's: its gradients cannot be computed here,
        # so check only that they reach the input and every weight.
        if answer.grad_problem:
            fail(answer.grad_problem)
        missing = [n for n in names if (answer.grads or {}).get(n) is None]
        if missing:
            fail(
                f"no gradient reached {missing[0].removeprefix('param:')}: is it used in the computation, "
                "without .detach() or torch.no_grad()?",
                diagnosis=f"no gradient reached {missing[0].removeprefix('param:')}",
            )
        return
    x_ref = x.clone().requires_grad_(True)
    reference.zero_grad(set_to_none=True)
    backward(reference(x_ref), grad_out)
    check_gradients(
        answer, {"x": x_ref.grad, **{f"param:{n}": p.grad for n, p in reference.named_parameters()}}, rubric
    )


@pytest.mark.part("wrapper")
def test_dropout(submission: Submission, inputs: Inputs, rubric: Rubric, device: str) -> None:
    """dropout acts on the attention weights in training mode, and not at all in eval mode"""
    # the reference on the grading device: CPU and CUDA draw different dropout masks from one seed
    reference, module = build_pair(submission, inputs, ref.MultiHeadAttentionWrapper, 4, 3, 6, 0.5, 2, device=device)
    x = inputs.randn(2, 6, 4)
    y = run_wrapper(submission, reference, module, x).y
    what = "eval-mode output with dropout=0.5 (dropout must be inert in eval mode)"
    fail_if(output_problem(submission, inputs, rubric, reference, x, y, "float64", what))
    seed = inputs.seed_value()
    y = run_wrapper(submission, reference, module, x, train=True, seed=seed).y
    what = "training-mode output with dropout=0.5 (each head drops its attention weights, heads in order)"
    fail_if(output_problem(submission, inputs, rubric, reference, x, y, "float64", what, train=True, seed=seed))
