"""MultiHeadAttention.forward: the weight-split parallel pass, all heads in one batched computation.

The checks run from the most telling to the most specific: the book's example, shorter sequences,
hidden cases, then the properties (dtype and device, input unchanged, no caching, gradients, one pass
for all heads, no ready-made attention, dropout). A property counts only when the output on the
property's own case is right: a forward returning zeros earns nothing here.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from autograder.grading import graphs
from autograder.grading.checks.harness import (
    DTYPE_NOT_KEPT,
    HIDDEN_FROM_CAPTURE,
    IN_PLACE,
    NOT_REPLAYABLE,
    OTHER_DEVICE,
    READY_MADE,
    Failure,
    ForwardReply,
    Inputs,
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
    forward_checked,
    in_student_terms,
    note,
    reference_forward,
    replay,
    replay_state,
    replayed_forward,
    value_problem,
    values_first,
)
from autograder.grading.checks.mistakes import (
    mha_dropout_variants,
    mha_train_forward,
    mha_variants,
    raising_mistake,
)
from autograder.rubric import Rubric
from autograder.sandbox.client import Worker, WorkerError
from autograder.sandbox.protocol import DropRequest, Graph, ModuleInfo
from reference import mha as ref

FORWARD = "MultiHeadAttention.forward"

# (batch, tokens, d_in, d_out, context_length, heads, qkv_bias)
CASES: dict[str, tuple[int, int, int, int, int, int, bool]] = {
    "book sizes": (2, 6, 3, 2, 6, 2, False),
    "d_in != d_out, bias": (3, 7, 10, 8, 7, 4, True),
    "short sequence": (4, 3, 6, 12, 9, 3, False),
    "12 heads": (1, 8, 12, 24, 8, 12, True),
    "1 head": (2, 5, 4, 6, 5, 1, False),
}


def pair(
    submission: Submission,
    inputs: Inputs,
    case: str,
    dtype: torch.dtype = torch.float64,
    device: str = "cpu",
    dropout: float = 0.0,
) -> tuple[ref.MultiHeadAttention, ModuleInfo, tuple[int, int, int]]:
    batch, tokens, d_in, d_out, context, heads, bias = CASES[case]
    reference, module = build_pair(
        submission,
        inputs,
        ref.MultiHeadAttention,
        d_in,
        d_out,
        context,
        dropout,
        heads,
        dtype=dtype,
        device=device,
        qkv_bias=bias,
    )
    return reference, module, (batch, tokens, d_in)


def run(
    submission: Submission, reference: ref.MultiHeadAttention, module: ModuleInfo, x: torch.Tensor, **kwargs: Any
) -> ForwardReply:
    """The student's forward, with PyTorch's internal errors explained (a mask not cut to T x T, ...)."""
    context_length = reference.get_buffer("mask").shape[0]
    return forward_checked(
        submission,
        module,
        x,
        function=FORWARD,
        context_length=context_length,
        explain=lambda said: raising_mistake(reference, x, said),
        **kwargs,
    )


def output_problem(
    reference: ref.MultiHeadAttention, x: torch.Tensor, y: object, dtype_name: str, rubric: Rubric, what: str
) -> Failure | None:
    """None when y is the reference's output on x, else the failure message with a diagnosis."""
    x = x.to(reference.get_buffer("mask").device)
    return value_problem(
        y,
        reference_forward(reference, x).cpu(),
        dtype_name,
        rubric,
        what,
        diagnose=lambda y: first_match(y, {k: v.cpu() for k, v in mha_variants(reference, x).items()}),
    )


@pytest.mark.part("mha")
def test_book_example(submission: Submission, rubric: Rubric) -> None:
    """the book's example: MultiHeadAttention(3, 2, 6, 0.0, num_heads=2) gives (2, 6, 2)"""
    reference, module, x = book_pair(submission, ref.MultiHeadAttention, 3, 2, 6, 0.0, 2)
    fail_if(
        output_problem(
            reference, x, run(submission, reference, module, x).y, "float32", rubric, "output for the book's example"
        )
    )


@pytest.mark.part("mha")
def test_shorter_sequences(submission: Submission, inputs: Inputs, rubric: Rubric) -> None:
    """sequences shorter than context_length work (3 tokens and 1 token with context_length 9)"""
    reference, module, _ = pair(submission, inputs, "short sequence")
    for tokens in (3, 1):
        x = inputs.randn(2, tokens, reference.W_query.in_features)
        y = run(submission, reference, module, x).y
        fail_if(
            output_problem(reference, x, y, "float64", rubric, f"output for {tokens} token(s) with context_length 9")
        )


