"""Known wrong variants of each step, computed with the reference, so a failure can name its mistake.

Each function returns {description of the mistake: what that mistake would output}. A check compares
the student's answer with every variant; the first that matches is the diagnosis.
"""

from __future__ import annotations

import functools
import operator
from typing import Any, cast

import torch

from autograder.grading.checks.harness import Raised, Submission, Variants, seed_torch
from autograder.model import NOT_ONE_PASS as NOT_ONE_PASS  # the speed part's mistake, where the class report reads it
from reference import mha as ref

# The five common mistakes the notebook warns about (its "Common mistakes" section uses the same names),
# named in a diagnosis so that a student can read up on the one they made.
HEAD_CHANGED = "common mistake: changing a head when only the output's shape should change"
OTHER_QUANTITY = "common mistake: thinking the parallel version computes something else"
HALF_SPLIT = "common mistake: a half-done weight split"
INCONSISTENT_ORDER = "common mistake: an inconsistent output order"
SHAPE_DRIFT = "common mistake: a drifting output shape"

HEAD_PARTS = ("W_query", "W_key", "W_value")


def named(description: str, common_mistake: str) -> str:
    return f"{description} ({common_mistake})"


# Joining the heads along another dimension than the last, as combine's checks name it whether the heads'
# widths are equal (a wrong shape) or not (torch.cat refuses them).
WRONG_DIMENSION: dict[int, str] = {
    0: named(
        "concatenated along the batch dimension (dim=0); the heads' features belong side by side in the "
        "last dimension: torch.cat(outputs, dim=-1)",
        SHAPE_DRIFT,
    ),
    1: named(
        "concatenated along the token dimension (dim=1); concatenate along the last dimension, dim=-1", SHAPE_DRIFT
    ),
}


def combine_variants(outputs: list[torch.Tensor]) -> Variants:
    """Functions, not tensors: some variants only exist for some inputs (first_match skips those)."""
    variants: Variants = {
        WRONG_DIMENSION[0]: lambda: torch.cat(outputs, dim=0),
        WRONG_DIMENSION[1]: lambda: torch.cat(outputs, dim=1),
        named("heads in the wrong order (reversed); head 0's columns come first", INCONSISTENT_ORDER): lambda: (
            torch.cat(outputs[::-1], dim=-1)
        ),
        named(
            "stacked into a new dimension instead of concatenated; use torch.cat(outputs, dim=-1)", SHAPE_DRIFT
        ): lambda: torch.stack(outputs, dim=-1),
        "only the first head's output is returned; every head's output must be in the result": lambda: outputs[0],
        "only the last head's output is returned; every head's output must be in the result": lambda: outputs[-1],
    }
    if len(outputs) > 1:
        variants[
            named(
                "heads summed instead of concatenated; the width must grow to the sum of the heads' widths", SHAPE_DRIFT
            )
        ] = lambda: functools.reduce(operator.add, outputs)
        variants[
            named("heads averaged instead of concatenated; concatenate them along the last dimension", SHAPE_DRIFT)
        ] = lambda: functools.reduce(operator.add, outputs) / len(outputs)
        variants[
            named(
                "columns interleaved (stacked then flattened); each head's columns must stay together",
                INCONSISTENT_ORDER,
            )
        ] = lambda: torch.stack(outputs, dim=-1).flatten(-2)
        variants[
            named("stacked along a new first dimension; concatenate along the last dimension instead", SHAPE_DRIFT)
        ] = lambda: torch.stack(outputs, dim=0)
    return variants


