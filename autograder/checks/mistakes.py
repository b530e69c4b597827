"""Known wrong variants of each step, computed with the reference, so a failure can name its mistake.

Each function returns {description of the mistake: what that mistake would output}. A check compares
the student's answer with every variant; the first that matches is the diagnosis.
"""
from __future__ import annotations

import torch

from reference import mha as ref


def combine_variants(outputs: list[torch.Tensor]) -> dict:
    """Functions, not tensors: some variants only exist for some inputs (first_match skips those)."""
    variants = {
        "concatenated along the batch dimension (dim=0); the heads' features belong side by side in the "
        "last dimension: torch.cat(outputs, dim=-1)": lambda: torch.cat(outputs, dim=0),
        "concatenated along the token dimension (dim=1); concatenate along the last dimension, dim=-1":
            lambda: torch.cat(outputs, dim=1),
        "heads in the wrong order (reversed); head 0's columns come first": lambda: torch.cat(outputs[::-1], dim=-1),
        "stacked into a new dimension instead of concatenated; use torch.cat(outputs, dim=-1)":
            lambda: torch.stack(outputs, dim=-1),
        "only the first head's output is returned; every head's output must be in the result": lambda: outputs[0],
        "only the last head's output is returned; every head's output must be in the result": lambda: outputs[-1],
    }
    if len(outputs) > 1:
        variants["heads summed instead of concatenated; the width must grow to the sum of the heads' widths"] = lambda: sum(outputs)
        variants["heads averaged instead of concatenated; concatenate them along the last dimension"] = lambda: (
            sum(outputs) / len(outputs))
        variants["columns interleaved (stacked then flattened); each head's columns must stay together"] = lambda: (
            torch.stack(outputs, dim=-1).flatten(-2))
        variants["stacked along a new first dimension; concatenate along the last dimension instead"] = lambda: (
            torch.stack(outputs, dim=0))
    return variants


def column_range_variants(num_columns: int, num_heads: int) -> dict[str, list[tuple[int, int]]]:
    width = num_columns // num_heads
    return {
        "inclusive ranges: Python ranges are half-open, so stop is one past the head's last column "
        "(head 0 of width 2 is (0, 2), not (0, 1))": [(h * width, (h + 1) * width - 1) for h in range(num_heads)],
        "ranges counted from 1; columns are numbered from 0": [(h * width + 1, (h + 1) * width + 1) for h in range(num_heads)],
        "ranges of width num_heads: each head's width is num_columns // num_heads":
            [(h * num_heads, (h + 1) * num_heads) for h in range(width)],
        "(start, width) pairs instead of (start, stop)": [(h * width, width) for h in range(num_heads)],
    }


def split_variants(W: torch.Tensor, num_heads: int) -> dict[str, list[torch.Tensor]]:
    d_in, d_out = W.shape
    width = d_out // num_heads
    variants = {
        "blocks of the transposed matrix: return W[:, start:stop] itself, shape (d_in, head_dim)":
            [W[:, h * width:(h + 1) * width].T for h in range(num_heads)],
    }
    if d_in % num_heads == 0:
        rows = d_in // num_heads
        variants["rows instead of columns: W is (d_in, d_out) as in x @ W, so a head owns columns "
                 "W[:, start:stop], not rows W[start:stop]"] = [W[h * rows:(h + 1) * rows] for h in range(num_heads)]
    return variants


def wrapper_variants(head_outputs: list[torch.Tensor]) -> dict:
    return {
        "the heads' outputs are combined in the wrong order; run the heads in self.heads order and "
        "keep head 0 first": lambda: torch.cat(head_outputs[::-1], dim=-1),
        **{f"the wrapper returns the wrong combination: {k}": v for k, v in combine_variants(head_outputs).items()
           if "order" not in k},
    }


def mha_forward(module: ref.MultiHeadAttention, x: torch.Tensor, *, scale="head_dim", mask=True,
                transpose_before_merge=True, out_proj=True, split="view_transpose", softmax_dim=-1,
                dropout="weights"):
    """The reference's parallel forward with one step done wrongly (or not at all). `dropout` says where
    module.dropout is applied: "weights" (right), "context" (b, H, T, hd), "merged" (b, T, d_out),
    "output" (after out_proj), "none", or a tuple of these places."""
    b, T, _ = x.shape
    H, hd = module.num_heads, module.head_dim

    def heads(t):
        if split == "view_direct":
            return t.reshape(b, H, T, hd)  # splits tokens, not columns
        return t.view(b, T, H, hd).transpose(1, 2)

    q, k, v = heads(module.W_query(x)), heads(module.W_key(x)), heads(module.W_value(x))
    scores = q @ k.transpose(2, 3)
    if mask:
        scores = scores.masked_fill(module.mask.bool()[:T, :T], -torch.inf)
    divisor = {"head_dim": hd**0.5, "d_out": module.d_out**0.5, "none": 1.0}[scale]

    def drop(where, t):
        return module.dropout(t) if where in (dropout if isinstance(dropout, tuple) else (dropout,)) else t

    weights = drop("weights", torch.softmax(scores / divisor, dim=softmax_dim))
    context = drop("context", weights @ v)  # (b, H, T, hd)
    context = (context.transpose(1, 2) if transpose_before_merge else context).reshape(b, T, module.d_out)
    context = drop("merged", context)
    return drop("output", module.out_proj(context) if out_proj else context)


