"""make_2d_wrapper: two heads, 2-D context vectors, and heads that still compute what a head computes.

make_2d_wrapper is graded on what it builds. Its output is right when it equals the reference's, or
when it equals the student's own MultiHeadAttentionWrapper built the right way (2 heads of width 1)
with the same weights: a mistake in the wrapper's forward or in combine is charged in those parts only.
The checks run structure first, then the book's example, then dropout and bias, then hidden cases.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from autograder.grading.checks.harness import (
    Failure,
    Inputs,
    NotCredited,
    Submission,
    attempt,
    book_batch,
    explained,
    fail,
    first_match,
    in_student_terms,
    reference_forward,
    value_problem,
    values_first,
)
from autograder.grading.checks.mistakes import HEAD_CHANGED, describe_changed_heads, named, wrapper_variants
from autograder.rubric import Rubric
from autograder.sandbox.protocol import ModuleInfo
from reference import mha as ref

# d_in, context_length, tokens
VISIBLE_CASES = {"d_in 3": (3, 6, 6), "d_in 8, short sequence": (8, 7, 5)}
HIDDEN_CASES = {"d_in 5": (5, 4, 4), "d_in 16, 2 of 9 tokens": (16, 9, 2)}


def built(submission: Submission, d_in: int, context: int, **kwargs: Any) -> ModuleInfo:
    call = f"make_2d_wrapper({d_in}, {context}{''.join(f', {k}={v!r}' for k, v in kwargs.items())})"
    module = submission.call("make_2d_wrapper", d_in, context, **kwargs)
    if not isinstance(module, ModuleInfo):
        fail(f"{call} returned {module!r:.80}; it must return a MultiHeadAttentionWrapper")
    return submission.to_device(module, "make_2d_wrapper")


def head_layout(state: dict[str, torch.Tensor]) -> list[tuple[int, ...]]:
    """[(d_out, d_in) of each head's W_query.weight], read off the state dict."""
    shapes: dict[int, tuple[int, ...]] = {}
    for name, tensor in state.items():
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "heads" and parts[1].isdigit() and parts[2:] == ["W_query", "weight"]:
            shapes[int(parts[1])] = tuple(tensor.shape)
    return [shapes[i] for i in sorted(shapes)]


def layout_problem(module: ModuleInfo, d_in: int, context: int, bias: bool) -> Failure | None:
    """What is wrong with what make_2d_wrapper built, read off its class and weights, in the exercise's terms."""
    if "MultiHeadAttentionWrapper" not in module.instance_of:
        return Failure(
            f"make_2d_wrapper returned a {module.cls}; return a MultiHeadAttentionWrapper",
            diagnosis="make_2d_wrapper does not return a MultiHeadAttentionWrapper",
        )
    state = module.state_dict or {}
    layout = head_layout(state)
    if len(layout) != 2:
        return Failure(
            f"the wrapper has {len(layout)} head(s); the exercise keeps num_heads=2 and changes only the "
            "width of each head (d_out=1), so two heads of width 1 give 2-D context vectors",
            diagnosis=f"the wrapper has {len(layout)} head(s), not 2",
        )
    changed = describe_changed_heads(state)
    if changed:
        return explained(
            "", f"{changed}. For 2-D context vectors keep num_heads=2 and pass d_out=1 to the wrapper.", HEAD_CHANGED
        )
    widths = [shape[0] for shape in layout]
    if widths != [1, 1]:
        return Failure(
            f"the heads have output widths {widths}; with 2 heads the combined width is 2 * d_out, "
            "so each head needs d_out=1",
            diagnosis="the heads are not of width 1",
        )
    if any(shape[1] != d_in for shape in layout):
        return Failure(
            f"the heads take inputs of width {[s[1] for s in layout]}, expected d_in={d_in}: pass d_in on",
            diagnosis="d_in is not passed on",
        )
    has_bias = [f"heads.{h}.W_query.bias" in state for h in range(2)]
    if bias and not all(has_bias):
        return Failure(
            f"make_2d_wrapper({d_in}, {context}, qkv_bias=True) built heads without biases: pass qkv_bias "
            "on, MultiHeadAttentionWrapper(..., qkv_bias=qkv_bias)",
            diagnosis="qkv_bias=True is not passed on",
        )
    if not bias and any(has_bias):
        return Failure(
            f"make_2d_wrapper({d_in}, {context}) built heads with biases although qkv_bias is False: pass "
            "qkv_bias on instead of fixing it",
            diagnosis="qkv_bias=False is not passed on",
        )
    mask = state.get("heads.0.mask")
    if isinstance(mask, torch.Tensor) and tuple(mask.shape) != (context, context):
        return Failure(
            f"the heads' causal masks are {tuple(mask.shape)} for context_length={context}: pass "
            "context_length on to the wrapper",
            diagnosis="context_length is not passed on",
        )
    expected = set(ref.make_2d_wrapper(d_in, context, qkv_bias=bias).state_dict())
    if set(state) != expected:
        odd = sorted(set(state) ^ expected)
        return Failure(f"the wrapper's weights are not those of 2 CausalAttention heads of width 1 (look at {odd[:3]})")
    return None


def reference_for(
    module: ModuleInfo, d_in: int, context: int, bias: bool, dropout: float = 0.0
) -> ref.MultiHeadAttentionWrapper:
    reference = ref.MultiHeadAttentionWrapper(d_in, 1, context, dropout, 2, qkv_bias=bias)
    state = module.state_dict or {}
    try:
        reference.load_state_dict(state)
    except (RuntimeError, TypeError) as exc:  # layout_problem has looked already; this is a last resort
        fail(f"the weights of make_2d_wrapper's wrapper do not fit 2 heads of width 1 ({str(exc)[:200]})")
    return reference.to(next(iter(state.values())).dtype).eval()


def output_problem(
    submission: Submission,
    module: ModuleInfo,
    d_in: int,
    context: int,
    bias: bool,
    x: torch.Tensor,
    rubric: Rubric,
    what: str,
    dropout: float = 0.0,
    train: bool = False,
    seed: int = 0,
) -> Failure | None:
    """None when the 2-D wrapper's output is right: the reference's, or that of the student's own
    MultiHeadAttentionWrapper built with d_out=1 and 2 heads (same weights, same dropout draw)."""
    reference = reference_for(module, d_in, context, bias, dropout).to(submission.device)
    x = x.to(reference.get_parameter("heads.0.W_query.weight").dtype)
    on_device = x.to(submission.device)  # a dropout draw is the worker's only on its device
    heads = [reference_forward(head, on_device).cpu() for head in reference.get_submodule("heads").children()]
    answer, problem = attempt(submission.forward, module, x, train=train, seed=seed, hooks=not train)
    if answer is not None:
        for call in answer.head_calls:
            if 0 <= call.index < 2 and (
                call.output is None or value_problem(call.output, heads[call.index], "float32", rubric, "") is not None
            ):
                return Failure(
                    named(
                        f"head {call.index} no longer computes what a CausalAttention computes on its own "
                        "weights: change only the argument that sizes each head (d_out), never what a head "
                        "computes",
                        HEAD_CHANGED,
                    )
                )
        expected = reference_forward(reference, on_device, train=train, seed=seed).cpu()
        problem = value_problem(
            answer.y,
            expected,
            "float32",
            rubric,
            what,
            diagnose=None if train else lambda y: first_match(y, wrapper_variants(heads)),
        )
        if problem is None:
            return None
    own = submission.build(
        "MultiHeadAttentionWrapper", d_in, 1, context, dropout, 2, qkv_bias=bias, state_dict=module.state_dict
    )
    mine, own_problem = attempt(submission.forward, own, x, train=train, seed=seed)
    if answer is not None and mine is not None and value_problem(answer.y, mine.y, "float32", rubric, what) is None:
        return None  # what your own wrapper computes: its forward and combine are graded in their parts
    if answer is None and own_problem is not None and module.cls == "MultiHeadAttentionWrapper":
        return None  # your own wrapper class, built right; its forward fails the same way (see wrapper)
    return in_student_terms(problem or Failure(""), "the 2-D wrapper's forward (MultiHeadAttentionWrapper.forward)")


@pytest.mark.part("two_dim")
@pytest.mark.parametrize("case", list(VISIBLE_CASES))
def test_two_heads_of_width_one(submission: Submission, inputs: Inputs, rubric: Rubric, case: str) -> None:
    """make_2d_wrapper keeps 2 heads and gives each a 1-dimensional output"""
    d_in, context, tokens = VISIBLE_CASES[case]
    module = built(submission, d_in, context)
    problem = layout_problem(module, d_in, context, bias=False)
    if problem:
        fail(problem)
    x = inputs.randn(3, tokens, d_in, dtype=torch.float32)
    values_first(
        output_problem(submission, module, d_in, context, False, x, rubric, "2-D wrapper output"),
        "The wrapper's layout",
    )


@pytest.mark.part("two_dim")
def test_book_example(submission: Submission, rubric: Rubric) -> None:
    """the book's example gives (2, 6, 2) context vectors"""
    module = built(submission, 3, 6)
    problem = layout_problem(module, 3, 6, bias=False)
    if problem:
        fail(problem.after("make_2d_wrapper(3, 6) must build 2 heads of width 1 for the book's 3-D embeddings: "))
    problem = output_problem(
        submission, module, 3, 6, False, book_batch(), rubric, "2-D wrapper output for the book's example"
    )
    if problem:
        fail(problem)


@pytest.mark.part("two_dim")
def test_passes_dropout_and_bias_on(submission: Submission, inputs: Inputs, rubric: Rubric) -> None:
    """make_2d_wrapper passes dropout and qkv_bias on to the wrapper"""
    d_in, context = 5, 6
    module = built(submission, d_in, context, dropout=0.5, qkv_bias=True)
    problem = layout_problem(module, d_in, context, bias=True)
    if problem:
        fail(problem)
    x = inputs.randn(2, context, d_in, dtype=torch.float32)
    seed = inputs.seed_value()
    what = "training-mode output of make_2d_wrapper(5, 6, dropout=0.5, qkv_bias=True)"
    problem = output_problem(
        submission, module, d_in, context, True, x, rubric, what, dropout=0.5, train=True, seed=seed
    )
    if problem is None:
        return
    undropped = reference_forward(reference_for(module, d_in, context, True), x)
    answer, _ = attempt(submission.forward, module, x, train=True, seed=seed)
    if answer is not None and value_problem(answer.y, undropped, "float32", rubric, "") is None:
        fail(
            "make_2d_wrapper(5, 6, dropout=0.5) built a wrapper that does not drop anything in training mode: "
            "pass dropout on, MultiHeadAttentionWrapper(d_in, 1, context_length, dropout, ...)"
        )
    fail(problem)


@pytest.mark.part("two_dim")
@pytest.mark.parametrize("case", list(HIDDEN_CASES))
def test_output_is_the_heads_side_by_side(submission: Submission, inputs: Inputs, rubric: Rubric, case: str) -> None:
    """the 2-D output is the concatenation of the two unchanged heads' outputs"""
    d_in, context, tokens = HIDDEN_CASES[case]
    module = built(submission, d_in, context)
    if layout_problem(module, d_in, context, bias=False):
        raise NotCredited(
            "not credited: the output is checked once make_2d_wrapper builds 2 heads of width 1 (see the checks above)"
        )
    x = inputs.randn(3, tokens, d_in, dtype=torch.float32)
    problem = output_problem(submission, module, d_in, context, False, x, rubric, f"2-D wrapper output ({case})")
    if problem:
        fail(problem)
