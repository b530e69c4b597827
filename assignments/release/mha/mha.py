# %% [markdown]
# # Parallel processing of attention heads
#
# A multi-head attention layer runs several attention heads over the same tokens and places
# their results side by side. There are two ways to organise that work:
#
# * a **wrapper** keeps every head as a separate small module and calls them in turn;
# * a **weight-split** layer keeps one large projection matrix per query, key and value, treats
#   slices of it as the heads, and lets a few batched matrix multiplications serve every head at
#   once.
#
# Both produce the same kind of result. In this notebook you write both, check that they really
# agree, and see why the second one is usually the faster of the two.
#
# **How to work through it**
#
# * Cells that contain `raise NotImplementedError()` are yours: replace that line with your code.
#   Keep the names and arguments of functions and classes as they are; the grader calls them.
# * Each part ends with a locked **self-check** cell. Run it after your code: when something is
#   off, it says what it expected and what to look at. Passing it is a good sign, not a
#   guarantee: the grader repeats the checks with inputs you do not see, other sizes and dtypes,
#   and it also checks how your code is organised and how fast the parallel version is.
# * Run the cells from top to bottom; later parts use earlier ones.
#
# **What the grader checks.** The self-checks look at each part on the book's example and a few
# small cases of their own. The grader checks every part again on inputs you do not see (other
# weights, sizes, head counts and dtypes), and some requirements that no self-check looks at, marked
# *(grader only)* below. Besides the values, your code must:
#
# * keep the given code as it is, constructors included: the grader loads its weights into the
#   attributes they make (`W_query`, `W_key`, `W_value`, `out_proj`, ...);
# * keep the input's dtype and device in every output (the device: *grader only*);
# * leave its input unchanged (no in-place changes to `x`);
# * let gradients flow to the input and to every weight (no `.detach()`, `.data` or
#   `torch.no_grad()` in a forward pass);
# * work for sequences shorter than `context_length`;
# * apply dropout to the attention weights, once, and do nothing with it in `eval()` mode
#   (*grader only*);
# * give new answers for new inputs, with nothing cached between calls (*grader only*);
# * call each of the wrapper's heads once, in order, and compute every head of
#   `MultiHeadAttention` in one pass (the number of matrix products is counted: *grader only*).
#
# A property such as "leaves its input unchanged" earns its points only when the output of the same
# call is right. A later part is graded on what it adds: if `combine` is wrong, the wrapper that
# calls it is not charged again, and the feedback points to the part to fix.

# %% [markdown]
# ## 1. The wrapper: correct, but one head at a time
#
# `MultiHeadAttentionWrapper` is the most direct way to get several heads. Its constructor builds
# `num_heads` independent `CausalAttention` modules, each a complete attention unit with its own
# query, key and value projections. Its forward pass hands every head the same input and gathers
# their outputs into one tensor. Nothing in the wrapper changes how a head works, which is what
# makes it easy to trust: if one head is right and the gathering is right, the layer is right.
#
# The price is paid in the order of the work. The forward pass is a Python loop over the heads:
# head 0 finishes all of its computation, then head 1 starts, and so on. Each head's share is a
# handful of matrix multiplications on narrow matrices (only that head's own columns), and each
# of them is a separate call into PyTorch: on a GPU, a separate kernel launch. With many narrow
# heads, that fixed cost per call is paid `num_heads` times over, and no single call is large
# enough to keep the hardware busy. The arithmetic is the same as in the parallel version further
# down; what differs is into how many separate pieces it is cut.
#
# ### The running example
#
# We use the six-token sentence *"Your journey starts with one step"* from chapter 3 of
# *Build a Large Language Model (From Scratch)*, each token embedded in 3 dimensions, and stack
# two copies into a batch of shape `(2, 6, 3)`. With dropout 0 and `torch.manual_seed(123)` right
# before a module is built, the numbers you get are the ones printed in the book, which makes them
# a handy check on your work.

# %%
import torch
import torch.nn as nn

# %%
inputs = torch.tensor(
    [
        [0.43, 0.15, 0.89],  # Your
        [0.55, 0.87, 0.66],  # journey
        [0.57, 0.85, 0.64],  # starts
        [0.22, 0.58, 0.33],  # with
        [0.77, 0.25, 0.10],  # one
        [0.05, 0.80, 0.55],  # step
    ]
)
batch = torch.stack((inputs, inputs), dim=0)  # (b=2, T=6, d_in=3)
batch.shape


# %% [markdown]
# ### One head
#
# `CausalAttention` is given. It projects the input into queries, keys and values, scores every
# query against every key, hides the tokens that come later with a causal mask, turns the scores
# into weights with a softmax, and returns the weighted sum of the values:
# `(b, T, d_in) -> (b, T, d_out)`.

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
torch.manual_seed(123)
single_head = CausalAttention(d_in=3, d_out=2, context_length=6, dropout=0.0)
single_head(batch)[0]  # the book: first row [-0.4519, 0.2216], last row [-0.5299, -0.1081]

# %% [markdown]
# ## 2. Tracing the sequential forward pass
#
# The wrapper's forward pass, which you write in part 3, does what the next cell does by hand.
# With the same seed, the two heads built there are exactly the two heads that
# `MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)` would build. Step by step:
#
# | step | what runs | it receives | it returns |
# | --- | --- | --- | --- |
# | 1 | head 0: projections, scores, mask, softmax, weighted sum | `x`, `(2, 6, 3)` | `(2, 6, 2)` |
# | 2 | head 1, only once head 0 has returned | the same `x` | `(2, 6, 2)` |
# | ... | one step per further head | the same `x` | `(2, 6, d_out)` |
# | last | the gathering step, `combine` | the list of head outputs | `(2, 6, num_heads * d_out)` |
#
# Two things to notice. Every head gets the original `x`, never the output of the head before it:
# the heads are independent of each other. And yet each step waits for the previous one, simply
# because a loop issues them one at a time. That wait is not needed by the mathematics, only by
# the way the code is written, and that is the opening the parallel version uses.

# %%
torch.manual_seed(123)
heads = [CausalAttention(3, 2, 6, 0.0) for _ in range(2)]  # what the wrapper's constructor builds
step_1 = heads[0](batch)  # head 0 runs to the end on the whole batch ...
step_2 = heads[1](batch)  # ... and only then does head 1 start, on the same batch
step_1[0, 0], step_2[0, 0]  # head 0 is the single head above: its first row is [-0.4519, 0.2216]

# %% [markdown]
# ### Question 1
#
# The wrapper's forward pass, `[head(x) for head in self.heads]`, runs several heads on the same
# input. How are the heads evaluated?
#
# * **A**: all at the same time, in one combined computation
# * **B**: one after another: a head starts only once the call of the head before it has returned
#
# Set `HEADS_RUN` to the letter of your answer, as a string (`"A"` or `"B"`; either case is fine).
# The grader scores the answer; the self-check in part 5 only makes sure it is one of the letters.

# %%
HEADS_RUN = None  # "A": all at the same time, "B": one after another
# YOUR CODE HERE
raise NotImplementedError()