def column_range_variants(num_columns: int, num_heads: int) -> dict[str, list[tuple[int, int]]]:
    width = num_columns // num_heads
    return {
        "inclusive ranges: Python ranges are half-open, so stop is one past the head's last column "
        "(head 0 of width 2 is (0, 2), not (0, 1))": [(h * width, (h + 1) * width - 1) for h in range(num_heads)],
        "ranges counted from 1; columns are numbered from 0": [
            (h * width + 1, (h + 1) * width + 1) for h in range(num_heads)
        ],
        "ranges of width num_heads: each head's width is num_columns // num_heads": [
            (h * num_heads, (h + 1) * num_heads) for h in range(width)
        ],
        "(start, width) pairs instead of (start, stop)": [(h * width, width) for h in range(num_heads)],
    }


ROWS_INSTEAD_OF_COLUMNS = (
    "rows instead of columns: W is (d_in, d_out) as in x @ W, so a head owns columns W[:, start:stop], not rows "
    "W[start:stop]"
)


def split_variants(W: torch.Tensor, num_heads: int) -> dict[str, list[torch.Tensor]]:
    d_in, d_out = W.shape
    width = d_out // num_heads
    variants = {
        "blocks of the transposed matrix: return W[:, start:stop] itself, shape (d_in, head_dim)": [
            W[:, h * width : (h + 1) * width].T for h in range(num_heads)
        ],
    }
    if d_in % num_heads == 0:
        rows = d_in // num_heads
        variants[ROWS_INSTEAD_OF_COLUMNS] = [W[h * rows : (h + 1) * rows] for h in range(num_heads)]
    return variants


HEADS_REVERSED = named(
    "the heads' outputs are combined in the wrong order; run the heads in self.heads order and keep head 0 first",
    INCONSISTENT_ORDER,
)


def wrapper_variants(head_outputs: list[torch.Tensor]) -> Variants:
    return {
        HEADS_REVERSED: lambda: torch.cat(head_outputs[::-1], dim=-1),
        **{
            f"the wrapper returns the wrong combination: {k}": v
            for k, v in combine_variants(head_outputs).items()
            if "order" not in k
        },
    }


def mha_forward(
    module: ref.MultiHeadAttention,
    x: torch.Tensor,
    *,
    scale: str = "head_dim",
    mask: bool = True,
    transpose_before_merge: bool = True,
    merge_axes: tuple[int, int] = (1, 2),
    merge: bool = True,
    out_proj: bool = True,
    split: str = "view_transpose",
    softmax_dim: int = -1,
    dropout: str | tuple[str, ...] = "weights",
) -> torch.Tensor:
    """The reference's parallel forward with one step done wrongly (or not at all). `dropout` says where
    module.dropout is applied: "weights" (right), "weights_per_head" (right, but drawn one head at a time,
    as a loop over heads draws it), "context" (b, H, T, hd), "merged" (b, T, d_out), "output" (after
    out_proj), "none", or a tuple of these places."""
    b, T, _ = x.shape
    H, hd = module.num_heads, module.head_dim

    def heads(t: torch.Tensor) -> torch.Tensor:
        if split == "view_direct":
            return t.reshape(b, H, T, hd)  # splits tokens, not columns
        if split == "transpose_1_3":
            return t.view(b, T, H, hd).transpose(1, 3)  # (b, hd, H, T): the tokens swapped with the head's columns
        return t.view(b, T, H, hd).transpose(1, 2)

    q, k, v = heads(module.W_query(x)), heads(module.W_key(x)), heads(module.W_value(x))
    scores = q @ k.transpose(2, 3)
    if mask:
        scores = scores.masked_fill(module.get_buffer("mask").bool()[:T, :T], -torch.inf)
    # "head_dim" as the notebook writes it, keys.shape[-1] ** 0.5: a wrong split scales by what it put last
    divisor = {"head_dim": k.shape[-1] ** 0.5, "d_out": module.d_out**0.5, "none": 1.0}[scale]
    places = dropout if isinstance(dropout, tuple) else (dropout,)

    def drop(where: str, t: torch.Tensor) -> torch.Tensor:
        dropped: torch.Tensor = cast(torch.nn.Dropout, module.dropout)(t) if where in places else t
        return dropped

    weights = drop("weights", torch.softmax(scores / divisor, dim=softmax_dim))
    if "weights_per_head" in places:
        weights = torch.stack([module.dropout(weights[:, h].contiguous()) for h in range(H)], dim=1)
    context = drop("context", weights @ v)  # (b, H, T, hd)
    if not merge:
        return context
    context = (context.transpose(*merge_axes) if transpose_before_merge else context).reshape(b, T, module.d_out)
    context = drop("merged", context)
    projected: torch.Tensor = module.out_proj(context) if out_proj else context
    return drop("output", projected)


