# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Parallel processing of attention heads
#
# (narrative to be written)

# %%
import torch
import torch.nn as nn

# %%
class CausalAttention(nn.Module):
    """One head: causal scaled dot-product attention, (b, T, d_in) -> (b, T, d_out)."""

    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        # A buffer, not a parameter: it moves with .to(device) but is never trained.
        self.register_buffer(
            "mask", torch.triu(torch.ones(context_length, context_length), diagonal=1)
        )

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)  # (b, T, d_out)
        queries = self.W_query(x)  # (b, T, d_out)
        values = self.W_value(x)  # (b, T, d_out)

        attn_scores = queries @ keys.transpose(1, 2)  # (b, T, T)
        # Slice the mask so sequences shorter than context_length work too.
        attn_scores = attn_scores.masked_fill(
            self.mask.bool()[:num_tokens, :num_tokens], -torch.inf
        )
        # Scale by sqrt(d_k) so the softmax does not saturate as the head gets wider.
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)
        return attn_weights @ values  # (b, T, d_out)


# %%
def combine(outputs):
    """Gather per-head outputs [(b, T, d_h), ...] into one (b, T, sum d_h), head 0's columns first."""
    ### BEGIN SOLUTION
    # Concatenate along the last (feature) dimension: batch and token positions stay aligned.
    return torch.cat(outputs, dim=-1)
    ### END SOLUTION


# %%
class MultiHeadAttentionWrapper(nn.Module):
    """Several CausalAttention heads run one after another; their outputs are combined."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )

    def forward(self, x):
        ### BEGIN SOLUTION
        # Every head sees the same x; the list comprehension runs them one at a time, in order.
        outputs = [head(x) for head in self.heads]  # num_heads x (b, T, d_out)
        return combine(outputs)  # (b, T, num_heads * d_out)
        ### END SOLUTION


# %%
def make_2d_wrapper(d_in, context_length, dropout=0.0, qkv_bias=False):
    """A two-head wrapper whose context vectors are 2-dimensional, heads left as they are."""
    ### BEGIN SOLUTION
    # The combined width is num_heads * d_out, so 2 heads of width 1 give 2-D context vectors.
    # Only the argument that sizes each head changes; what a head computes does not.
    return MultiHeadAttentionWrapper(d_in, 1, context_length, dropout, num_heads=2, qkv_bias=qkv_bias)
    ### END SOLUTION


# %%
HEADS_RUN = None  # "A": at the same time, "B": one after another
### BEGIN SOLUTION
HEADS_RUN = "B"
### END SOLUTION


# %%
def head_column_ranges(num_columns, num_heads):
    """Half-open column ranges [(0, w), (w, 2w), ...], one per head, for a split into equal widths."""
    ### BEGIN SOLUTION
    for name, value in (("num_columns", num_columns), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if num_columns % num_heads != 0:
        raise ValueError(
            f"{num_columns} columns do not split evenly into {num_heads} heads "
            f"({num_columns} % {num_heads} = {num_columns % num_heads})"
        )
    width = num_columns // num_heads
    return [(h * width, (h + 1) * width) for h in range(num_heads)]
    ### END SOLUTION


# %%
EIGHT_COLUMNS_FOUR_HEADS = None  # the list of (start, stop) ranges for 8 columns and 4 heads
### BEGIN SOLUTION
EIGHT_COLUMNS_FOUR_HEADS = [(0, 2), (2, 4), (4, 6), (6, 8)]
### END SOLUTION


# %%
OUTPUT_SHAPE_STEP = None  # "A", "B", "C" or "D"
### BEGIN SOLUTION
OUTPUT_SHAPE_STEP = "C"
### END SOLUTION


# %%
def split_columns(W, num_heads):
    """The per-head column blocks W[:, start:stop] of a (d_in, d_out) matrix, head 0 first."""
    ### BEGIN SOLUTION
    # W is (d_in, d_out) as in x @ W, so a head owns columns, never rows.
    return [W[:, start:stop] for start, stop in head_column_ranges(W.shape[1], num_heads)]
    ### END SOLUTION


# %%
class MultiHeadAttention(nn.Module):
    """All heads in one batched pass: one projection per Q/K/V, split into heads by columns."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # mixes the heads' outputs
        self.dropout = nn.Dropout(dropout)
        self.register_buffer(
            "mask", torch.triu(torch.ones(context_length, context_length), diagonal=1)
        )

    def forward(self, x):
        ### BEGIN SOLUTION
        b, num_tokens, d_in = x.shape
        # One matrix multiply per projection computes every head's queries, keys and values.
        keys = self.W_key(x)  # (b, T, d_out)
        queries = self.W_query(x)  # (b, T, d_out)
        values = self.W_value(x)  # (b, T, d_out)

        # The weight split: head h owns columns [h * head_dim, (h + 1) * head_dim).
        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, H, hd)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)

        # Heads become a batch dimension, so one batched matmul serves all of them.
        keys = keys.transpose(1, 2)  # (b, H, T, hd)
        queries = queries.transpose(1, 2)  # (b, H, T, hd)
        values = values.transpose(1, 2)  # (b, H, T, hd)

        attn_scores = queries @ keys.transpose(2, 3)  # (b, H, T, T)
        attn_scores = attn_scores.masked_fill(
            self.mask.bool()[:num_tokens, :num_tokens], -torch.inf
        )
        # Scale by sqrt(head_dim), the width each head's dot products run over, not by d_out.
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)

        # Back to (b, T, H, hd) before merging, so each token's heads sit side by side.
        context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, H, hd)
        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)  # (b, T, d_out)
        return self.out_proj(context_vec)  # (b, T, d_out)
        ### END SOLUTION


# %%
def fuse_heads(wrapper):
    """A MultiHeadAttention computing exactly what `wrapper` computes, with one weight per projection."""
    ### BEGIN SOLUTION
    heads = list(wrapper.heads)
    first = heads[0]
    head_dim, d_in = first.W_query.weight.shape  # nn.Linear stores (d_out, d_in)
    num_heads = len(heads)
    fused = MultiHeadAttention(
        d_in,
        head_dim * num_heads,
        first.mask.shape[0],
        first.dropout.p,
        num_heads,
        qkv_bias=first.W_query.bias is not None,
    ).to(first.W_query.weight)
    with torch.no_grad():
        for (start, stop), head in zip(head_column_ranges(fused.d_out, num_heads), heads):
            for name in ("W_query", "W_key", "W_value"):
                # Head h's W (d_in, head_dim) becomes columns start:stop of the fused W;
                # nn.Linear keeps W transposed, so those columns are rows of .weight.
                getattr(fused, name).weight[start:stop] = getattr(head, name).weight
                if getattr(head, name).bias is not None:
                    getattr(fused, name).bias[start:stop] = getattr(head, name).bias
        # The wrapper has no output projection: the identity keeps the heads' columns as they are.
        fused.out_proj.weight.copy_(torch.eye(fused.d_out))
        fused.out_proj.bias.zero_()
    return fused.train(wrapper.training)
    ### END SOLUTION