# %% [markdown]
# ## 3. The gathering step and the wrapper's forward pass
#
# ### `combine`
#
# Each head returns a tensor of shape `(b, T, d_h)`. The layer's output should hold, for every
# sequence in the batch and every token, one longer vector: head 0's `d_h` numbers, then
# head 1's, and so on. The batch and token positions have to stay lined up across heads; only the
# feature dimension grows.
#
# Write `combine(outputs)` for a list of such tensors, head 0's columns first. The heads' widths
# need not be equal. Before you write it, decide which of the three dimensions is the one that
# grows, and what would go wrong if you joined the tensors along one of the other two.

# %%
def combine(outputs):
    """Gather per-head outputs [(b, T, d_h), ...] into one (b, T, sum d_h), head 0's columns first."""
    # YOUR CODE HERE
    raise NotImplementedError()


# %%
toy_heads = [torch.zeros(2, 6, 2), torch.ones(2, 6, 3)]  # head 0 all zeros, head 1 all ones
combine(toy_heads)[0, 0]  # expected: tensor([0., 0., 1., 1., 1.])


# %% Self-check: part combine, 10 points, do not edit
# Self-check for combine. The grader runs more cases, with inputs you do not see.
def _check_combine():
    head_0, head_1 = torch.zeros(2, 6, 2), torch.ones(2, 6, 2)
    out = combine([head_0, head_1])
    assert isinstance(out, torch.Tensor), f"combine returned {type(out).__name__}; expected a tensor"
    shape = tuple(out.shape)
    hints = {
        (4, 6, 2): "the heads were joined along the batch dimension",
        (2, 12, 2): "the heads were joined along the token dimension",
        (2, 6, 2): "the heads were added or averaged instead of placed side by side",
        (2, 2, 6, 2): "torch.stack added a new dimension instead of widening the last one",
        (2, 6, 2, 2): "torch.stack added a new dimension instead of widening the last one",
    }
    assert shape == (2, 6, 4), (
        f"combine returned shape {shape}; expected (2, 6, 4): concatenate along the last dimension"
        + (f" ({hints[shape]})" if shape in hints else "")
    )
    assert torch.equal(out[..., :2], head_0) and torch.equal(out[..., 2:], head_1), (
        "combine put the heads in the wrong order or mixed their values: "
        "head 0's columns must come first, then head 1's, unchanged"
    )
    widths = [1, 3, 2]
    outputs = [torch.full((1, 4, w), float(h)) for h, w in enumerate(widths)]
    out = combine(outputs)
    assert tuple(out.shape) == (1, 4, 6), (
        f"combine of heads of widths {widths} returned shape {tuple(out.shape)}; expected (1, 4, 6)"
    )
    assert out[0, 0].tolist() == [0.0, 1.0, 1.0, 1.0, 2.0, 2.0], (
        f"combine of heads of widths {widths} gave the row {out[0, 0].tolist()}; "
        "expected each head's columns in head order: [0, 1, 1, 1, 2, 2]"
    )
    return "passed: combine, every visible check"


_check_combine()


# %% [markdown]
# ### The wrapper's `forward`
#
# Now write `MultiHeadAttentionWrapper.forward`: run every head in `self.heads` on the same `x`,
# one after another in their order, and return `combine` of their outputs. This is meant to be the
# sequential version: the grader checks that each head is called exactly once, in order, on the
# unchanged input.