# Transposing the wrong axes around the split: the tokens trade places with the head's columns, not the heads.
SPLIT_AXES = (
    "wrong axes transposed when splitting the heads: (b, T, H, hd).transpose(1, 3) swaps the tokens with each "
    "head's columns; transpose(1, 2) moves the heads in front of the tokens, giving (b, H, T, hd)"
)
MERGE_AXES = (
    "wrong axes transposed when merging the heads: (b, H, T, hd).transpose(1, 3) swaps the heads with each "
    "head's columns; transpose(1, 2) gives (b, T, H, hd) before the view to (b, T, d_out)"
)


# Each known mistake of MultiHeadAttention.forward: its description, and how `mha_forward` makes it.
MHA_CANDIDATES: dict[str, dict[str, Any]] = {
    "scores scaled by sqrt(d_out) instead of sqrt(head_dim); each head's dot products run over head_dim numbers": dict(
        scale="d_out"
    ),
    "scores not scaled; divide by sqrt(head_dim) before the softmax": dict(scale="none"),
    "no causal mask; mask the scores above the diagonal with -inf before the softmax": dict(mask=False),
    named(
        "missing transpose before merging the heads: (b, H, T, hd) must go back to (b, T, H, hd) "
        "(context.transpose(1, 2)) before the view to (b, T, d_out)",
        HALF_SPLIT,
    ): dict(transpose_before_merge=False),
    named(
        "the heads are never merged: the output is still (b, H, T, hd); move the heads back behind "
        "the tokens and merge them into (b, T, d_out), then apply out_proj",
        SHAPE_DRIFT,
    ): dict(merge=False),
    "missing output projection: return self.out_proj(context_vec)": dict(out_proj=False),
    named(SPLIT_AXES, HALF_SPLIT): dict(split="transpose_1_3"),
    named(SPLIT_AXES + " (and again when merging them)", HALF_SPLIT): dict(split="transpose_1_3", merge_axes=(1, 3)),
    named(MERGE_AXES, HALF_SPLIT): dict(merge_axes=(1, 3)),
    named(
        "heads split by reshaping straight to (b, H, T, hd); view as (b, T, H, hd) and then "
        "transpose(1, 2), so each head gets its own columns",
        HALF_SPLIT,
    ): dict(split="view_direct"),
    "softmax over the wrong dimension; normalise over the keys (dim=-1)": dict(softmax_dim=-2),
}


def mha_variants(module: ref.MultiHeadAttention, x: torch.Tensor) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        variants: dict[str, torch.Tensor] = {}
        for description, flags in MHA_CANDIDATES.items():
            try:
                variants[description] = mha_forward(module, x, **flags)
            except RuntimeError:  # a variant that does not exist for these sizes
                continue
        return variants


def raising_mistake(module: ref.MultiHeadAttention, x: torch.Tensor, said: str) -> str | None:
    """The known mistake whose forward raises, on this input, the error the student's forward raised (`said`,
    the failure's message), or None: a wrong split fails inside PyTorch for most sizes, and its error names
    only sizes."""
    with torch.no_grad():
        x = x.to(module.get_buffer("mask").device)
        for description, flags in MHA_CANDIDATES.items():
            try:
                mha_forward(module, x, **flags)
            except RuntimeError as exc:
                if str(exc).strip() and str(exc).splitlines()[0] in said:
                    return description
    return None