def mha_variants(module: ref.MultiHeadAttention, x: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        candidates = {
            "scores scaled by sqrt(d_out) instead of sqrt(head_dim); each head's dot products run over "
            "head_dim numbers": dict(scale="d_out"),
            "scores not scaled; divide by sqrt(head_dim) before the softmax": dict(scale="none"),
            "no causal mask; mask the scores above the diagonal with -inf before the softmax": dict(mask=False),
            "missing transpose before merging the heads: (b, H, T, hd) must go back to (b, T, H, hd) "
            "(context.transpose(1, 2)) before the view to (b, T, d_out)": dict(transpose_before_merge=False),
            "missing output projection: return self.out_proj(context_vec)": dict(out_proj=False),
            "heads split by reshaping straight to (b, H, T, hd); view as (b, T, H, hd) and then "
            "transpose(1, 2), so each head gets its own columns": dict(split="view_direct"),
            "softmax over the wrong dimension; normalise over the keys (dim=-1)": dict(softmax_dim=-2),
        }
        return {description: mha_forward(module, x, **flags) for description, flags in candidates.items()}


def mha_dropout_variants(module: ref.MultiHeadAttention, x: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    """Training-mode outputs with dropout in the wrong place, each drawn from the same seed as the check's
    reference, so a submission that drops elsewhere matches its variant exactly."""
    fix = "apply self.dropout to attn_weights right after the softmax, before multiplying by the values"
    candidates = {
        f"dropout applied to the context vectors instead of the attention weights; {fix}": "context",
        f"dropout applied to the context vectors (after merging the heads) instead of the attention weights; {fix}":
            "merged",
        f"dropout applied to the output of out_proj instead of the attention weights; {fix}": "output",
        "dropout not applied in training mode; apply self.dropout to the attention weights": "none",
        "dropout applied twice, to the attention weights and again to the context vectors; apply it once, "
        "to the attention weights only": ("weights", "context"),
        "dropout applied twice, to the attention weights and again to the output; apply it once, "
        "to the attention weights only": ("weights", "output"),
    }
    variants = {}
    module.train(True)
    try:
        with torch.no_grad():
            for description, where in candidates.items():
                torch.manual_seed(seed)
                variants[description] = mha_forward(module, x, dropout=where)
    finally:
        module.eval()
    return variants


def fuse_variants(wrapper: ref.MultiHeadAttentionWrapper, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Outputs of fused modules built wrongly, evaluated with the reference forward."""
    def fused(reverse=False, biases=True):
        module = ref.fuse_heads(wrapper)
        heads = list(wrapper.heads)[::-1] if reverse else list(wrapper.heads)
        with torch.no_grad():
            for name in ("W_query", "W_key", "W_value"):
                getattr(module, name).weight.copy_(torch.cat([getattr(h, name).weight for h in heads]))
                if getattr(module, name).bias is not None:
                    getattr(module, name).bias.copy_(
                        torch.cat([getattr(h, name).bias for h in heads]) if biases else 0.0)
        return module.eval()(x)

    variants = {"heads placed in reverse order: head h's weights belong in columns "
                "h * head_dim to (h + 1) * head_dim": fused(reverse=True)}
    if wrapper.heads[0].W_query.bias is not None:
        variants["the heads' biases were not copied into the fused projections"] = fused(biases=False)
    return variants


def describe_module_mistake(fused_state: dict[str, torch.Tensor], d_out: int) -> str | None:
    """Diagnoses read straight off a fused module's weights."""
    weight = fused_state.get("out_proj.weight")
    if weight is not None and weight.shape == (d_out, d_out):
        if not torch.allclose(weight.double(), torch.eye(d_out, dtype=torch.float64)):
            return ("out_proj is not the identity: the wrapper has no output projection, so set "
                    "out_proj.weight to torch.eye(d_out) and out_proj.bias to zeros")
    bias = fused_state.get("out_proj.bias")
    if bias is not None and bias.abs().max() > 0:
        return "out_proj.bias is not zero: the wrapper adds nothing after concatenating the heads"
    return None


HEAD_PARTS = ("W_query", "W_key", "W_value")


def describe_changed_heads(wrapper_state: dict[str, torch.Tensor]) -> str | None:
    """A wrapper whose heads are no longer plain CausalAttention modules, read off its state dict: projections
    of different widths inside one head, or parts a CausalAttention does not have."""
    heads: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in wrapper_state.items():
        parts = name.split(".", 2)
        if len(parts) == 3 and parts[0] == "heads" and parts[1].isdigit():
            heads.setdefault(int(parts[1]), {})[parts[2]] = tensor
    known = {f"{p}.{kind}" for p in HEAD_PARTS for kind in ("weight", "bias")} | {"mask"}
    for index in sorted(heads):
        entries = heads[index]
        widths = {p: entries[f"{p}.weight"].shape[0] for p in HEAD_PARTS if f"{p}.weight" in entries}
        extra = sorted(name for name in entries if name not in known)
        if len(set(widths.values())) > 1 or extra:
            found = ", ".join(f"{p} {w} wide" for p, w in widths.items())
            return (f"head internals changed instead of the gathering step: head {index} has {found}"
                    + (f" and parts a CausalAttention does not have ({', '.join(extra[:4])})" if extra else "")
                    + ". A head must stay a plain CausalAttention whose query, key and value projections are all "
                      "d_out wide; change the argument that sizes the heads, not what is inside them")
    return None
