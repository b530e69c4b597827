"""Fast peers of reference.mha.MultiHeadAttention for the benchmark: the same quantity, other kernels.

Each takes MultiHeadAttention's constructor arguments and has `from_reference(mha)`, which copies a
reference module's weights so tests can show that all of them compute the same thing.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference.mha import MultiHeadAttention


class SDPAAttention(MultiHeadAttention):
    """The reference's weights, with the attention itself done by scaled_dot_product_attention."""

    @classmethod
    def from_reference(cls, mha):
        return _copy_into(cls, mha, lambda peer: peer.load_state_dict(mha.state_dict()))

    def forward(self, x):
        b, num_tokens, _ = x.shape
        # (b, T, d_out) -> (b, H, T, hd) for each of queries, keys and values
        q, k, v = (
            proj(x).view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
            for proj in (self.W_query, self.W_key, self.W_value)
        )
        # is_causal builds the same upper-triangular mask without materialising it.
        context = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout.p if self.training else 0.0, is_causal=True
        )  # (b, H, T, hd)
        return self.out_proj(context.transpose(1, 2).reshape(b, num_tokens, self.d_out))


class CombinedQKVAttention(nn.Module):
    """One (d_in, 3 * d_out) projection for queries, keys and values together: one matmul, not three."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out, self.num_heads, self.head_dim = d_out, num_heads, d_out // num_heads
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    @classmethod
    def from_reference(cls, mha):
        def load(peer):
            projections = (mha.W_query, mha.W_key, mha.W_value)
            peer.qkv.weight.copy_(torch.cat([p.weight for p in projections]))
            if peer.qkv.bias is not None:
                peer.qkv.bias.copy_(torch.cat([p.bias for p in projections]))
            peer.out_proj.load_state_dict(mha.out_proj.state_dict())

        return _copy_into(cls, mha, load)

    def forward(self, x):
        b, num_tokens, _ = x.shape
        qkv = self.qkv(x).view(b, num_tokens, 3, self.num_heads, self.head_dim)  # (b, T, 3, H, hd)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (b, H, T, hd)
        scores = (q @ k.transpose(2, 3)).masked_fill(
            self.mask.bool()[:num_tokens, :num_tokens], -torch.inf
        )  # (b, H, T, T)
        weights = self.dropout(torch.softmax(scores / self.head_dim**0.5, dim=-1))
        context = (weights @ v).transpose(1, 2).reshape(b, num_tokens, self.d_out)  # (b, T, d_out)
        return self.out_proj(context)


class TorchMultiheadAttention(nn.Module):
    """nn.MultiheadAttention with a causal mask. It projects queries from embed_dim, so d_in == d_out."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        if d_in != d_out:
            raise ValueError(f"nn.MultiheadAttention needs d_in == d_out, got {d_in} and {d_out}")
        self.attn = nn.MultiheadAttention(d_out, num_heads, dropout=dropout, bias=qkv_bias, batch_first=True)
        if not qkv_bias:
            # nn.MultiheadAttention ties the output projection's bias to `bias`; ours always has one.
            self.attn.out_proj.bias = nn.Parameter(torch.zeros(d_out))
        self.register_buffer(
            "mask",
            torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), diagonal=1),
        )

    @classmethod
    def from_reference(cls, mha):
        def load(peer):
            projections = (mha.W_query, mha.W_key, mha.W_value)
            peer.attn.in_proj_weight.copy_(torch.cat([p.weight for p in projections]))
            if peer.attn.in_proj_bias is not None:
                peer.attn.in_proj_bias.copy_(torch.cat([p.bias for p in projections]))
            peer.attn.out_proj.weight.copy_(mha.out_proj.weight)
            peer.attn.out_proj.bias.copy_(mha.out_proj.bias)

        return _copy_into(cls, mha, load)

    def forward(self, x):
        num_tokens = x.shape[1]
        mask = self.mask[:num_tokens, :num_tokens]  # True where a token may not look
        out, _ = self.attn(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)
        return out


PEERS = {
    "sdpa": SDPAAttention,
    "combined_qkv": CombinedQKVAttention,
    "nn_multihead": TorchMultiheadAttention,
}


def _copy_into(cls, mha, load):
    weight = mha.W_query.weight
    peer = cls(
        weight.shape[1],
        mha.d_out,
        mha.mask.shape[0],
        mha.dropout.p,
        mha.num_heads,
        qkv_bias=mha.W_query.bias is not None,
    ).to(device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        load(peer)
    return peer.train(mha.training)