def mha_dropout_variants(module: ref.MultiHeadAttention, x: torch.Tensor, seed: int) -> dict[str, torch.Tensor]:
    """Training-mode outputs with dropout in the wrong place, each drawn from the same seed as the check's
    reference, so a submission that drops elsewhere matches its variant exactly."""
    fix = "apply self.dropout to attn_weights right after the softmax, before multiplying by the values"
    candidates: dict[str, str | tuple[str, ...]] = {
        f"dropout applied to the context vectors instead of the attention weights; {fix}": "context",
        f"dropout applied to the context vectors (after merging the heads) instead of the attention weights; {fix}": "merged",
        f"dropout applied to the output of out_proj instead of the attention weights; {fix}": "output",
        "dropout not applied in training mode; apply self.dropout to the attention weights": "none",
        "dropout applied twice, to the attention weights and again to the context vectors; apply it once, "
        "to the attention weights only": ("weights", "context"),
        "dropout applied twice, to the attention weights and again to the output; apply it once, "
        "to the attention weights only": ("weights", "output"),
    }
    return {description: mha_train_forward(module, x, seed, where) for description, where in candidates.items()}


def mha_train_forward(
    module: ref.MultiHeadAttention, x: torch.Tensor, seed: int, dropout: str | tuple[str, ...] = "weights"
) -> torch.Tensor:
    """A training-mode forward with dropout drawn from `seed` and applied where `dropout` says."""
    module.train(True)
    try:
        with torch.no_grad():
            seed_torch(seed)
            return mha_forward(module, x, dropout=dropout)
    finally:
        module.eval()