@pytest.mark.part("mha")
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(
    submission: Submission, inputs: Inputs, rubric: Rubric, device: str, dtype_name: str, case: str
) -> None:
    """the parallel forward equals the reference's on hidden weights and inputs"""
    dtype = getattr(torch, dtype_name)
    reference, module, shape = pair(submission, inputs, case, dtype, device)
    x = inputs.randn(*shape, dtype=dtype)
    answer = run(submission, reference, module, x)
    fail_if(output_problem(reference, x, answer.y, dtype_name, rubric, f"output ({case})"))
    if answer.y_device != str(x.to(device).device):
        fail(
            f"the output is on {answer.y_device}, the input on {device}: keep the input's device",
            diagnosis=OTHER_DEVICE,
        )


@pytest.mark.part("mha")
def test_keeps_dtype(submission: Submission, inputs: Inputs, rubric: Rubric, device: str) -> None:
    """a float32 input gives a float32 output, a float64 input a float64 output, on the input's device"""
    for dtype in (torch.float32, torch.float64):
        reference, module, shape = pair(submission, inputs, "book sizes", dtype, device)
        x = inputs.randn(*shape, dtype=dtype)
        answer = run(submission, reference, module, x)
        y = answer.y
        if not isinstance(y, torch.Tensor) or y.dtype != dtype:
            gave = f"a {dtype} input gave {getattr(y, 'dtype', type(y).__name__)}."
            fail(explained(gave, DTYPE_NOT_KEPT, DTYPE_NOT_KEPT))
        if answer.y_device != str(x.to(device).device):
            fail(
                f"the output is on {answer.y_device}, the input on {device}: keep the input's device",
                diagnosis=OTHER_DEVICE,
            )
        values_first(
            output_problem(reference, x, y, str(dtype).removeprefix("torch."), rubric, f"{dtype} output"),
            "Keeping the dtype",
        )


@pytest.mark.part("mha")
@pytest.mark.evidence("worker")
def test_input_not_modified(submission: Submission, inputs: Inputs, rubric: Rubric) -> None:
    """the forward leaves its input unchanged"""
    reference, module, shape = pair(submission, inputs, "d_in != d_out, bias")
    x = inputs.randn(*shape)
    answer = run(submission, reference, module, x)
    if not torch.equal(answer.x_after, x):
        in_place = IN_PLACE.format(function=FORWARD)
        fail(explained("the forward modified its input x in place.", f"{in_place}.", in_place))
    values_first(output_problem(reference, x, answer.y, "float64", rubric, "output"), "Leaving the input unchanged")


@pytest.mark.part("mha")
def test_new_inputs_new_answers(submission: Submission, inputs: Inputs, rubric: Rubric) -> None:
    """the same module gives the right answer for new inputs of the same shape (no caching)"""
    reference, module, shape = pair(submission, inputs, "d_in != d_out, bias")
    for attempt_number in range(3):
        x = inputs.randn(*shape)
        y = run(submission, reference, module, x).y
        fail_if(
            output_problem(
                reference,
                x,
                y,
                "float64",
                rubric,
                f"output for new input number {attempt_number + 1} of the same shape",
            )
        )


@pytest.mark.part("mha")
def test_gradients(submission: Submission, inputs: Inputs, rubric: Rubric) -> None:
    """gradients reach the input and every weight, equal to the reference's"""
    reference, module, shape = pair(submission, inputs, "d_in != d_out, bias")
    x = inputs.randn(*shape)
    grad_out = inputs.randn(*shape[:2], reference.d_out)
    answer, problem = attempt(submission.forward, module, x, grad_out=grad_out)
    if answer is None:  # the values first: a forward whose backward fails may be wrong already
        values_first(
            output_problem(reference, x, run(submission, reference, module, x).y, "float64", rubric, "output"),
            "The gradient check",
        )
        fail(in_student_terms(problem or Failure(""), FORWARD))
    values_first(output_problem(reference, x, answer.y, "float64", rubric, "output"), "The gradient check")
    x_ref = x.clone().requires_grad_(True)
    reference.zero_grad(set_to_none=True)
    backward(reference(x_ref), grad_out)
    check_gradients(
        answer, {"x": x_ref.grad, **{f"param:{n}": p.grad for n, p in reference.named_parameters()}}, rubric
    )


