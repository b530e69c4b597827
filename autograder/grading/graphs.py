"""The grader's judgement of a captured forward: which ATen operations it runs, and whether they may run.

A forward captured in the student's worker (`protocol.CaptureRequest`) is plain data, a `protocol.Graph`: this
module reads it, in the grader, and decides. Only operations on the allow-list below may appear (the views,
element-wise arithmetic, reductions, matrix multiplies and creation functions that an attention forward needs,
and the rubric's `[graph] allow`), looked up in torch's `aten` namespace; no ready-made attention in any
spelling (an API the rubric's `[apis]` does not allow, by the ATen operations it shows up as); no custom
operation, no other namespace, no Python callback. What passes is replayed, where no student code ever ran,
by a trusted worker (`protocol.ReplayRequest`): what a student hides from the capture is simply not run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from autograder.rubric import Rubric
from autograder.sandbox.protocol import Graph

# The matrix multiplies of a captured forward (ATen's names; `matmul`, `linear` and `einsum` are decomposed into
# these by the capture, but are counted should they appear).
MATMUL_OPS = frozenset(
    {"mm", "bmm", "addmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "matmul", "linear", "einsum",
     "_addmm_activation", "tensordot", "outer", "addr"}
)  # fmt: skip

# API name (the rubric's [apis]) -> the ATen operations it shows up as, by the start of their names.
ATTENTION_OPS: dict[str, tuple[str, ...]] = {
    "scaled_dot_product_attention": (
        "scaled_dot_product_attention",
        "_scaled_dot_product",
        "_fused_sdp_choice",
        "_flash_attention",
        "_efficient_attention",
        "_cudnn_attention",
        "_triton_scaled_dot",
    ),
    "nn_multihead_attention": ("_native_multi_head_attention", "_transformer_encoder_layer", "_masked_softmax"),
    "flex_attention": ("flex_attention",),
}

# What an attention forward needs, and nothing that reads or writes memory it was not given (`as_strided`,
# `set_`, `_unsafe_index`, `resize_`). An in-place variant (`add_`) is allowed where its operation is.
ALLOWED_OPS = frozenset(
    {
        # shapes and views
        "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand", "expand_as",
        "unsqueeze", "squeeze", "flatten", "unflatten", "view_as", "movedim", "swapaxes", "contiguous", "clone",
        "alias", "detach", "slice", "select", "narrow", "split", "split_with_sizes", "chunk", "unbind",
        "index_select", "gather", "cat", "stack", "repeat", "flip", "roll", "diagonal", "tril", "triu",
        "constant_pad_nd", "unsafe_split", "unsafe_chunk", "unsafe_split_with_sizes",
        # making and converting tensors
        "ones", "zeros", "full", "empty", "empty_like", "ones_like", "zeros_like", "full_like", "arange",
        "scalar_tensor", "lift_fresh", "lift_fresh_copy", "_to_copy", "to", "copy", "fill", "zero", "new_ones",
        "new_zeros", "new_full", "new_empty", "eye", "type_as", "masked_fill", "where",
        # element-wise
        "add", "sub", "rsub", "mul", "div", "true_divide", "neg", "exp", "exp2", "expm1", "log", "log2", "log1p",
        "sqrt", "rsqrt", "pow", "reciprocal", "abs", "square", "maximum", "minimum", "clamp", "clamp_min",
        "clamp_max", "sigmoid", "tanh", "relu", "gelu", "silu", "erf", "floor", "ceil", "round", "sign",
        "floor_divide", "remainder", "fmod", "isinf", "isnan", "nan_to_num", "logical_not", "logical_and",
        "logical_or", "bitwise_not", "bitwise_and", "bitwise_or", "eq", "ne", "lt", "le", "gt", "ge", "addcmul",
        "addcdiv", "lerp",
        # reductions and softmax
        "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "logsumexp", "prod", "var", "std",
        "cumsum", "softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax",
        # dropout (inert in eval mode, where forwards are captured)
        "dropout", "native_dropout", "feature_dropout",
    }
    | MATMUL_OPS
)  # fmt: skip
GETITEM = "operator.getitem"

# What a check of the graph says, in the student's terms (each the same for every student who meets it).
CANNOT_CAPTURE = (
    "the forward cannot be captured as a graph: it must not branch on a tensor's values or read one (`if "
    "scores.max() > 0`, `.item()`, `bool(...)`, a shape made from values); write it with tensor operations only, "
    "whatever the input's values"
)
NOT_REPLAYABLE = "the captured forward uses operations the grader does not replay"
HIDDEN_FROM_CAPTURE = (
    "the captured forward is not right on a new input: part of the work was hidden from the capture "
    "(computed outside PyTorch's operations, or kept from an earlier call), so it was frozen as a constant"
)
READY_MADE = "a ready-made attention, which the exercise does not allow"
CANNOT_JUDGE = frozenset({CANNOT_CAPTURE, NOT_REPLAYABLE, HIDDEN_FROM_CAPTURE})  # a graph the checks could not judge


def op_name(target: str) -> str | None:
    """The ATen operation a target names (`aten.mm.default` -> `mm`), without a trailing `_` of an in-place
    variant; None for anything else (another namespace, a Python function)."""
    namespace, _, rest = target.partition(".")
    name, _, overload = rest.partition(".")
    if namespace != "aten" or not name or not overload or "." in overload:
        return None
    return name[:-1] if name.endswith("_") and not name.endswith("__") and not name.startswith("_") else name


def attention_api(target: str) -> str | None:
    """The ready-made attention API (the rubric's [apis] name) an operation is, if any."""
    name = target.split(".")[1] if "." in target else target
    for api, prefixes in ATTENTION_OPS.items():
        if any(name.startswith(prefix) or prefix in target for prefix in prefixes):
            return api
    return None


def is_attention(target: str) -> bool:
    return attention_api(target) is not None


def ready_made(graph: Graph, rubric: Rubric) -> list[str]:
    """The APIs the rubric does not allow that the graph uses (by the ATen operations they show up as)."""
    used = {attention_api(t) for t in graph.targets()} - {None}
    return [api for api in ATTENTION_OPS if api in used and not rubric.apis.get(api, False)]


@dataclass(frozen=True)
class GraphProblem:
    """Why a captured graph may not be replayed: what it is, in the student's terms (`message`), and the
    operations that are the reason (`targets`)."""

    message: str
    targets: tuple[str, ...] = ()


def not_allowed(graph: Graph, rubric: Rubric, attention: bool = False) -> GraphProblem | None:
    """Why the grader will not replay this graph, or None: too many operations or bytes of constants (the
    rubric's `[graph]`), or an operation outside the allow-list. Ready-made attention is `ready_made`'s to say;
    `attention`: its operations may be replayed here (a structure check replays a graph to check its values, and
    the ready-made attention is charged once, by its own check; it is never timed)."""
    limits = rubric.graph
    if len(graph.nodes) > limits.max_nodes:
        return GraphProblem(
            f"your forward runs {len(graph.nodes)} operations for one input; the grader replays at most "
            f"{limits.max_nodes}"
        )
    constant_bytes = sum(c.numel() * c.element_size() for c in graph.constants)
    if constant_bytes > limits.max_constant_mib * (1 << 20):
        return GraphProblem(
            f"your forward holds {constant_bytes / (1 << 20):.1f} MiB of tensors that are neither its input nor the "
            f"module's parameters and buffers (at most {limits.max_constant_mib:g} MiB): make them buffers of the module"
        )
    allowed = ALLOWED_OPS | set(limits.allow)
    refused = sorted(
        {
            t
            for t in graph.targets()
            if t != GETITEM
            and (op_name(t) is None or op_name(t) not in allowed)
            and not (attention and op_name(t) is not None and is_attention(t))
        }
    )
    if refused:
        listed = ", ".join(refused[:5]) + (f" and {len(refused) - 5} more" if len(refused) > 5 else "")
        return GraphProblem(
            f"your forward runs {listed}, which the grader does not run for its checks of structure and speed. "
            "Write the attention with ordinary tensor operations (matmul or @, view, transpose, masked_fill, "
            "softmax, ...)",
            tuple(refused),
        )
    return None


def matmuls(graph: Graph) -> int:
    """How many matrix multiplies one forward runs."""
    return sum(1 for t in graph.targets() if op_name(t) in MATMUL_OPS)


def op_counts(graph: Graph) -> Counter[str]:
    """How often each operation runs (by ATen name), for a message."""
    return Counter(op_name(t) or t for t in graph.targets())