def fuse_variants(wrapper: ref.MultiHeadAttentionWrapper, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Outputs of fused modules built wrongly, evaluated with the reference forward."""

    def fused(reverse: bool = False, biases: bool = True) -> torch.Tensor:
        module = ref.fuse_heads(wrapper)
        heads = list(wrapper.heads)[::-1] if reverse else list(wrapper.heads)
        with torch.no_grad():
            for name in ("W_query", "W_key", "W_value"):
                getattr(module, name).weight.copy_(torch.cat([getattr(h, name).weight for h in heads]))
                if getattr(module, name).bias is not None:
                    getattr(module, name).bias.copy_(
                        torch.cat([getattr(h, name).bias for h in heads]) if biases else 0.0
                    )
        output: torch.Tensor = module.eval()(x)
        return output

    variants = {
        named(
            "heads placed in reverse order: head h's weights belong in columns h * head_dim to (h + 1) * head_dim",
            INCONSISTENT_ORDER,
        ): fused(reverse=True)
    }
    if wrapper.heads[0].W_query.bias is not None:
        variants["the heads' biases were not copied into the fused projections"] = fused(biases=False)
    return variants


def describe_module_mistake(fused_state: dict[str, torch.Tensor], wrapper: ref.MultiHeadAttentionWrapper) -> str | None:
    """Diagnoses read straight off a fused module's weights: weights that are not the wrapper's at all,
    or an output projection that changes the heads' result."""
    heads = list(wrapper.heads)
    for name in HEAD_PARTS:
        fused = fused_state.get(f"{name}.weight")
        if not isinstance(fused, torch.Tensor) or fused.dim() != 2:
            continue
        blocks = [getattr(head, name).weight.detach().double() for head in heads]
        rows = fused.double()
        found = any(
            block.shape[1] == rows.shape[1]
            and any(
                torch.allclose(rows[i : i + block.shape[0]], block, rtol=1e-5, atol=1e-6)
                for i in range(rows.shape[0] - block.shape[0] + 1)
            )
            for block in blocks
        )
        if not found:
            return named(
                f"the fused {name} holds none of the wrapper's {name} weights: fuse_heads must copy each "
                "head's weights into the new module, so that it computes exactly what the wrapper "
                "computes (a freshly initialised MultiHeadAttention is a different layer)",
                OTHER_QUANTITY,
            )
    d_out = sum(head.W_query.weight.shape[0] for head in heads)
    weight = fused_state.get("out_proj.weight")
    if isinstance(weight, torch.Tensor) and weight.shape == (d_out, d_out):
        if not torch.allclose(weight.double(), torch.eye(d_out, dtype=torch.float64)):
            return named(
                "out_proj is not the identity: the wrapper has no output projection, so set "
                "out_proj.weight to torch.eye(d_out) and out_proj.bias to zeros",
                OTHER_QUANTITY,
            )
    bias = fused_state.get("out_proj.bias")
    if isinstance(bias, torch.Tensor) and bias.numel() and bias.abs().max() > 0:
        return named(
            "out_proj.bias is not zero: the wrapper adds nothing after concatenating the heads", OTHER_QUANTITY
        )
    return None


def misplaced_block(fused_state: dict[str, torch.Tensor], wrapper: ref.MultiHeadAttentionWrapper) -> str | None:
    """The first of head h's weights or biases that is not where the fused module must hold it, in the
    notebook's terms: head h owns the half-open columns (start, stop) of each W, which are the rows
    start:stop of `.weight` and the entries start:stop of `.bias`. (The notebook's self-check says the same.)"""
    heads = list(wrapper.heads)
    ranges = ref.head_column_ranges(sum(head.W_query.weight.shape[0] for head in heads), len(heads))
    for kind in ("weight", "bias"):
        for name in HEAD_PARTS:
            fused = fused_state.get(f"{name}.{kind}")
            for h, (head, (start, stop)) in enumerate(zip(heads, ranges)):
                own = getattr(getattr(head, name), kind)
                if own is None or not isinstance(fused, torch.Tensor):
                    continue
                block = fused[start:stop].detach().double()
                if block.shape == own.shape and torch.allclose(block, own.detach().double(), rtol=1e-5, atol=1e-6):
                    continue
                hint = (
                    ": every head's bias goes into its range too, fused.W_query.bias[start:stop] = head.W_query.bias"
                    if kind == "bias"
                    else ""
                )
                return (
                    f"the fused {name}.{kind}[{start}:{stop}] (head {h}'s columns ({start}, {stop}) of W) is not "
                    f"head {h}'s {name}.{kind}{hint}"
                )
    return None


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
            return (
                f"head internals changed instead of the gathering step: head {index} has {found}"
                + (f" and parts a CausalAttention does not have ({', '.join(extra[:4])})" if extra else "")
                + ". A head must stay a plain CausalAttention whose query, key and value projections are all "
                f"d_out wide; change the argument that sizes the heads, not what is inside them ({HEAD_CHANGED})"
            )
    return None


def wrong_ranges(submission: Submission, num_columns: int, num_heads: int) -> str | None:
    """When the student's head_column_ranges(num_columns, num_heads) is wrong: a sentence saying what it
    returns and why, for the message of a later part that may use it; None when it is right."""
    expected = ref.head_column_ranges(num_columns, num_heads)
    given = submission.try_call("head_column_ranges", num_columns, num_heads)
    call = f"head_column_ranges({num_columns}, {num_heads})"
    if isinstance(given, Raised):
        if given.type == "NotImplementedError":
            return f"your {call} is not written yet"
        return f"your {call} raises {given.type}: {given.message}"
    ranges = given
    if isinstance(given, (list, tuple)):
        ranges = [tuple(r) if isinstance(r, (list, tuple)) else r for r in given]
    if ranges == expected:
        return None
    mistake = next(
        (
            d.split(":")[0].split(";")[0]
            for d, v in column_range_variants(num_columns, num_heads).items()
            if v == ranges
        ),
        None,
    )
    return f"your {call} returns {ranges!r:.120}" + (f", which are {mistake}" if mistake else f", not {expected!r}")
