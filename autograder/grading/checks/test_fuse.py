"""fuse_heads: a wrapper's heads become one MultiHeadAttention that computes the same quantity.

fuse_heads is graded on what it builds, not on the student's MultiHeadAttention.forward: its weights
are run through the reference forward, and its own forward is compared with the student's own
MultiHeadAttention built right and given the right weights (so a bug in forward is charged in mha
alone). Keeping the wrapper's dtype and device is a small check of its own. The other checks count
only when the weights are right on their own case. While the student's
head_column_ranges is wrong, fuse_heads runs with a stand-in for it (the right ranges for the check's sizes,
as values), so that a mistake in the ranges is charged in the columns part alone. Where the student's
MultiHeadAttention does not keep the given constructor, fuse_heads is judged where it can be: with an extra
weight of the student's own beside the given ones, on the given ones; with other attributes, other shapes or
other arguments it cannot be (no values stand in for a class), and its checks are not charged: they earn their
points and wait for the mha part, where the mistake is charged once.
"""

from __future__ import annotations

import pytest
import torch

from autograder.grading.checks.harness import (
    CONSTRUCTOR_CAUSE,
    LIKELY_CAUSE,
    Failure,
    Inputs,
    NotCredited,
    Submission,
    assert_close,
    attempt,
    build_pair,
    constructor_problem,
    explained,
    fail,
    first_match,
    in_student_terms,
    mistake_of,
    reference_forward,
    value_problem,
    values_first,
)
from autograder.grading.checks.mistakes import (
    describe_module_mistake,
    fuse_variants,
    misplaced_block,
    wrong_ranges,
)
from autograder.rubric import Rubric
from autograder.sandbox.protocol import ModuleInfo
from reference import mha as ref

# (d_in, head width, context_length, heads, qkv_bias)
CASES: dict[str, tuple[int, int, int, int, bool]] = {
    "2 heads": (3, 2, 6, 2, False),
    "3 heads, bias": (5, 4, 8, 3, True),
    "1 head": (4, 3, 5, 1, False),
    "6 heads, bias": (6, 2, 7, 6, True),
}
NAME_OF_DTYPE = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
}
DTYPE_HINT = (
    "fuse_heads' module does not have the wrapper's dtype: MultiHeadAttention(...) is created in the "
    "default dtype (float32) on the CPU; move it to the wrapper's, e.g. .to(wrapper.heads[0].W_query.weight)"
)
NOT_ON_DEVICE = "fuse_heads' module is not on the wrapper's device: create it there"


def fused_pair(
    submission: Submission, inputs: Inputs, case: str
) -> tuple[ref.MultiHeadAttentionWrapper, ModuleInfo, ModuleInfo]:
    """The reference wrapper, the student's wrapper with the same weights, and fuse_heads of the latter."""
    d_in, width, context, heads, bias = CASES[case]
    wrapper_ref, wrapper = build_pair(
        submission, inputs, ref.MultiHeadAttentionWrapper, d_in, width, context, 0.0, heads, qkv_bias=bias
    )
    fused, problem = fuse(submission, wrapper, width, heads)
    if problem:
        if "object has no attribute" in problem.message:  # fuse_heads may use what the given constructor makes
            constructor_kept(submission, d_in, width * heads, context, heads, bias)
        fail(problem)
    if not isinstance(fused, ModuleInfo):
        fail(f"fuse_heads returned {fused!r:.80}; it must return a MultiHeadAttention")
    if "MultiHeadAttention" not in fused.instance_of:
        fail(f"fuse_heads returned a {fused.cls}; it must return a MultiHeadAttention (your class)")
    return wrapper_ref, wrapper, fused


def fuse(submission: Submission, wrapper: ModuleInfo, width: int, heads: int) -> tuple[object, Failure | None]:
    """fuse_heads of the student's wrapper. While the student's head_column_ranges is wrong (or raises) for these
    sizes, fuse_heads runs with a stand-in for it that answers them with the right ranges (values only): fuse
    is graded on what it adds, the ranges' mistake is charged in the columns part alone."""
    wrong, unknown = attempt(wrong_ranges, submission, width * heads, heads)  # unknown: it hangs or crashes
    if wrong is None or unknown:
        return attempt(submission.call, "fuse_heads", wrapper)
    with submission.standing_in(
        "head_column_ranges", [([width * heads, heads], ref.head_column_ranges(width * heads, heads))]
    ):
        return attempt(submission.call, "fuse_heads", wrapper)


