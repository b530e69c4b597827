"""make_2d_wrapper: two heads, 2-D context vectors, and heads that still compute what a head computes."""
import pytest
import torch

from autograder.checks.harness import assert_close, book_batch, fail, first_match, reference_forward
from autograder.checks.mistakes import describe_changed_heads, wrapper_variants
from reference import mha as ref

CASES = {"d_in 3": (3, 6, False), "d_in 8, bias": (8, 5, True)}


def built(submission, d_in, context, bias):
    module = submission.call("make_2d_wrapper", d_in, context, dropout=0.0, qkv_bias=bias)
    if not hasattr(module, "instance_of"):
        fail(f"make_2d_wrapper returned {module!r:.80}; it must return a MultiHeadAttentionWrapper")
    return module


def head_layout(module):
    """[(d_out, d_in) of each head's W_query.weight], read off the state dict."""
    shapes = {}
    for name, tensor in module.state_dict.items():
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "heads" and parts[2] == "W_query" and parts[3] == "weight":
            shapes[int(parts[1])] = tuple(tensor.shape)
    return [shapes[i] for i in sorted(shapes)]


@pytest.mark.part("two_dim")
@pytest.mark.parametrize("case", list(CASES))
def test_two_heads_of_width_one(submission, case):
    """make_2d_wrapper keeps 2 heads and gives each a 1-dimensional output"""
    d_in, context, bias = CASES[case]
    module = built(submission, d_in, context, bias)
    if "MultiHeadAttentionWrapper" not in module.instance_of:
        fail(f"make_2d_wrapper returned a {module.cls}; return a MultiHeadAttentionWrapper")
    layout = head_layout(module)
    if len(layout) != 2:
        fail(f"the wrapper has {len(layout)} head(s); the exercise keeps num_heads=2 and changes only the "
             "width of each head (d_out=1), so two heads of width 1 give 2-D context vectors")
    changed = describe_changed_heads(module.state_dict)
    if changed:
        fail(f"Likely mistake: {changed}. For 2-D context vectors keep num_heads=2 and pass d_out=1 to the wrapper.")
    widths = [shape[0] for shape in layout]
    if widths != [1, 1]:
        fail(f"the heads have output widths {widths}; with 2 heads the combined width is 2 * d_out, "
             "so each head needs d_out=1")
    if any(shape[1] != d_in for shape in layout):
        fail(f"the heads take inputs of width {[s[1] for s in layout]}, expected d_in={d_in}")


@pytest.mark.part("two_dim")
@pytest.mark.parametrize("case", list(CASES))
def test_output_is_the_heads_side_by_side(submission, inputs, rubric, case):
    """the 2-D output is the concatenation of the two unchanged heads' outputs"""
    d_in, context, bias = CASES[case]
    module = built(submission, d_in, context, bias)
    if len(head_layout(module)) != 2 or [s[0] for s in head_layout(module)] != [1, 1]:
        fail("make_2d_wrapper must build 2 heads of width 1 (see the check above) before its output can be checked")
    reference = ref.MultiHeadAttentionWrapper(d_in, 1, context, 0.0, 2, qkv_bias=bias)
    try:
        reference.load_state_dict(module.state_dict)
    except RuntimeError as exc:
        fail(f"the wrapper's weights do not fit a 2-head wrapper of width 1: {exc}")
    reference = reference.eval()  # float32, like the module make_2d_wrapper builds
    x = inputs.randn(3, context, d_in, dtype=torch.float32)
    answer = submission.forward(module, x, hooks=True)
    for call in answer.head_calls:
        head = reference.heads[call.index]
        expected = reference_forward(head, x)
        if call.output is None or call.output.shape != expected.shape or not torch.allclose(
                call.output, expected, rtol=1e-4, atol=1e-5):
            fail(f"head {call['index']} no longer computes causal attention on its own weights: change only "
                 "the argument that sizes each head (d_out) or the gathering step, never what a head computes")
    heads = [reference_forward(head, x) for head in reference.heads]
    assert_close(answer.y, reference_forward(reference, x), "float32", rubric, "2-D wrapper output",
                 diagnose=lambda y: first_match(y, wrapper_variants(heads)))


@pytest.mark.part("two_dim")
def test_book_example(submission, rubric):
    """the book's example gives (2, 6, 2) context vectors"""
    module = built(submission, 3, 6, False)
    reference = ref.make_2d_wrapper(3, 6).eval()
    try:
        reference.load_state_dict(module.state_dict)
    except RuntimeError:
        fail("make_2d_wrapper(3, 6) must build 2 heads of width 1 for the book's 3-D embeddings")
    x = book_batch()
    assert_close(submission.forward(module, x).y, reference_forward(reference, x), "float32", rubric,
                 "2-D wrapper output for the book's example")