def captured(
    submission: Submission, inputs: Inputs, rubric: Rubric, replayer: Worker, heads: int, *, ready_made_ok: bool = False
) -> Graph:
    """The graph of the student's forward with `heads` heads, as the grader judges it: captured in the student's
    worker, its operations checked here (`graphs`), then replayed where no student code ever ran (`replayer`) on
    a new input and compared with the reference. So the graph judged is the forward's own: whatever the forward
    hid from the capture was frozen as a constant, and is wrong on the new input. A forward whose own output is
    wrong earns nothing here (its values first). With `ready_made_ok` (test_no_ready_made_attention itself), a
    graph that uses a ready-made attention is returned as it is, for that check to say so."""
    reference, module = build_pair(submission, inputs, ref.MultiHeadAttention, 12, 24, 6, 0.0, heads)
    x = inputs.randn(2, 6, 12)
    values_first(
        output_problem(
            reference, x, run(submission, reference, module, x).y, "float64", rubric, f"output ({heads} heads)"
        ),
        "This check of how the forward is organised",
    )
    known = reference.state_dict()
    capture = submission.capture(module, tuple(x.shape), "float64", list(known), rubric.graph.max_nodes)
    used = graphs.ready_made(capture.graph, rubric)
    if used and ready_made_ok:  # that check fails, saying so; nothing else to judge
        return capture.graph
    # A ready-made attention is charged once, by test_no_ready_made_attention: here its graph is still replayed,
    # for its values (it is never timed), and judged for its structure.
    problem = graphs.not_allowed(capture.graph, rubric, attention=bool(used))
    if problem is not None:
        fail(problem.message, mistake=NOT_REPLAYABLE, diagnosis=NOT_REPLAYABLE)
    module_replayed = replay(replayer, capture, replay_state(capture, known), "cpu")
    fresh = inputs.randn(2, 6, 12)
    y = replayed_forward(replayer, module_replayed, fresh)
    with contextlib.suppress(WorkerError):
        replayer.request(DropRequest(module_replayed.handle))
    if output_problem(reference, fresh, y, "float64", rubric, "replayed") is not None:
        said = (
            f"your forward ({heads} heads) is right on the grader's input, but the graph of PyTorch operations "
            "captured from it is not right on a new input."
        )
        fail(explained(said, f"{HIDDEN_FROM_CAPTURE}.", HIDDEN_FROM_CAPTURE))
    return capture.graph


@pytest.mark.part("mha")
def test_one_pass_for_all_heads(submission: Submission, inputs: Inputs, rubric: Rubric, replayer: Worker) -> None:
    """the forward runs as many matrix multiplies for 12 heads as for 2 (no loop over heads)"""
    two = graphs.matmuls(captured(submission, inputs, rubric, replayer, 2))
    twelve = graphs.matmuls(captured(submission, inputs, rubric, replayer, 12))
    note("counted", what="matrix multiplies of one forward, 12 heads against 2", expected=two, actual=twelve)
    if twelve != two:
        fail(
            f"the forward runs {two} matrix multiplies for 2 heads and {twelve} for 12: the work grows "
            "with the number of heads, so the heads are computed one at a time (a loop over heads?). "
            "Project once, view as (b, T, H, head_dim), transpose to (b, H, T, head_dim) and let one "
            "batched matmul serve every head.",
            mistake="the heads are computed one at a time (a loop over heads): the matrix multiplies grow with them",
        )
    if two == 0:
        fail("the forward runs no matrix multiplies at all")


@pytest.mark.part("mha")
def test_no_ready_made_attention(submission: Submission, inputs: Inputs, rubric: Rubric, replayer: Worker) -> None:
    """the forward writes the attention itself (no scaled_dot_product_attention, nn.MultiheadAttention, flex)"""
    used = graphs.ready_made(captured(submission, inputs, rubric, replayer, 4, ready_made_ok=True), rubric)
    if used:
        fail(
            f"the forward calls {', '.join(used)}; the exercise is to write the computation yourself "
            "(scores, mask, softmax, weighted sum), so these are not allowed here",
            mistake=READY_MADE,
        )


@pytest.mark.part("mha")
def test_dropout(submission: Submission, inputs: Inputs, rubric: Rubric, device: str) -> None:
    """dropout acts on the attention weights in training mode, and not at all in eval mode"""
    # the reference on the grading device: CPU and CUDA draw different dropout masks from one seed
    reference, module, shape = pair(submission, inputs, "d_in != d_out, bias", device=device, dropout=0.5)
    x = inputs.randn(*shape)
    y = run(submission, reference, module, x).y
    fail_if(
        output_problem(
            reference, x, y, "float64", rubric, "eval-mode output with dropout=0.5 (dropout must be inert in eval mode)"
        )
    )
    seed = inputs.seed_value()
    y = run(submission, reference, module, x, train=True, seed=seed).y
    what = "training-mode output with dropout=0.5 (apply self.dropout once, to the attention weights)"
    x = x.to(device)

    def variants() -> dict[str, torch.Tensor]:
        return {k: v.cpu() for k, v in mha_dropout_variants(reference, x, seed).items()}

    problem = value_problem(
        y,
        reference_forward(reference, x, train=True, seed=seed).cpu(),
        "float64",
        rubric,
        what,
        diagnose=lambda y: first_match(y, variants()),
    )
    # Dropout drawn one head at a time (as a loop over heads draws it) is still dropout on the attention
    # weights; the loop itself is charged in test_one_pass_for_all_heads.
    if (
        problem
        and value_problem(y, mha_train_forward(reference, x, seed, "weights_per_head").cpu(), "float64", rubric, what)
        is not None
    ):
        fail(problem)