def constructor_kept(submission: Submission, d_in: int, d_out: int, context: int, heads: int, bias: bool) -> None:
    """Not charged, pointing to the mha part's diagnosis, when the student's MultiHeadAttention is not built
    by the given constructor (which fuse_heads fills): other arguments, or other weights. The mistake is the
    mha part's, charged there once (`scoring.name_once`, by the cause's owner)."""
    expected = ref.MultiHeadAttention(d_in, d_out, context, 0.0, heads, qkv_bias=bias).state_dict()
    built, _ = attempt(submission.build, "MultiHeadAttention", d_in, d_out, context, 0.0, heads, qkv_bias=bias)
    state = getattr(built, "state_dict", None)
    words = constructor_problem("MultiHeadAttention", expected, state) if state is not None else None
    if words:
        raise NotCredited(words, cause=CONSTRUCTOR_CAUSE.format("MultiHeadAttention"), owner="mha")


def given_weights(
    submission: Submission,
    state: dict[str, torch.Tensor],
    expected: set[str],
    d_in: int,
    d_out: int,
    context: int,
    heads: int,
    bias: bool,
) -> dict[str, torch.Tensor]:
    """The fused weights to judge. Where the student's MultiHeadAttention keeps every weight of the given
    constructor and adds its own (an extra parameter, which the grader cannot fill: charged in mha), fuse_heads
    is judged on the given ones, as the reference's forward reads them. Any other layout of the student's own
    cannot be judged: not charged (`constructor_kept`); else the fused module's weights are fuse_heads' own."""
    extras = set(state) - expected
    if extras and expected <= set(state):
        built, _ = attempt(submission.build, "MultiHeadAttention", d_in, d_out, context, 0.0, heads, qkv_bias=bias)
        own = set(getattr(built, "state_dict", None) or {})
        if own == expected | extras:
            return {name: tensor for name, tensor in state.items() if name in expected}
    constructor_kept(submission, d_in, d_out, context, heads, bias)
    return state


def placement_problem(
    submission: Submission,
    inputs: Inputs,
    rubric: Rubric,
    case: str,
    wrapper_ref: ref.MultiHeadAttentionWrapper,
    fused: ModuleInfo,
) -> Failure | None:
    """None when the fused weights, run through the reference forward, reproduce the wrapper."""
    d_in, width, context, heads, bias = CASES[case]
    state = fused.state_dict or {}
    module = ref.MultiHeadAttention(d_in, width * heads, context, 0.0, heads, qkv_bias=bias)
    expected = module.state_dict()
    if set(state) != set(expected):  # perhaps the student's MultiHeadAttention is made otherwise
        state = given_weights(submission, state, set(expected), d_in, width * heads, context, heads, bias)
    for name, tensor in expected.items():
        if name not in state or not isinstance(state[name], torch.Tensor) or state[name].shape != tensor.shape:
            got = tuple(state[name].shape) if isinstance(state.get(name), torch.Tensor) else "nothing"
            return Failure(
                f"the fused module's {name} is {got}, expected {tuple(tensor.shape)}: fuse_heads must build "
                f"MultiHeadAttention(d_in={d_in}, d_out={width * heads}, context_length={context}, dropout, "
                f"num_heads={heads}, qkv_bias={bias}), taking every size from the wrapper"
            )
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        return Failure(
            f"the fused module has weights a MultiHeadAttention(..., qkv_bias={bias}) does not have: {unexpected[:3]}"
        )
    module.load_state_dict({k: v.double() if v.is_floating_point() else v for k, v in state.items()})
    module = module.double().eval()
    x = inputs.randn(2, context, d_in)
    # the weights' own precision: a float32 copy of float64 weights is a dtype mistake, charged in its own check
    dtype_name = NAME_OF_DTYPE.get(state["W_query.weight"].dtype, "float64")
    problem = value_problem(
        reference_forward(module, x),
        reference_forward(wrapper_ref, x),
        dtype_name,
        rubric,
        f"the reference forward with your fused weights ({case})",
        diagnose=lambda y: (
            describe_module_mistake(state, wrapper_ref)
            or first_match(y, fuse_variants(wrapper_ref, x))
            or misplaced_block(state, wrapper_ref)
        ),
    )
    if problem is None:
        return None
    note = wrong_ranges(submission, width * heads, heads)
    if not note:
        return Failure(problem.message, mistake_of(problem), detail=problem.detail)
    cause = explained(
        problem.message,
        f"{note}. If fuse_heads places each head's weights with head_column_ranges, fix that first (see the columns "
        "checks).",
        mistake_of(problem),
        label=LIKELY_CAUSE,
    )
    # where the likely mistake the values show is said elsewhere, the row keeps what comes before it
    return Failure(cause.message, cause.mistake, detail=problem.detail or cause.detail)


