"""The reference solution and its fast peers: the book's printed values, and agreement with each other."""

import pytest
import torch

from reference.mha import (
    CausalAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    fuse_heads,
    head_column_ranges,
    make_2d_wrapper,
    split_columns,
)
from reference.peers import PEERS, TorchMultiheadAttention

# The running example of chapter 3 of "Build a Large Language Model (From Scratch)".
BOOK_INPUTS = torch.tensor(
    [
        [0.43, 0.15, 0.89],
        [0.55, 0.87, 0.66],
        [0.57, 0.85, 0.64],
        [0.22, 0.58, 0.33],
        [0.77, 0.25, 0.10],
        [0.05, 0.80, 0.55],
    ]
)
BOOK_BATCH = torch.stack((BOOK_INPUTS, BOOK_INPUTS), dim=0)  # (2, 6, 3)
BOOK_ATOL = 1e-4  # the book prints four decimals


def book_output(build):
    torch.manual_seed(123)
    return build()(BOOK_BATCH)


@pytest.mark.parametrize(
    "build, shape, first, last",
    [
        (lambda: CausalAttention(3, 2, 6, 0.0), (2, 6, 2), [-0.4519, 0.2216], [-0.5299, -0.1081]),
        (
            lambda: MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2),
            (2, 6, 4),
            [-0.4519, 0.2216, 0.4772, 0.1063],
            [-0.5299, -0.1081, 0.5077, 0.3493],
        ),
        (lambda: MultiHeadAttention(3, 2, 6, 0.0, num_heads=2), (2, 6, 2), [0.3190, 0.4858], [0.2575, 0.4028]),
        (lambda: make_2d_wrapper(3, 6), (2, 6, 2), [-0.5740, 0.2216], None),
    ],
    ids=["causal_attention", "wrapper", "multi_head_attention", "two_dim_wrapper"],
)
def test_book_values(build, shape, first, last):
    out = book_output(build)
    assert tuple(out.shape) == shape
    for sequence in range(2):  # the batch holds the same sentence twice
        torch.testing.assert_close(out[sequence, 0], torch.tensor(first), rtol=0, atol=BOOK_ATOL)
        if last is not None:
            torch.testing.assert_close(out[sequence, -1], torch.tensor(last), rtol=0, atol=BOOK_ATOL)


def test_gpt2_small_attention_parameter_count():
    mha = MultiHeadAttention(768, 768, 1024, 0.0, num_heads=12)
    assert sum(p.numel() for p in mha.parameters()) == 2_360_064


def test_two_dim_wrapper_keeps_two_plain_heads_of_width_one():
    wrapper = make_2d_wrapper(5, 7, dropout=0.25, qkv_bias=True)
    assert isinstance(wrapper, MultiHeadAttentionWrapper)
    assert len(wrapper.heads) == 2
    for head in wrapper.heads:
        assert type(head) is CausalAttention
        assert head.W_query.weight.shape == (1, 5)
        assert head.W_query.bias is not None
        assert head.dropout.p == 0.25


@pytest.mark.parametrize("num_heads", [1, 3])
def test_wrapper_is_the_concatenation_of_its_heads(num_heads):
    torch.manual_seed(0)
    wrapper = MultiHeadAttentionWrapper(4, 3, 8, 0.0, num_heads).double()
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    out = wrapper(x)
    assert out.shape == (2, 5, 3 * num_heads)
    for h, head in enumerate(wrapper.heads):
        torch.testing.assert_close(out[..., 3 * h : 3 * (h + 1)], head(x), rtol=0, atol=0)


