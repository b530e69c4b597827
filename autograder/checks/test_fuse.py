"""fuse_heads: a wrapper's heads become one MultiHeadAttention that computes the same quantity."""
import pytest
import torch

from autograder.checks.harness import assert_close, build_pair, fail, first_match, reference_forward
from autograder.checks.mistakes import describe_module_mistake, fuse_variants
from reference import mha as ref

# (d_in, head width, context_length, heads, qkv_bias)
CASES = {
    "2 heads": (3, 2, 6, 2, False),
    "3 heads, bias": (5, 4, 8, 3, True),
    "1 head": (4, 3, 5, 1, False),
    "6 heads, bias": (6, 2, 7, 6, True),
}


def fused_pair(submission, inputs, case):
    d_in, width, context, heads, bias = CASES[case]
    wrapper_ref, wrapper = build_pair(submission, inputs, "MultiHeadAttentionWrapper", d_in, width, context, 0.0,
                                      heads, qkv_bias=bias)
    fused = submission.call("fuse_heads", wrapper)
    if not hasattr(fused, "instance_of"):
        fail(f"fuse_heads returned {fused!r:.80}; it must return a MultiHeadAttention")
    if "MultiHeadAttention" not in fused.instance_of:
        fail(f"fuse_heads returned a {fused.cls}; it must return a MultiHeadAttention (your class)")
    return wrapper_ref, wrapper, fused


@pytest.mark.part("fuse")
@pytest.mark.parametrize("case", list(CASES))
def test_weights_placed_per_head(submission, inputs, rubric, case):
    """head h's weights become head h's columns, out_proj is the identity (checked with the reference forward)"""
    wrapper_ref, _, fused = fused_pair(submission, inputs, case)
    d_in, width, context, heads, bias = CASES[case]
    module = ref.MultiHeadAttention(d_in, width * heads, context, 0.0, heads, qkv_bias=bias)
    try:
        module.load_state_dict(fused.state_dict)
    except RuntimeError as exc:
        fail(f"the fused module's weights do not have the shapes of MultiHeadAttention({d_in}, {width * heads}, "
             f"..., num_heads={heads}): {str(exc)[:300]}")
    module = module.double().eval()
    x = inputs.randn(2, context, d_in)
    hint = describe_module_mistake(fused.state_dict, width * heads)
    assert_close(reference_forward(module, x), reference_forward(wrapper_ref, x), "float64", rubric,
                 f"the reference forward with your fused weights ({case})",
                 diagnose=lambda y: hint or first_match(y, fuse_variants(wrapper_ref, x)))


@pytest.mark.part("fuse")
@pytest.mark.parametrize("case", list(CASES))
def test_fused_output_equals_wrapper(submission, inputs, rubric, case):
    """your fused module's own forward gives exactly the wrapper's output"""
    wrapper_ref, _, fused = fused_pair(submission, inputs, case)
    x = inputs.randn(3, CASES[case][2], CASES[case][0])
    assert_close(submission.forward(fused, x).y, reference_forward(wrapper_ref, x), "float64", rubric,
                 f"fused module output vs the wrapper's ({case})")


@pytest.mark.part("fuse")
def test_wrapper_left_unchanged(submission, inputs):
    """fusing leaves the wrapper's own weights as they were"""
    wrapper_ref, wrapper, _ = fused_pair(submission, inputs, "3 heads, bias")
    after = submission.describe(wrapper).state_dict
    for name, tensor in wrapper_ref.state_dict().items():
        if name not in after or not torch.equal(after[name].double(), tensor.double()):
            fail(f"fuse_heads changed the wrapper's {name}; copy the weights into the new module instead")