# %%
class MultiHeadAttentionWrapper(nn.Module):
    """Several CausalAttention heads run one after another; their outputs are combined."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )

    def forward(self, x):
        # YOUR CODE HERE
        raise NotImplementedError()


# %%
torch.manual_seed(123)
wrapper = MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)
wrapper(batch)[0]  # the book: shape (2, 6, 4), first row [-0.4519, 0.2216, 0.4772, 0.1063]


# %% Self-check: part wrapper, 15 points, do not edit
# Self-check for MultiHeadAttentionWrapper.forward, on the book's running example.
def _check_wrapper():
    inputs = torch.tensor(
        [[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
         [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]]
    )
    batch = torch.stack((inputs, inputs), dim=0)
    torch.manual_seed(123)
    wrapper = MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)
    calls = []
    hooks = [
        head.register_forward_hook(lambda module, args, output, h=h: calls.append((h, args[0])))
        for h, head in enumerate(wrapper.heads)
    ]
    try:
        out = wrapper(batch)
    finally:
        for hook in hooks:
            hook.remove()
    order = [h for h, _ in calls]
    assert order == [0, 1], (
        f"the heads were called in the order {order}; expected every head once, in order: [0, 1]"
    )
    assert all(torch.equal(seen, batch) for _, seen in calls), (
        "a head received something other than the input x: every head must get the same x"
    )
    assert isinstance(out, torch.Tensor), f"forward returned {type(out).__name__}; expected a tensor"
    outputs = [head(batch) for head in wrapper.heads]
    yours = combine(outputs)  # your own combine of the heads' outputs, in order
    if torch.equal(combine([output + 1 for output in outputs]), yours):
        yours = None  # combine ignores its inputs, so it says nothing about the wrapper: check the columns
    elif out.shape != yours.shape or not torch.allclose(out, yours):
        backwards = combine(outputs[::-1])
        hint = (" (an inconsistent output order: the heads' outputs reach combine in reverse)"
                if out.shape == backwards.shape and torch.allclose(out, backwards) else "")
        raise AssertionError(
            f"forward returned something other than combine of the heads' outputs in the order of self.heads{hint}"
        )
    side_by_side = tuple(out.shape) == (2, 6, 4) and all(
        torch.allclose(out[..., 2 * h : 2 * h + 2], output) for h, output in enumerate(outputs)
    )
    assert side_by_side or yours is not None, (
        "columns 2h and 2h+1 of the output must be head h's output, for every head: pass the heads' outputs, "
        "in order, to combine"
    )
    if not side_by_side:
        return ("waiting: MultiHeadAttentionWrapper.forward calls the heads and combine as it should, but it "
                "returns what your combine returns, which is not right yet: see the combine self-check")
    for where, row, book in (
        ("first", out[0, 0], [-0.4519, 0.2216, 0.4772, 0.1063]),
        ("last", out[1, -1], [-0.5299, -0.1081, 0.5077, 0.3493]),
    ):
        assert torch.allclose(row, torch.tensor(book), atol=1e-4), (
            f"{where} context vector {[round(v, 4) for v in row.tolist()]}; the book prints {book}"
        )
    return "passed: MultiHeadAttentionWrapper.forward, every visible check"


_check_wrapper()


# %% [markdown]
# ## 4. Two-dimensional context vectors (exercise 3.2 of the book)
#
# The wrapper above turns each token into a 4-dimensional context vector: 2 heads, each 2 wide.
# Suppose the next layer expects 2-dimensional vectors, and you want to keep **two** heads.
#
# Because the gathering step sets the heads side by side, the width of the combined output is
# always `num_heads` times the width of one head. With `num_heads` fixed at 2, the only thing left
# to change is the argument that sizes each head. What a head computes stays exactly as it is: no
# extra projection inside a head, no new kind of head, no trimming or averaging of the result
# afterwards.
#
# Write `make_2d_wrapper(d_in, context_length, dropout=0.0, qkv_bias=False)` so that it returns
# such a `MultiHeadAttentionWrapper`, passing `dropout` and `qkv_bias` on.

# %%
def make_2d_wrapper(d_in, context_length, dropout=0.0, qkv_bias=False):
    """A two-head wrapper whose context vectors are 2-dimensional, heads left as they are."""
    # YOUR CODE HERE
    raise NotImplementedError()


# %%
torch.manual_seed(123)
make_2d_wrapper(3, 6)(batch)[0]  # the book: shape (2, 6, 2), first row [-0.5740, 0.2216]


# %% Self-check: part two_dim, 10 points, do not edit
# Self-check for make_2d_wrapper, on the book's running example.
def _check_two_dim():
    inputs = torch.tensor(
        [[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
         [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]]
    )
    batch = torch.stack((inputs, inputs), dim=0)
    torch.manual_seed(123)
    wrapper = make_2d_wrapper(3, 6)
    assert isinstance(wrapper, MultiHeadAttentionWrapper), (
        f"make_2d_wrapper returned {type(wrapper).__name__}; expected a MultiHeadAttentionWrapper"
    )
    assert len(wrapper.heads) == 2, (
        f"the wrapper has {len(wrapper.heads)} heads; keep num_heads=2 and change only how wide each head is"
    )
    assert all(type(head) is CausalAttention for head in wrapper.heads), (
        "the heads must stay plain CausalAttention modules: change the wrapper's arguments, "
        "not what a head computes"
    )
    for head in wrapper.heads:
        sizes = [proj.out_features for proj in (head.W_query, head.W_key, head.W_value)]
        assert len(set(sizes)) == 1, (
            f"a head's query, key and value projections are {sizes} wide: its internals were changed. Change only "
            "the argument that sizes the heads (changing a head when only the output's shape should change)"
        )
    widths = [head.W_query.out_features for head in wrapper.heads]
    hint = " (that is the default width 2: which argument sets a head's width?)" if widths == [2, 2] else ""
    assert widths == [1, 1], (
        f"the heads are {widths} wide; the combined width is 2 x a head's width, and it must be 2{hint}"
    )
    with_bias = make_2d_wrapper(3, 6, dropout=0.1, qkv_bias=True)
    head = with_bias.heads[0]
    assert head.W_query.bias is not None, "make_2d_wrapper(..., qkv_bias=True) must pass qkv_bias on to the heads"
    assert head.dropout.p == 0.1, "make_2d_wrapper(..., dropout=0.1) must pass dropout on to the heads"
    assert tuple(head.mask.shape) == (6, 6), "make_2d_wrapper(3, 6) must pass context_length=6 on to the heads"
    try:
        out = wrapper(batch)
    except NotImplementedError:
        return ("waiting: make_2d_wrapper's heads are right; its output is checked once the wrapper's forward "
                "is written (part 3)")
    book_first = [-0.5740, 0.2216]
    if tuple(out.shape) != (2, 6, 2) or not torch.allclose(out[0, 0], torch.tensor(book_first), atol=1e-4):
        torch.manual_seed(123)
        four_d = MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)(batch)  # the book's example of part 3
        if tuple(four_d.shape) != (2, 6, 4) or not torch.allclose(
            four_d[0, 0], torch.tensor([-0.4519, 0.2216, 0.4772, 0.1063]), atol=1e-4
        ):
            return ("waiting: make_2d_wrapper's heads are right; its output differs from the book's because the "
                    "wrapper's forward or combine does (see their self-checks)")
        assert tuple(out.shape) == (2, 6, 2), f"the wrapper returned shape {tuple(out.shape)}; expected (2, 6, 2)"
        raise AssertionError(
            f"first context vector {[round(v, 4) for v in out[0, 0].tolist()]}; the book prints {book_first}"
        )
    return "passed: make_2d_wrapper, every visible check"


_check_two_dim()

# %% [markdown]
# ## 5. Which columns belong to which head
#
# The parallel version starts from one observation about the wrapper's weights. Write head `h`'s
# query matrix as $W_q^{(h)}$ with shape `(d_in, d_h)`, so that its queries are `x @ W_q^(h)`. Put
# the matrices of all heads side by side and you get one matrix $W_q$ of shape
# `(d_in, num_heads * d_h)`. A single product `x @ W_q` now computes the queries of every head,
# and head `h`'s queries are a block of columns of the result. So the bookkeeping of the whole
# weight split comes down to one question: which columns belong to which head?
#
# Two conventions hold everywhere in this notebook:
#
# * a projection matrix `W` has shape `(d_in, d_out)`, as in `x @ W`. `nn.Linear` stores the
#   transpose, so `W` is `linear.weight.T`, and "the columns of `W`" are the rows of
#   `linear.weight`;
# * a column range is half-open, like a Python slice: `(start, stop)` covers `start` up to
#   `stop - 1`, and its width is `stop - start`.
#
# ### Worked example: 6 columns shared by 3 heads
#
# 1. **Width.** 6 columns for 3 heads gives 6 / 3 = 2 columns per head. The split only works when
#    the division leaves no remainder: 7 columns cannot be shared equally by 2 heads.
# 2. **Head 0** starts at column 0 and takes 2 columns: `(0, 2)`, that is columns 0 and 1.
# 3. **Head 1** starts where head 0 stopped: `(2, 4)`, columns 2 and 3.
# 4. **Head 2** takes the rest: `(4, 6)`, columns 4 and 5.
# 5. **Check.** The first range starts at 0, the last one stops at 6 (the number of columns), and
#    every stop is the next range's start. So each column belongs to exactly one head: none is
#    left out, none is shared.
#
# The answer is `[(0, 2), (2, 4), (4, 6)]`. In the next cell, every entry of a `(3, 6)` matrix is
# its own position, so you can see which entries head 1 owns.

# %%
W_demo = torch.arange(18).reshape(3, 6)  # (d_in=3, d_out=6); every entry is its own position
W_demo[:, 2:4]  # head 1's block: all rows, columns 2 and 3

# %% [markdown]
# ### Your turn: 8 columns shared by 4 heads
#
# First by hand: set `EIGHT_COLUMNS_FOUR_HEADS` to the list of `(start, stop)` ranges, head 0
# first. Then write the general rule, `head_column_ranges(num_columns, num_heads)`. It must raise
# a `ValueError` with a message that says what is wrong when the columns do not split evenly, or
# when either count is not a positive integer.

# %%
EIGHT_COLUMNS_FOUR_HEADS = None  # the list of (start, stop) ranges for 8 columns and 4 heads
# YOUR CODE HERE
raise NotImplementedError()


# %%
def head_column_ranges(num_columns, num_heads):
    """Half-open column ranges [(0, w), (w, 2w), ...], one per head, for a split into equal widths."""
    # YOUR CODE HERE
    raise NotImplementedError()


# %% [markdown]
# ### Question 2
#
# Back to part 4, where the combined output needed another shape: 2 numbers per token instead of 4.
# The exercise has a rule for such a change. When the combined output needs another shape, what
# changes?
#
# * **A**: what each head computes: the kind of projections it makes, its mask, its softmax or its
#   weighted sum
# * **B**: the attention weights inside a head
# * **C**: only how the heads' results are sized and gathered into the combined output (for example
#   the `d_out` each head is given, or the `combine` step), each head's role unchanged
# * **D**: the input embeddings
#
# Set `OUTPUT_SHAPE_STEP` to the letter of your answer, as a string (either case is fine).

# %%
OUTPUT_SHAPE_STEP = None  # "A", "B", "C" or "D"
# YOUR CODE HERE
raise NotImplementedError()


# %% Self-check: part quiz, 10 points, do not edit
# Self-check for the two questions: it only checks that each answer is an allowed letter.
# Whether the answers are right is decided by the grader.
def _check_quiz():
    for name, answer, letters in (
        ("HEADS_RUN", HEADS_RUN, ("A", "B")),
        ("OUTPUT_SHAPE_STEP", OUTPUT_SHAPE_STEP, ("A", "B", "C", "D")),
    ):
        allowed = ", ".join(repr(letter) for letter in letters)
        if answer is None:
            raise NotImplementedError(f"{name} is not answered yet: set it to one of {allowed}")
        assert isinstance(answer, str) and answer.strip().upper() in letters, (
            f"{name} is {answer!r}; it must be one letter as a string, one of {allowed}"
        )
    return "answered: both answers are allowed letters; whether they are right, only the grader says"


_check_quiz()


# %% [markdown]
# ### `split_columns`
#
# Write `split_columns(W, num_heads)`: the list of per-head blocks of a `(d_in, d_out)` matrix,
# head 0 first, using the column ranges from `head_column_ranges`. Each block keeps all `d_in` rows.

# %%
def split_columns(W, num_heads):
    """The per-head column blocks W[:, start:stop] of a (d_in, d_out) matrix, head 0 first."""
    # YOUR CODE HERE
    raise NotImplementedError()


# %%
[tuple(block.shape) for block in split_columns(W_demo, 3)]  # expected: three blocks of shape (3, 2)


# %% Self-check: part columns, 10 points, do not edit
# Self-check for EIGHT_COLUMNS_FOUR_HEADS, head_column_ranges and split_columns.
def _check_columns():
    if EIGHT_COLUMNS_FOUR_HEADS is None:
        raise NotImplementedError("EIGHT_COLUMNS_FOUR_HEADS is not answered yet")
    ranges = [tuple(r) for r in EIGHT_COLUMNS_FOUR_HEADS]
    assert len(ranges) == 4, f"EIGHT_COLUMNS_FOUR_HEADS has {len(ranges)} ranges; expected one per head, 4"
    assert all(ranges[h][1] == ranges[h + 1][0] for h in range(3)), (
        f"EIGHT_COLUMNS_FOUR_HEADS = {ranges}: the ranges are half-open (stop is excluded), so each "
        "range's stop is the next range's start"
    )
    assert ranges[0][0] == 0 and ranges[-1][1] == 8, (
        f"EIGHT_COLUMNS_FOUR_HEADS = {ranges}: the first range must start at 0 and the last must stop "
        "at 8, the number of columns"
    )
    assert len({stop - start for start, stop in ranges}) == 1, (
        f"EIGHT_COLUMNS_FOUR_HEADS = {ranges}: every head gets the same number of columns"
    )

    got = [tuple(r) for r in head_column_ranges(6, 3)]
    hints = {
        ((0, 1), (2, 3), (4, 5)): "inclusive ranges: a range is half-open, so stop is one past the head's last column",
        ((1, 3), (3, 5), (5, 7)): "counted from 1: columns are numbered from 0",
        ((0, 2), (2, 2), (4, 2)): "(start, width) pairs: the second number is where the range stops",
    }
    hint = f" ({hints[tuple(got)]})" if tuple(got) in hints else ""
    assert got == [(0, 2), (2, 4), (4, 6)], (
        f"head_column_ranges(6, 3) returned {got}; the worked example gives [(0, 2), (2, 4), (4, 6)]{hint}"
    )
    got = head_column_ranges(8, 4)
    assert [tuple(r) for r in got] == ranges, (
        f"head_column_ranges(8, 4) returned {got}, which disagrees with EIGHT_COLUMNS_FOUR_HEADS = {ranges}"
    )
    got = head_column_ranges(5, 1)
    assert [tuple(r) for r in got] == [(0, 5)], f"head_column_ranges(5, 1) returned {got}; one head owns every column"
    for bad in ((7, 2), (6, 0), (0, 3), (6, -3)):
        try:
            head_column_ranges(*bad)
        except ValueError:
            continue
        except NotImplementedError:
            raise
        except Exception as exc:
            raise AssertionError(
                f"head_column_ranges{bad} raised {type(exc).__name__}; expected a ValueError that says what is wrong"
            ) from exc
        raise AssertionError(f"head_column_ranges{bad} returned normally; expected a ValueError that says what is wrong")

    W = torch.arange(18.0).reshape(3, 6)
    blocks = split_columns(W, 3)
    assert len(blocks) == 3, f"split_columns(W, 3) returned {len(blocks)} blocks; expected one per head, 3"
    shapes = [tuple(block.shape) for block in blocks]
    hint = " (those are rows; a head owns columns of W)" if shapes[0] == (1, 6) else ""
    assert shapes == [(3, 2)] * 3, f"split_columns of a (3, 6) matrix gave blocks of shapes {shapes}; expected (3, 2) each{hint}"
    for h, block in enumerate(blocks):
        assert torch.equal(block, W[:, 2 * h : 2 * h + 2]), (
            f"block {h} is {block.tolist()}; expected columns {2 * h} and {2 * h + 1} of W, all rows"
        )
    return "passed: column ranges and split_columns, every visible check"


_check_columns()


# %% [markdown]
# ## 6. The weight-split parallel forward pass
#
# `MultiHeadAttention`'s constructor is given. `W_query`, `W_key` and `W_value` are each one
# `nn.Linear(d_in, d_out)`: read them as the side-by-side stacks of all heads' matrices from
# part 5, so head `h` owns columns `h * head_dim` up to `(h + 1) * head_dim`. There is also an
# output projection `out_proj`, which mixes the heads' results (the wrapper has no such step), a
# dropout module and the causal mask.
#
# **Keep the constructor as it is; write only `forward`.** The grader builds your
# `MultiHeadAttention` with this constructor and loads its hidden weights into `W_query`, `W_key`,
# `W_value`, `out_proj` and `mask` by name, so that your forward and the reference compute with the
# same weights. Another layout of the same numbers, such as one `qkv = nn.Linear(d_in, 3 * d_out)` for
# all three projections (a common design), can compute the same thing, but the grader cannot put its
# weights into it, and none of this part's checks can run. The self-check below says so too.
#
# Write `forward(x)`. Below, `b` is the batch size, `T` the number of tokens, `H` the number of
# heads, `hd` the head width (`head_dim`) and `d_out = H * hd`. The shape after each step:
#
# | step | what happens | shape |
# | --- | --- | --- |
# | 1 | project `x` with `W_query`, `W_key`, `W_value`: one product each serves every head | `(b, T, d_out)` |
# | 2 | split the last dimension into heads, so that head `h` gets its own columns | `(b, T, H, hd)` |
# | 3 | move the head dimension next to the batch: every (sequence, head) pair is now one independent attention problem | `(b, H, T, hd)` |
# | 4 | scores: queries times transposed keys, over the last two dimensions | `(b, H, T, T)` |
# | 5 | causal mask (cut to `T x T`), divide by `sqrt(hd)`, softmax over the last dimension, dropout | `(b, H, T, T)` |
# | 6 | weighted sum of the values | `(b, H, T, hd)` |
# | 7 | move the heads back behind the tokens | `(b, T, H, hd)` |
# | 8 | merge the heads: each token's `H` vectors of width `hd` side by side | `(b, T, d_out)` |
# | 9 | the output projection `out_proj` | `(b, T, d_out)` |
#
# Some things to keep in mind:
#
# * Steps 2 and 8 are where part 5's column ranges live. Reshaping the last dimension `d_out` into
#   `(H, hd)` gives head `h` exactly the columns `head_column_ranges(d_out, H)[h]`, and merging
#   undoes it in the same order.
# * Scale by `sqrt(hd)`, not `sqrt(d_out)`: each head's dot products run over `hd` numbers.
# * After step 7 the tensor's memory is no longer laid out row by row; `.view` refuses such
#   tensors, so make it contiguous first or use `.reshape`.
# * The mask is `context_length x context_length`; inputs may be shorter than that.
# * There is no loop over heads anywhere. Steps 1, 4, 6 and 9 are six matrix products for any
#   number of heads (three projections, the scores, the weighted sum, the output projection), where
#   the wrapper needs five per head (it has no output projection). The grader counts them, and unless
#   your course allows it, it does not accept `F.scaled_dot_product_attention` or
#   `nn.MultiheadAttention` here: the point is to write the computation yourself.

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
        # YOUR CODE HERE
        raise NotImplementedError()


# %%
torch.manual_seed(123)
mha = MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)
mha(batch)[0]  # the book: shape (2, 6, 2), first row [0.3190, 0.4858], last row [0.2575, 0.4028]

# %% [markdown]
# The same class at the size of GPT-2 small's attention layers: 768 dimensions in and out, 12
# heads, 1024 tokens of context. Its parameters are the four `768 x 768` matrices of the query,
# key, value and output projections (2,359,296 numbers) plus the output projection's 768 biases;
# the query, key and value projections have none, since `qkv_bias` is off.

# %%
gpt2_attention = MultiHeadAttention(768, 768, 1024, 0.0, num_heads=12)
sum(p.numel() for p in gpt2_attention.parameters())  # 2,360,064


# %% Self-check: part mha, 20 points, do not edit
# Self-check for MultiHeadAttention.forward: the book's example, then a case the book does not
# print (3 heads, bias, float64, a sequence shorter than context_length). Both are compared with
# the same computation done one head at a time, and, when they differ, with that computation done
# with one of the usual mistakes, to name the likely one.
def _one_head_at_a_time(mha, x, scale="head_dim", mask=True, split="columns", merge="side_by_side", out_proj=True):
    """What MultiHeadAttention computes, head by head; the arguments make one step go wrong on purpose."""
    b, num_tokens, _ = x.shape
    H, hd = mha.num_heads, mha.head_dim
    projected = [proj(x) for proj in (mha.W_query, mha.W_key, mha.W_value)]  # (b, T, d_out) each
    future = torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool), diagonal=1)
    contexts = []
    for h in range(H):
        if split == "columns":  # head h owns columns h * hd up to (h + 1) * hd
            q, k, v = (t[..., h * hd : (h + 1) * hd] for t in projected)
        else:  # reshaped straight to (b, H, T, hd): tokens and heads mixed up
            q, k, v = (t.reshape(b, H, num_tokens, hd)[:, h] for t in projected)
        scores = q @ k.transpose(1, 2)
        if mask:
            scores = scores.masked_fill(future, -torch.inf)
        divisor = {"head_dim": hd, "d_out": mha.d_out, "none": 1}[scale] ** 0.5
        contexts.append(torch.softmax(scores / divisor, dim=-1) @ v)  # (b, T, hd)
    if merge == "side_by_side":
        merged = torch.cat(contexts, dim=-1)
    else:  # merged from (b, H, T, hd) without moving the heads back behind the tokens
        merged = torch.stack(contexts, dim=1).reshape(b, num_tokens, mha.d_out)
    return mha.out_proj(merged) if out_proj else merged


_MHA_MISTAKES = {
    "the scores are divided by sqrt(d_out); each head's dot products run over head_dim numbers, "
    "so divide by sqrt(head_dim)": dict(scale="d_out"),
    "the scores are not scaled: divide them by sqrt(head_dim) before the softmax": dict(scale="none"),
    "there is no causal mask: set the scores of later tokens to -inf before the softmax": dict(mask=False),
    "a half-done weight split: the projections were reshaped straight to (b, H, T, hd); view them as "
    "(b, T, H, hd), then transpose(1, 2)": dict(split="reshape"),
    "a half-done weight split: the heads were merged without moving them back behind the tokens; "
    "transpose(1, 2) before the view to (b, T, d_out)": dict(merge="stacked"),
    "the output projection is missing: finish with self.out_proj": dict(out_proj=False),
}


_GIVEN = ("W_query", "W_key", "W_value", "out_proj", "mask")  # what the given constructor makes
_GIVEN_ARGUMENTS = ["d_in", "d_out", "context_length", "dropout", "num_heads", "qkv_bias"]


def _names(names):
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _given_shapes(d_in=3, d_out=2, context_length=6):
    """The weights the given constructor makes for MultiHeadAttention(d_in, d_out, context_length, ...)."""
    shapes = {f"{name}.weight": (d_out, d_in) for name in ("W_query", "W_key", "W_value")}
    return {**shapes, "out_proj.weight": (d_out, d_out), "out_proj.bias": (d_out,),
            "mask": (context_length, context_length)}


def _constructor_problem():
    """What the grader says when it cannot build your MultiHeadAttention with its weights, else None: the
    constructor takes other arguments, or makes other weights than the given one (checked on the book's sizes)."""
    import inspect

    arguments = list(inspect.signature(MultiHeadAttention).parameters)
    if arguments != _GIVEN_ARGUMENTS:
        order = "them in another order" if sorted(arguments) == sorted(_GIVEN_ARGUMENTS) else "other arguments"
        return ("the grader builds your MultiHeadAttention with the given constructor's arguments, in their order: "
                f"MultiHeadAttention(d_in, d_out, context_length, dropout, num_heads, qkv_bias=False); yours takes "
                f"{order}. Keep the given constructor as it is.")
    state = {key: tuple(value.shape) for key, value in MultiHeadAttention(3, 2, 6, 0.0, num_heads=2).state_dict().items()}
    given = _given_shapes()
    found = dict.fromkeys(key.split(".")[0] for key in state)
    yours = [n for n in found if any(k.startswith(f"{n}.") for k in state)] + [n for n in found if n in state]
    missing, extra = [n for n in _GIVEN if n not in yours], [n for n in yours if n not in _GIVEN]
    absent, added = [k for k in given if k not in state], [k for k in state if k not in given]
    if extra and missing:
        found = f"has {_names(extra)} instead of {_names(missing)}"
    elif missing:
        found = f"has no {_names(missing)}"
    elif extra:
        found = f"also has {_names(extra)}, which the grader cannot fill"
    elif absent and added:
        found = (f"holds {_names([f'{k} {state[k]}' for k in added])} where the given constructor holds "
                 f"{_names([f'{k} {given[k]}' for k in absent])}")
    elif absent or added:
        found = f"has no {_names(absent)}" if absent else f"also has {_names(added)}, which the grader cannot fill"
    else:
        shapes = [f"{k} is {state[k]} in yours, {given[k]} in the given constructor" for k in given if state[k] != given[k]]
        if not shapes:
            return None
        found = f"the shapes differ: {'; '.join(shapes)}"
        return (f"the grader loads its hidden weights into {_names(_GIVEN)}, the attributes the given constructor "
                f"makes, so that your MultiHeadAttention and the reference compute with the same weights; {found}. "
                "Keep the given constructor as it is and write only forward.")
    return (f"the grader loads its hidden weights into {_names(_GIVEN)}, the attributes the given constructor "
            f"makes, so that your MultiHeadAttention and the reference compute with the same weights; your "
            f"MultiHeadAttention {found}. Keep the given constructor as it is and write only forward.")


def _compare_mha(mha, x, out, label, tolerance):
    with torch.no_grad():
        expected = _one_head_at_a_time(mha, x)
        assert tuple(out.shape) == tuple(expected.shape), (
            f"{label}: forward returned shape {tuple(out.shape)}; expected (b, T, d_out) = {tuple(expected.shape)}"
            + (" (the heads were not merged back into one vector per token)" if out.dim() == 4 else "")
        )
        worst = (out.detach() - expected).abs().max().item()
        if worst < tolerance:
            return
        likely = [
            mistake for mistake, wrong in _MHA_MISTAKES.items()
            if (out.detach() - _one_head_at_a_time(mha, x, **wrong)).abs().max().item() < tolerance
        ]
    raise AssertionError(
        f"{label}: forward differs from the head-by-head computation by up to {worst:.3g}. "
        + (f"Likely mistake: {likely[0]}." if likely else "Check which columns each head uses, the scale "
           "sqrt(head_dim), the mask cut to T x T, and that the heads move back behind the tokens before merging.")
    )


def _check_mha():
    inputs = torch.tensor(
        [[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
         [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]]
    )
    batch = torch.stack((inputs, inputs), dim=0)
    problem = _constructor_problem()
    assert problem is None, problem
    torch.manual_seed(123)
    mha = MultiHeadAttention(3, 2, 6, 0.0, num_heads=2)
    out = mha(batch)
    assert isinstance(out, torch.Tensor), f"forward returned {type(out).__name__}; expected a tensor"
    _compare_mha(mha, batch, out, "the book's example", tolerance=1e-5)
    for where, row, book in (("first", out[0, 0], [0.3190, 0.4858]), ("last", out[1, -1], [0.2575, 0.4028])):
        assert torch.allclose(row, torch.tensor(book), atol=1e-4), (
            f"{where} context vector {[round(v, 4) for v in row.tolist()]}; the book prints {book}"
        )

    torch.manual_seed(0)
    d_in, d_out, num_heads, context_length, num_tokens = 5, 6, 3, 8, 4
    mha = MultiHeadAttention(d_in, d_out, context_length, 0.0, num_heads, qkv_bias=True).double()
    x = torch.randn(2, num_tokens, d_in, dtype=torch.float64)
    x_before = x.clone()
    try:
        out = mha(x)
    except RuntimeError as error:
        if "must match the size" not in str(error):
            raise
        raise AssertionError(
            f"forward fails for {num_tokens} tokens with context_length {context_length}: cut the causal mask "
            "to T x T, so that sequences shorter than context_length work"
        ) from error
    assert torch.equal(x, x_before), "forward modified its input x in place; work on new tensors instead"
    assert out.dtype == torch.float64, f"a float64 input gave a {out.dtype} output; keep the input's dtype"
    _compare_mha(mha, x, out, f"3 heads, bias, {num_tokens} of {context_length} tokens", tolerance=1e-9)
    x.requires_grad_(True)
    out = mha(x)
    assert out.requires_grad, "the output is not connected to the weights: no .detach(), .data or torch.no_grad()"
    out.sum().backward()
    assert x.grad is not None and all(p.grad is not None for p in mha.parameters()), (
        "no gradient reached the input or some weight: no .detach(), .data or torch.no_grad() in forward"
    )
    return "passed: MultiHeadAttention.forward, every visible check"


_check_mha()

# %% [markdown]
# ### Is it faster?
#
# It depends on the shape of the work, and the reason is worth seeing. Both versions do the same
# arithmetic; the wrapper cuts it into `num_heads` times as many separate calls into PyTorch, and
# every call has a fixed cost (Python, dispatching, and on a GPU a kernel launch) whatever its size.
# So the weight split wins by the most when there are **many narrow heads and short sequences**:
# the calls are small, their fixed cost dominates, and the wrapper pays it once per head. With
# few wide heads and long sequences the fixed costs hardly count, and what matters is memory. At
# GPT-2 size (12 heads of width 64, 1024 tokens, one sequence) the course's benchmark (`make bench`,
# one thread, torch 2.13) measured on a small CPU (2 cores of an AMD EPYC, 32 MiB of L3 cache)
# 116 ms per forward for the wrapper and 219 ms for the weight split: the weight split ran at 0.56
# times the wrapper's speed, and at 0.55 with the backward pass. The arithmetic is the same; what
# differs is memory. The weight split holds the scores of all heads at once, a `(1, 12, 1024, 1024)`
# tensor of 48 MiB, which no longer fits in the cache, so the mask, the scaling, the softmax and the
# product with the values each read it back from main memory. The wrapper holds one head's
# `(1, 1024, 1024)` scores at a time, 4 MiB, which stay in the cache from one step to the next.
# (Fused attention, `scaled_dot_product_attention`, never holds the whole score matrix, and ran in
# 90 ms there.) On a GPU the fixed cost of a launch weighs more: on one NVIDIA H200 the same
# benchmark (batch 8, float32) took 3.29 ms per forward for the wrapper, 2.62 ms for the weight
# split and 1.41 ms for `scaled_dot_product_attention`, which does the same computation in fewer,
# larger steps.
#
# That is why the grader times your `MultiHeadAttention` on many narrow heads: on the CPU, a batch
# of 2 sequences of 16 tokens, 256 dimensions split into 64 heads of width 4 (on a GPU, 64 heads of
# width 16 over 256 tokens, in float32 and in bfloat16). It times the reference wrapper and the
# reference `MultiHeadAttention` in the same run, with the same weights and new inputs every
# round, and compares your speedup over the wrapper with the reference's own: about as fast as the
# reference earns the speed points, and a loop over heads earns none, even when its values are
# right. What it times is not your Python code itself but the PyTorch operations it runs: the grader
# records them once, as a graph (the matrix multiplies, views, softmax and so on, in order), checks
# that graph (no ready-made attention, as many matrix multiplies for 12 heads as for 2), and runs it
# on new inputs in a clean process, where it is timed with one thread, as the reference's graphs are.
# So your forward must be a computation on tensors whatever their values: it must not branch on a
# tensor's values or read one out (`if scores.max() > 0`, `.item()`, `bool(...)`), which cannot be
# recorded as a graph. Anything else it does (printing, sleeping, starting threads) is not part of the
# graph, and neither helps nor hurts.
#
# The next cell records your forward the same way, then times your two classes on this machine, for
# 4, 16 and 64 heads of the same total width: watch the speedup grow with the number of heads. You
# can call `_time_against_wrapper(num_heads=...)` yourself to try other shapes.

# %% Self-check: part speed, 10 points, do not edit
# Self-check for speed: your MultiHeadAttention against your wrapper, timed as the grader times it.
# (Timing is for where you run the notebook; the grader measures speed on its own, so it skips this.)
_SPEED_WORKLOAD = dict(batch=2, num_tokens=16, d_model=256, num_heads=64)  # the grader's, on the CPU
_SPEED_FLOOR = 5.0  # a weight split measured 9 to 12 times as fast here; a loop over heads at most about three


def _time_against_wrapper(num_heads, batch=2, num_tokens=16, d_model=256, rounds=15, calls=8):
    """Median over rounds of (wrapper time / MultiHeadAttention time): one thread, eval mode, no
    autograd, two warm-up rounds, new inputs every round, the two modules taking turns at going first."""
    import statistics
    import time

    torch.manual_seed(0)
    wrapper = MultiHeadAttentionWrapper(d_model, d_model // num_heads, num_tokens, 0.0, num_heads).eval()
    mha = MultiHeadAttention(d_model, d_model, num_tokens, 0.0, num_heads).eval()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ratios = []
    try:
        with torch.no_grad():
            for round_ in range(rounds + 2):
                xs = [torch.randn(batch, num_tokens, d_model) for _ in range(calls)]
                seconds = {}
                for name, module in (("wrapper", wrapper), ("mha", mha))[:: 1 if round_ % 2 else -1]:
                    start = time.perf_counter()
                    for x in xs:
                        out = module(x)
                    seconds[name] = time.perf_counter() - start
                    assert tuple(out.shape) == (batch, num_tokens, d_model), (
                        f"{name} returned shape {tuple(out.shape)}; expected {(batch, num_tokens, d_model)}"
                    )
                if round_ >= 2:
                    ratios.append(seconds["wrapper"] / seconds["mha"])
    finally:
        torch.set_num_threads(threads)
    return statistics.median(ratios)


def _capture_problem(num_heads=4):
    """None when the forward of your MultiHeadAttention can be recorded as a graph of PyTorch operations, as
    the grader records it before it checks and times it; else what went wrong."""
    from torch.func import functional_call
    from torch.fx.experimental.proxy_tensor import make_fx

    mha = MultiHeadAttention(12, 24, 6, 0.0, num_heads).eval()
    state = {**dict(mha.named_parameters()), **dict(mha.named_buffers())}
    names = list(state)

    def forward(*tensors):
        return functional_call(mha, dict(zip(names, tensors[:-1])), (tensors[-1],))

    try:
        with torch.no_grad():
            make_fx(forward)(*[t.detach() for t in state.values()], torch.randn(2, 6, 12))
    except Exception as error:
        first = str(error).split(". ")[0]
        return (f"your forward could not be captured as a graph of PyTorch operations ({type(error).__name__}: "
                f"{first}). The forward cannot be captured as a graph: it must not branch on a tensor's values or "
                "read one (`if scores.max() > 0`, `.item()`, `bool(...)`, a shape made from values); write it with "
                "tensor operations only, whatever the input's values")
    return None


def _verdict_of(check):
    """A self-check's verdict, whatever it raises: "passed: ...", "waiting: ...", "not done yet", "failed: ..."."""
    try:
        return check()
    except NotImplementedError:
        return "not done yet"
    except Exception as error:  # an AssertionError, or whatever else the code raised
        return f"failed: {error}"


def _check_speed():
    values, wrapper = _verdict_of(_check_mha), _verdict_of(_check_wrapper)
    if values == "not done yet":  # nothing to time yet: raised, as the stubs do, never a free pass
        raise NotImplementedError("waiting: speed is timed once MultiHeadAttention is written: see part 6")
    if not values.startswith("passed"):
        return ("waiting: speed counts only once MultiHeadAttention's values are right (the grader's rule too): "
                "see the self-check of part 6")
    if not wrapper.startswith("passed"):
        return ("waiting: this self-check times MultiHeadAttention against your wrapper, whose output is not right "
                "yet: see the self-check of part 3 (the grader times it against its own wrapper)")
    problem = _capture_problem()
    assert problem is None, problem
    workload = dict(_SPEED_WORKLOAD)
    heads = workload.pop("num_heads")
    speedups = {h: _time_against_wrapper(h, **workload) for h in (4, 16, heads)}
    for h, speedup in speedups.items():
        print(f"{h:3d} heads of width {workload['d_model'] // h:3d}: MultiHeadAttention is {speedup:5.2f} times "
              "as fast as the wrapper")
    assert speedups[heads] >= _SPEED_FLOOR, (
        f"with {heads} narrow heads your MultiHeadAttention is only {speedups[heads]:.2f} times as fast as the "
        f"wrapper (a weight split measured 9 to 12 times as fast here): is it still working one head at a "
        "time? Project once, view as (b, T, H, head_dim), move the heads in front of the tokens and let one "
        "batched matmul serve them all"
    )
    return f"passed: with {heads} narrow heads MultiHeadAttention is {speedups[heads]:.1f} times as fast as the wrapper"


_check_speed() if __name__ == "__main__" else "speed: timed by the grader"


# %% [markdown]
# ## 7. `fuse_heads`: the same quantity, organised differently
#
# The wrapper and the weight-split layer are not two different kinds of attention. Given a
# wrapper, you can build a `MultiHeadAttention` that computes exactly the same output, just by
# arranging the weights:
#
# * head `h`'s query, key and value matrices become the columns `head_column_ranges(d_out, H)[h]`
#   of the fused `W_query`, `W_key` and `W_value`, where `d_out` is the total width of all heads
#   (and likewise for the biases, when there are any);
# * the wrapper has no output projection, so `out_proj` must change nothing: the identity matrix,
#   with a zero bias.
#
# Remember that `nn.Linear` stores `W` transposed: the columns of `W` are rows of `.weight`.
# Copy into parameters inside `torch.no_grad()`. The fused module should take the wrapper's input
# width, context length, dropout and bias setting from the wrapper itself, and live on the same
# dtype and device.
#
# Write `fuse_heads(wrapper)`. When it is right, the two modules agree to rounding error, which is
# the most direct evidence that the parallel version changes how the work is organised and not
# what is computed.

# %%
def fuse_heads(wrapper):
    """A MultiHeadAttention computing exactly what `wrapper` computes, with one weight per projection."""
    # YOUR CODE HERE
    raise NotImplementedError()


# %%
torch.manual_seed(123)
wrapper = MultiHeadAttentionWrapper(3, 2, 6, 0.0, num_heads=2)
fused = fuse_heads(wrapper)
(fused(batch) - wrapper(batch)).abs().max()  # zero, or a rounding error around 1e-7


# %% Self-check: part fuse, 15 points, do not edit
# Self-check for fuse_heads: the fused module must give the wrapper's output.
def _check_fuse():
    inputs = torch.tensor(
        [[0.43, 0.15, 0.89], [0.55, 0.87, 0.66], [0.57, 0.85, 0.64],
         [0.22, 0.58, 0.33], [0.77, 0.25, 0.10], [0.05, 0.80, 0.55]]
    )
    batch = torch.stack((inputs, inputs), dim=0)
    # (label, d_in, head width, context_length, num_heads, qkv_bias)
    cases = (
        ("the book's wrapper", 3, 2, 6, 2, False),
        ("3 heads with bias, float64, 5 of 7 tokens", 4, 3, 7, 3, True),
    )
    if _constructor_problem() is not None:
        return ("waiting: fuse_heads builds a MultiHeadAttention, whose constructor must stay as given: see the "
                "self-check of part 6")
    for label, d_in, head_width, context_length, num_heads, qkv_bias in cases:
        torch.manual_seed(123)
        wrapper = MultiHeadAttentionWrapper(d_in, head_width, context_length, 0.0, num_heads, qkv_bias=qkv_bias)
        x = batch
        if qkv_bias:
            wrapper = wrapper.double()
            x = torch.randn(2, 5, d_in, dtype=torch.float64)
        width = head_width * num_heads
        try:
            fused = fuse_heads(wrapper)
        except NotImplementedError:
            raise
        except RuntimeError as error:
            ranges = [tuple(r) for r in head_column_ranges(width, num_heads)]
            half_open = ranges[0][0] == 0 and ranges[-1][1] == width and all(
                a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            if half_open:
                raise
            return (
                f"waiting: {label}: fuse_heads raised {type(error).__name__}, and head_column_ranges({width}, "
                f"{num_heads}) returns {ranges}, which are not half-open ranges covering the columns: if fuse_heads "
                "uses it, fix head_column_ranges first (see the self-check of part 5)"
            )
        assert isinstance(fused, MultiHeadAttention), (
            f"fuse_heads returned {type(fused).__name__}; expected a MultiHeadAttention"
        )
        assert (fused.num_heads, fused.d_out) == (num_heads, width), (
            f"{label}: the fused module has num_heads={fused.num_heads}, d_out={fused.d_out}; "
            f"expected one head per wrapper head and d_out = num_heads * head width = {width}"
        )
        assert fused.W_query.weight.dtype == x.dtype, (
            f"{label}: the fused weights are {fused.W_query.weight.dtype}; the wrapper's are {x.dtype}: create "
            "the MultiHeadAttention with the wrapper's dtype and device"
        )
        assert tuple(fused.mask.shape) == (context_length, context_length), (
            f"{label}: the fused mask is {tuple(fused.mask.shape)}; pass the wrapper's context_length on"
        )
        heads = list(wrapper.heads)
        for kind in ("weight", "bias") if qkv_bias else ("weight",):
            for name in ("W_query", "W_key", "W_value"):
                for h, head in enumerate(heads):
                    start, stop = h * head_width, (h + 1) * head_width  # head h's columns of W: rows of .weight
                    block = getattr(getattr(fused, name), kind)[start:stop]
                    if torch.equal(block, getattr(getattr(head, name), kind)):
                        continue
                    mirror = getattr(getattr(heads[-1 - h], name), kind)
                    hint = (" (head order reversed: an inconsistent output order)"
                            if num_heads > 1 and torch.equal(block, mirror)
                            else ": every head's bias goes into its range too, "
                            "fused.W_query.bias[start:stop] = head.W_query.bias" if kind == "bias" else "")
                    raise AssertionError(
                        f"{label}: the fused {name}.{kind}[{start}:{stop}] (head {h}'s columns ({start}, {stop}) "
                        f"of W) is not head {h}'s {name}.{kind}{hint}"
                    )
        identity = torch.eye(width, dtype=x.dtype)
        assert torch.equal(fused.out_proj.weight, identity) and not fused.out_proj.bias.any(), (
            f"{label}: out_proj must change nothing (identity weight, zero bias): the wrapper has no output "
            "projection, and the fused module computes exactly what the wrapper computes"
        )
        try:
            expected, got = wrapper(x), fused(x)
        except (NotImplementedError, RuntimeError) as error:
            return (f"waiting: fuse_heads places the weights right. A forward raised "
                    f"{type(error).__name__}, so the outputs are compared once the self-checks of parts 3 and 6 pass")
        tolerance = 1e-9 if x.dtype == torch.float64 else 1e-5
        if got.shape != expected.shape or (got - expected).abs().max().item() > tolerance:
            return ("waiting: fuse_heads places the weights right, so the fused module differs "
                    "from the wrapper because a forward does: see the self-checks of parts 3 and 6")
    return "passed: fuse_heads, every visible check"


_check_fuse()

# %% [markdown]
# ## 8. Common mistakes
#
# The grader's feedback names these five by their headings when it recognises one of them.
#
# **Changing a head when only the output's shape should change.** In part 4 it is tempting to
# add a projection inside `CausalAttention`, or to slice or average the heads' outputs. That builds
# a different layer instead of reshaping the result of this one. The heads stay as they are; the
# width of the output follows from how the heads are sized and how their outputs are gathered.
#
# **Thinking the parallel version computes something else.** The weight split is a reorganisation
# of the same arithmetic: part 7 shows a wrapper and a `MultiHeadAttention` agreeing to rounding
# error. If your parallel version does not match the head-by-head computation, it has a bug; it
# is not a different design.
#
# **A half-done weight split.** Reshaping the projections straight into `(b, H, T, hd)`, or
# merging the heads without first moving them back behind the tokens, gives tensors of exactly the
# right shape that hold the wrong numbers: rows of different tokens get mixed into one head. Shape
# checks alone do not catch it; compare values, as the next cell does for head 1's queries.

# %%
torch.manual_seed(123)
queries = torch.randn(2, 6, 4)  # (b, T, d_out): 2 heads of width 2, side by side
split_then_move = queries.view(2, 6, 2, 2).transpose(1, 2)  # (b, H, T, hd), head h = its columns
reshaped_directly = queries.view(2, 2, 6, 2)  # also (b, H, T, hd), but tokens and heads mixed up
torch.equal(split_then_move[:, 1], queries[..., 2:4]), torch.equal(reshaped_directly[:, 1], queries[..., 2:4])

# %% [markdown]
# **An inconsistent output order.** Head 0's columns come first, everywhere: in `combine`, in the
# column ranges, when merging heads in `forward`, and when `fuse_heads` places each head's weights.
# Swapping two heads in one of those places and not in the others keeps every shape intact and
# changes the values.
#
# **A drifting output shape.** `torch.stack` instead of `torch.cat` adds a dimension; summing
# the heads removes their width; forgetting to merge the heads leaves `(b, H, T, hd)`. Whatever
# you change, the layer should still return `(b, T, d_out)`, with `d_out` the total width of all
# heads. Look at `.shape` after each step of the table in part 6.
#
# ## Submitting
#
# Submit this notebook, or the `.py` version, with your code in it. To run every self-check at once
# (in your own Python, on the book's example and the self-checks' own cases), use `make check` in the
# student kit, or `python selfcheck.py path/to/your/file`. The grader runs its own checks, on inputs
# you do not see, in a sandbox.