@pytest.mark.parametrize("qkv_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("num_heads, head_dim", [(1, 4), (2, 1), (3, 2), (12, 3)])
def test_fuse_heads_computes_what_the_wrapper_computes(num_heads, head_dim, qkv_bias):
    torch.manual_seed(num_heads)
    wrapper = MultiHeadAttentionWrapper(5, head_dim, 10, 0.0, num_heads, qkv_bias=qkv_bias).double()
    fused = fuse_heads(wrapper)
    assert isinstance(fused, MultiHeadAttention)
    assert (fused.num_heads, fused.head_dim, fused.d_out) == (num_heads, head_dim, num_heads * head_dim)
    assert fused.W_query.weight.dtype == torch.float64
    for num_tokens in (10, 7):  # at and below context_length
        x = torch.randn(3, num_tokens, 5, dtype=torch.float64)
        torch.testing.assert_close(fused(x), wrapper(x), rtol=1e-12, atol=1e-12)


def test_fuse_heads_keeps_the_training_mode():
    wrapper = MultiHeadAttentionWrapper(3, 2, 6, 0.1, num_heads=2)
    assert fuse_heads(wrapper.train()).training
    assert not fuse_heads(wrapper.eval()).training


@pytest.mark.parametrize(
    "num_columns, num_heads, expected",
    [
        (6, 3, [(0, 2), (2, 4), (4, 6)]),
        (8, 4, [(0, 2), (2, 4), (4, 6), (6, 8)]),
        (5, 1, [(0, 5)]),
        (4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
    ],
)
def test_head_column_ranges(num_columns, num_heads, expected):
    assert head_column_ranges(num_columns, num_heads) == expected


@pytest.mark.parametrize(
    "num_columns, num_heads, message",
    [
        (7, 2, "do not split evenly"),
        (3, 4, "do not split evenly"),
        (6, 0, "num_heads must be a positive integer"),
        (6, -2, "num_heads must be a positive integer"),
        (0, 3, "num_columns must be a positive integer"),
        (6.0, 3, "num_columns must be a positive integer"),
        (True, 1, "num_columns must be a positive integer"),
    ],
)
def test_head_column_ranges_rejects_what_cannot_be_split(num_columns, num_heads, message):
    with pytest.raises(ValueError, match=message):
        head_column_ranges(num_columns, num_heads)


def test_split_columns_gives_column_blocks():
    W = torch.arange(24.0).reshape(3, 8)  # (d_in, d_out)
    blocks = split_columns(W, 4)
    assert len(blocks) == 4
    for h, block in enumerate(blocks):
        assert torch.equal(block, W[:, 2 * h : 2 * h + 2])
    with pytest.raises(ValueError):
        split_columns(W, 3)


def test_split_columns_matches_the_heads_of_a_fused_module():
    torch.manual_seed(0)
    wrapper = MultiHeadAttentionWrapper(4, 2, 6, 0.0, num_heads=3)
    fused = fuse_heads(wrapper)
    for block, head in zip(split_columns(fused.W_key.weight.T, 3), wrapper.heads):
        assert torch.equal(block, head.W_key.weight.T)


# nn.MultiheadAttention projects queries from embed_dim, so it only takes d_in == d_out.
PEER_CASES = [
    (name, d_in)
    for name in sorted(PEERS)
    for d_in in (16, 10)
    if d_in == 16 or PEERS[name] is not TorchMultiheadAttention
]


@pytest.mark.parametrize("name, d_in", PEER_CASES, ids=[f"{n}-d_in{d}" for n, d in PEER_CASES])
@pytest.mark.parametrize("qkv_bias", [False, True], ids=["no_bias", "bias"])
def test_peers_compute_what_the_reference_computes(name, d_in, qkv_bias):
    torch.manual_seed(1)
    mha = MultiHeadAttention(d_in, 16, 12, 0.0, num_heads=4, qkv_bias=qkv_bias).double().eval()
    peer = PEERS[name].from_reference(mha)
    assert next(peer.parameters()).dtype == torch.float64
    assert not peer.training
    for num_tokens in (12, 5):  # at and below context_length
        x = torch.randn(2, num_tokens, d_in, dtype=torch.float64)
        with torch.no_grad():
            torch.testing.assert_close(peer(x), mha(x), rtol=1e-10, atol=1e-10)


def test_torch_multihead_attention_needs_equal_widths():
    with pytest.raises(ValueError, match="d_in == d_out"):
        TorchMultiheadAttention(8, 16, 12, 0.0, num_heads=4)