@pytest.mark.part("fuse")
@pytest.mark.parametrize("case", list(CASES))
def test_weights_placed_per_head(submission: Submission, inputs: Inputs, rubric: Rubric, case: str) -> None:
    """head h's weights become head h's columns, out_proj is the identity (checked with the reference forward)"""
    wrapper_ref, _, fused = fused_pair(submission, inputs, case)
    problem = placement_problem(submission, inputs, rubric, case, wrapper_ref, fused)
    if problem:
        fail(problem)


@pytest.mark.part("fuse")
def test_keeps_dtype_and_device(submission: Submission, inputs: Inputs, rubric: Rubric, device: str) -> None:
    """the fused module has the wrapper's dtype (float64 here) and device"""
    case = "3 heads, bias"
    wrapper_ref, _, fused = fused_pair(submission, inputs, case)
    values_first(placement_problem(submission, inputs, rubric, case, wrapper_ref, fused), "Keeping the dtype")
    dtypes = sorted(
        {
            str(t.dtype).removeprefix("torch.")
            for name, t in (fused.state_dict or {}).items()
            if name != "mask" and isinstance(t, torch.Tensor) and t.is_floating_point()
        }
    )
    if dtypes != ["float64"]:
        weights = f"For a float64 wrapper the fused module's weights are {', '.join(dtypes)}."
        fail(explained("", f"{DTYPE_HINT}. {weights}", DTYPE_HINT))
    if device != "cpu":
        d_in, _, context, _, _ = CASES[case]
        _, problem = attempt(submission.forward, fused, inputs.randn(1, context, d_in))
        if problem and "device" in problem.message:
            moved = f"{NOT_ON_DEVICE}, e.g. .to(wrapper.heads[0].W_query.weight)"
            fail(explained("", f"{moved}.\n{problem}", NOT_ON_DEVICE))


@pytest.mark.part("fuse")
@pytest.mark.parametrize("case", list(CASES))
def test_fused_output_equals_wrapper(
    submission: Submission, inputs: Inputs, rubric: Rubric, device: str, case: str
) -> None:
    """your fused module's own forward computes what your MultiHeadAttention computes with the wrapper's weights"""
    wrapper_ref, _, fused = fused_pair(submission, inputs, case)
    values_first(placement_problem(submission, inputs, rubric, case, wrapper_ref, fused), "The fused module's forward")
    d_in, width, context, heads, bias = CASES[case]
    state = fused.state_dict or {}
    dtype = state["W_query.weight"].dtype  # a dtype mistake is charged in test_keeps_dtype_and_device alone
    dtype_name = NAME_OF_DTYPE.get(dtype, "float64")
    right = {k: v.detach().cpu().to(dtype) for k, v in ref.fuse_heads(wrapper_ref).state_dict().items()}
    own = submission.build(
        "MultiHeadAttention", d_in, width * heads, context, 0.0, heads, qkv_bias=bias, state_dict=right, dtype=dtype
    )
    x = inputs.randn(3, context - 1, d_in, dtype=dtype)
    mine, _ = attempt(submission.forward, own, x)
    if mine is None:
        return  # your MultiHeadAttention.forward fails on its own (see mha): nothing here to compare with
    answer, problem = attempt(submission.forward, fused, x)
    if answer is None:
        if device != "cpu" and problem is not None and "device" in problem.message:
            return  # charged in test_keeps_dtype_and_device
        fail(in_student_terms(problem or Failure(""), "the fused module's forward"))
    assert_close(
        answer.y,
        mine.y,
        dtype_name,
        rubric,
        f"fused module output vs your own MultiHeadAttention with the wrapper's weights ({case}); check the "
        "arguments fuse_heads passes to MultiHeadAttention (num_heads, context_length, dropout)",
    )


@pytest.mark.part("fuse")
def test_wrapper_left_unchanged(submission: Submission, inputs: Inputs, rubric: Rubric) -> None:
    """fusing leaves the wrapper's own weights as they were"""
    case = "3 heads, bias"
    wrapper_ref, wrapper, fused = fused_pair(submission, inputs, case)
    after = submission.describe(wrapper).state_dict or {}
    for name, tensor in wrapper_ref.state_dict().items():
        if name not in after or not torch.equal(after[name].double(), tensor.double()):
            fail(f"fuse_heads changed the wrapper's {name}; copy the weights into the new module instead")
    values_first(
        placement_problem(submission, inputs, rubric, case, wrapper_ref, fused), "Leaving the wrapper unchanged"
    )
