"""Realistic wrong submissions, graded end to end: each loses exactly the checks it deserves, named once.

Every submission is the reference solution with one snippet replaced, the way a student would get one step
wrong. For each one the table lists, per part, the checks (functions) that must fail: all of their cases,
or some but not all of them when the name ends in "~". Every other check must pass, so a part not listed
keeps full marks: a mistake in one step is not charged again in a later part that uses it (the wrapper
calls combine, make_2d_wrapper builds a wrapper, fuse_heads builds a MultiHeadAttention and may call
head_column_ranges: where what a part calls raises or is wrong, it runs with a stand-in, values only). The points
lost follow from the rubric's weights, never from numbers typed here. The table also says which words each
part's failures must contain: the diagnosis.

Two rules tie the grader to the notebook's self-checks, for every submission in the table:
- a part that loses points has a visible check that fails, or its self-check fails (a hidden check adds
  inputs, never requirements); the one exception is the answer key of the quiz;
- a self-check that fails belongs to a part that loses points (the self-checks are not stricter).

All submissions are graded once per session, two at a time, in two long-lived grading processes (as
grade-class grades a class). The speed part, the slowest by far, is graded only where the mistake is about
speed (it names what the speed part must say), and for one mistake that loses the speed points because its
values are wrong (the rubric's `[speed] requires`); every other submission is graded without it (`--part`).
"""

from __future__ import annotations

import dataclasses
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from autograder.grading.checks import mistakes as common
from autograder.grading.submission import read_cells
from autograder.model import GradingRun
from autograder.rubric import load_rubric
from helpers import REFERENCE, GradingPool, failures, mutated_reference, part_scores

# Every test grades whole submissions; the first waits for the whole table to be graded (several minutes).
pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]

# The attention step of MultiHeadAttention.forward in the reference, from the scores to the context vectors.
MHA_ATTENTION = """\
        attn_scores = queries @ keys.transpose(2, 3)  # (b, H, T, T)
        attn_scores = attn_scores.masked_fill(
            self.mask.bool()[:num_tokens, :num_tokens], -torch.inf
        )
        # Scale by sqrt(head_dim), the width each head's dot products run over, not by d_out.
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)

        # Back to (b, T, H, hd) before merging, so each token's heads sit side by side.
        context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, H, hd)
"""
MHA_SPLIT = """\
        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)  # (b, T, H, hd)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)

        # Heads become a batch dimension, so one batched matmul serves all of them.
        keys = keys.transpose(1, 2)  # (b, H, T, hd)
        queries = queries.transpose(1, 2)  # (b, H, T, hd)
        values = values.transpose(1, 2)  # (b, H, T, hd)
"""
MHA_SCALE = """\
        # Scale by sqrt(head_dim), the width each head's dot products run over, not by d_out.
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
"""
MHA_MASK = """\
        attn_scores = attn_scores.masked_fill(
            self.mask.bool()[:num_tokens, :num_tokens], -torch.inf
        )
        # Scale by sqrt(head_dim)"""
MHA_RETURN = "return self.out_proj(context_vec)  # (b, T, d_out)"
COMBINE = "return torch.cat(outputs, dim=-1)"
WRAPPER_RETURN = "return combine(outputs)  # (b, T, num_heads * d_out)"
MAKE_2D = "    return MultiHeadAttentionWrapper(d_in, 1, context_length, dropout, num_heads=2, qkv_bias=qkv_bias)\n"
FUSE_DTYPE = "    ).to(first.W_query.weight)\n"
FUSE_COPY = "                getattr(fused, name).weight[start:stop] = getattr(head, name).weight\n"
MHA_ALL_BUT_BOOK = (
    "test_shorter_sequences",
    "test_matches_reference",
    "test_keeps_dtype",
    "test_input_not_modified",
    "test_new_inputs_new_answers",
    "test_gradients",
    "test_one_pass_for_all_heads",
    "test_no_ready_made_attention",
    "test_dropout",
)
MHA_ALL = ("test_book_example", *MHA_ALL_BUT_BOOK)
WRAPPER_ALL = (
    "test_book_example",
    "test_heads_run_once_in_order_on_same_input",
    "test_matches_reference",
    "test_input_not_modified",
    "test_gradients",
    "test_dropout",
)
FUSE_ALL = (
    "test_weights_placed_per_head",
    "test_keeps_dtype_and_device",
    "test_fused_output_equals_wrapper",
    "test_wrapper_left_unchanged",
)
TWO_DIM_ALL = (
    "test_two_heads_of_width_one",
    "test_book_example",
    "test_passes_dropout_and_bias_on",
    "test_output_is_the_heads_side_by_side",
)
PROPERTY_OF_WRONG_ANSWER = "counts only once the output on this check's input is right"
# MultiHeadAttention with one fused projection for the queries, keys and values: a common design that computes
# the same, but not with the attributes of the given constructor the grader loads its weights into.
MHA_CLASS = REFERENCE.read_text().split("# %%\nclass MultiHeadAttention(nn.Module):\n", 1)[1].split("\n# %%", 1)[0]
QKV_CLASS = '''    """All heads in one batched pass, with one projection for the queries, keys and values."""

    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):
        super().__init__()
        assert d_out % num_heads == 0, "d_out must be divisible by num_heads"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        qkv = self.qkv(x).view(b, num_tokens, 3, self.num_heads, self.head_dim)
        queries, keys, values = qkv.permute(2, 0, 3, 1, 4)  # 3 x (b, H, T, hd)
        attn_scores = queries @ keys.transpose(2, 3)
        attn_scores = attn_scores.masked_fill(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = self.dropout(torch.softmax(attn_scores / self.head_dim ** 0.5, dim=-1))
        context_vec = (attn_weights @ values).transpose(1, 2).contiguous().view(b, num_tokens, self.d_out)
        return self.out_proj(context_vec)

'''
QKV_FUSE = """        d_out = fused.d_out
        for which, name in enumerate(("W_query", "W_key", "W_value")):  # qkv holds them one after another
            for (start, stop), head in zip(head_column_ranges(d_out, num_heads), heads):
                fused.qkv.weight[which * d_out + start : which * d_out + stop] = getattr(head, name).weight
                if getattr(head, name).bias is not None:
                    fused.qkv.bias[which * d_out + start : which * d_out + stop] = getattr(head, name).bias
"""
FUSE_PLACEMENT = """        for (start, stop), head in zip(head_column_ranges(fused.d_out, num_heads), heads):
            for name in ("W_query", "W_key", "W_value"):
                # Head h's W (d_in, head_dim) becomes columns start:stop of the fused W;
                # nn.Linear keeps W transposed, so those columns are rows of .weight.
                getattr(fused, name).weight[start:stop] = getattr(head, name).weight
                if getattr(head, name).bias is not None:
                    getattr(fused, name).bias[start:stop] = getattr(head, name).bias
"""
CONSTRUCTOR_RULE = "the grader loads its hidden weights into W_query, W_key, W_value, out_proj and mask"
SIGNATURE_RULE = "the grader builds your MultiHeadAttention with the given constructor's arguments, in their order"
LINEAR_LAYERS = """        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out)  # mixes the heads' outputs
"""
PROJECTIONS = """        # One matrix multiply per projection computes every head's queries, keys and values.
        keys = self.W_key(x)  # (b, T, d_out)
        queries = self.W_query(x)  # (b, T, d_out)
        values = self.W_value(x)  # (b, T, d_out)
"""
FUSE_BIAS = """                if getattr(head, name).bias is not None:
                    getattr(fused, name).bias[start:stop] = getattr(head, name).bias
"""
GIVEN_SIGNATURE = "    def __init__(self, d_in, d_out, context_length, dropout, num_heads, qkv_bias=False):\n        super().__init__()\n        assert d_out"
FUSE_CALL = """        first.mask.shape[0],
        first.dropout.p,
        num_heads,
"""
SYNTAX_LINE = next(n for n, line in enumerate(REFERENCE.read_text().splitlines(), 1) if COMBINE in line)
# What fuse's checks say while the MultiHeadAttention constructor (the mha part's) is not the given one
FUSE_WAITS = "does not keep the given constructor, so the grader cannot build it with its weights"
ANSWER_KEY = {"quiz::test_answer"}  # the quiz's answers: right or wrong only after the due date, by design


@dataclass(frozen=True)
class Mistake:
    id: str
    old: str  # a snippet of reference/mha.py (it must occur exactly once) ...
    new: str  # ... and what the student wrote instead
    fails: dict[str, tuple[str, ...]]  # part -> the checks that fail ("name": every case, "name~": some cases)
    # part -> words its failures must contain (case-insensitive); the first words in its first failure, the
    # one the summary shows
    says: dict[str, str | tuple[str, ...]]
    more: tuple[tuple[str, str], ...] = ()  # further (old, new) replacements in the same submission
    diagnoses: int = 1  # how many distinct diagnoses its failures make: each mistake is named once
    # part -> words its rows that wait must say: checks that cannot be judged for this mistake, made in another
    # part; they are not charged (the part keeps its points), tagged "not-charged", and say "waiting: "
    waits: dict[str, str] = dataclasses.field(default_factory=dict)


SPEED = ("test_faster_than_the_wrapper",)

MISTAKES = [
    # --- quiz
    Mistake(
        "quiz_both_wrong",
        'HEADS_RUN = "B"\n',
        'HEADS_RUN = "A"\n',
        {"quiz": ("test_answer",)},
        {
            "quiz": (
                "HEADS_RUN = 'A' is not right",
                "OUTPUT_SHAPE_STEP = 'A' is not right",
                "d_out=1 sizes each head's result",
            )
        },
        more=(('OUTPUT_SHAPE_STEP = "C"\n', 'OUTPUT_SHAPE_STEP = "A"\n'),),
        diagnoses=2,  # two wrong answers
    ),
    Mistake(
        "quiz_lowercase",
        'HEADS_RUN = "B"\n',
        'HEADS_RUN = "b"\n',
        {},
        {},
        more=(('OUTPUT_SHAPE_STEP = "C"\n', 'OUTPUT_SHAPE_STEP = " c"\n'),),
        diagnoses=0,
    ),
    # --- combine: charged in combine alone, although the wrapper and the 2-D wrapper call it
    Mistake(
        "combine_batch_dim",
        COMBINE,
        "return torch.cat(outputs, dim=0)",
        {"combine": ("test_book_example", "test_concatenates_heads~", "test_keeps_dtype")},
        {"combine": ("Likely mistake: concatenated along the batch dimension", common.SHAPE_DRIFT)},
    ),
    Mistake(
        "combine_token_dim",
        COMBINE,
        "return torch.cat(outputs, dim=1)",
        {"combine": ("test_book_example", "test_concatenates_heads~", "test_keeps_dtype")},
        {
            "combine": (
                "Likely mistake: concatenated along the token dimension",
                common.SHAPE_DRIFT,
            )
        },
    ),
    Mistake(
        "combine_reversed",
        COMBINE,
        "return torch.cat(outputs[::-1], dim=-1)",
        {"combine": ("test_book_example", "test_concatenates_heads~", "test_keeps_dtype")},
        {"combine": ("Likely mistake: heads in the wrong order (reversed)", common.INCONSISTENT_ORDER)},
    ),
    Mistake(
        "combine_summed",
        COMBINE,
        "return sum(outputs)",
        {"combine": ("test_book_example", "test_concatenates_heads~", "test_keeps_dtype")},
        {"combine": "Likely mistake: heads summed instead of concatenated"},
    ),
    Mistake(
        "combine_stacked",
        COMBINE,
        "return torch.stack(outputs, dim=-1)",
        {"combine": ("test_book_example", "test_concatenates_heads", "test_keeps_dtype")},
        {"combine": ("Likely mistake: stacked into a new dimension", common.SHAPE_DRIFT)},
    ),
    Mistake(
        "zeros_everywhere",
        COMBINE,
        "return torch.zeros(*outputs[0].shape[:-1], sum(o.shape[-1] for o in outputs), dtype=outputs[0].dtype)",
        {
            "combine": ("test_book_example", "test_concatenates_heads", "test_keeps_dtype"),
            "wrapper": WRAPPER_ALL,
            "mha": MHA_ALL,
        },
        {
            "wrapper": ("values differ from the reference", PROPERTY_OF_WRONG_ANSWER),
            "mha": ("values differ from the reference", PROPERTY_OF_WRONG_ANSWER),
        },
        more=(
            (WRAPPER_RETURN, "return torch.zeros(*x.shape[:-1], len(outputs) * outputs[0].shape[-1], dtype=x.dtype)"),
            (MHA_RETURN, "return torch.zeros_like(self.out_proj(context_vec))"),
        ),
        diagnoses=3,  # combine, the wrapper's forward and MultiHeadAttention's forward: each returns zeros
    ),
    # --- wrapper: the 2-D wrapper is built right, so two_dim keeps its points
    Mistake(
        "wrapper_heads_reversed",
        "outputs = [head(x) for head in self.heads]",
        "outputs = [head(x) for head in reversed(self.heads)]",
        {
            "wrapper": (
                "test_book_example",
                "test_heads_run_once_in_order_on_same_input",
                "test_matches_reference~",
                "test_input_not_modified",
                "test_gradients",
                "test_dropout",
            )
        },
        {
            "wrapper": (
                "Likely mistake: the heads' outputs are combined in the wrong order",
                "the heads ran in the order [3, 2, 1, 0]",
                common.INCONSISTENT_ORDER,
            )
        },
    ),
    # --- two_dim
    Mistake(
        "two_dim_one_head_of_width_two",
        MAKE_2D,
        "    return MultiHeadAttentionWrapper(d_in, 2, context_length, dropout, num_heads=1, qkv_bias=qkv_bias)\n",
        {"two_dim": TWO_DIM_ALL},
        {"two_dim": "the exercise keeps num_heads=2"},
    ),
    Mistake(
        "two_dim_head_changed",
        MAKE_2D,
        "    wrapper = MultiHeadAttentionWrapper(d_in, 2, context_length, dropout, num_heads=2, "
        "qkv_bias=qkv_bias)\n"
        "    for head in wrapper.heads:  # narrow each head's values to one column\n"
        "        head.W_value = nn.Linear(d_in, 1, bias=qkv_bias)\n"
        "    return wrapper\n",
        {"two_dim": TWO_DIM_ALL},
        {"two_dim": ("head internals changed", common.HEAD_CHANGED)},
    ),
    Mistake(
        "two_dim_bias_not_passed_on",
        MAKE_2D,
        "    return MultiHeadAttentionWrapper(d_in, 1, context_length, dropout, num_heads=2)\n",
        {"two_dim": ("test_passes_dropout_and_bias_on",)},
        {"two_dim": "built heads without biases: pass qkv_bias on"},
    ),
    Mistake(
        "two_dim_dropout_not_passed_on",
        MAKE_2D,
        "    return MultiHeadAttentionWrapper(d_in, 1, context_length, 0.0, num_heads=2, qkv_bias=qkv_bias)\n",
        {"two_dim": ("test_passes_dropout_and_bias_on",)},
        {"two_dim": "does not drop anything in training mode: pass dropout on"},
    ),
    # --- a syntax error: one diagnosis, at the file's line; the wrapper, which calls combine, runs with a stand-in
    Mistake(
        "syntax_error_in_combine",
        COMBINE + "\n",
        COMBINE.replace("dim=-1)", "dim=-1") + "\n",
        {"combine": ("test_book_example", "test_concatenates_heads", "test_keeps_dtype")},
        {"combine": ("which defines combine, has a syntax error", f"line {SYNTAX_LINE})")},
        # the wrapper's gradients cannot flow through combine's stand-in (values only): not charged, and said
        waits={"wrapper": "no gradient flows through values"},
    ),
    # --- a syntax error in MultiHeadAttention's cell: charged in mha alone; fuse_heads, which builds one, waits
    Mistake(
        "syntax_error_in_mha",
        MHA_RETURN,
        MHA_RETURN.replace("(context_vec)", "(context_vec"),
        {"mha": MHA_ALL},
        {"mha": "which defines MultiHeadAttention, has a syntax error"},
        waits={"fuse": "has a syntax error"},
    ),
    # --- columns (fuse_heads places weights with head_column_ranges: it runs with a stand-in while they are wrong)
    Mistake(
        "columns_literal_inclusive",
        "EIGHT_COLUMNS_FOUR_HEADS = [(0, 2), (2, 4), (4, 6), (6, 8)]",
        "EIGHT_COLUMNS_FOUR_HEADS = [(0, 1), (2, 3), (4, 5), (6, 7)]",
        {"columns": ("test_eight_columns_four_heads",)},
        {"columns": "Likely mistake: inclusive ranges"},
    ),
    Mistake(
        "columns_function_inclusive",
        "return [(h * width, (h + 1) * width) for h in range(num_heads)]",
        "return [(h * width, (h + 1) * width - 1) for h in range(num_heads)]",
        {"columns": ("test_head_column_ranges",)},
        {"columns": "Likely mistake: inclusive ranges"},
    ),
    Mistake(
        "split_rows",
        "return [W[:, start:stop] for start, stop in head_column_ranges(W.shape[1], num_heads)]",
        "return [W[start:stop] for start, stop in head_column_ranges(W.shape[0], num_heads)]",
        {"columns": ("test_split_columns~",)},
        {"columns": "Likely mistake: rows instead of columns"},
    ),
    # --- mha: MultiHeadAttention.forward is charged in mha alone, although fuse_heads builds one
    Mistake(
        "mha_scale_d_out",
        MHA_SCALE,
        "        attn_weights = torch.softmax(attn_scores / self.d_out ** 0.5, dim=-1)\n",
        {"mha": ("test_book_example", *MHA_ALL_BUT_BOOK[:1], "test_matches_reference~", *MHA_ALL_BUT_BOOK[2:])},
        {"mha": "Likely mistake: scores scaled by sqrt(d_out)"},
    ),
    Mistake(
        "mha_no_mask",
        MHA_MASK,
        "        # Scale by sqrt(head_dim)",
        {"mha": MHA_ALL},
        {"mha": "Likely mistake: no causal mask"},
    ),
    Mistake(
        "mha_mask_not_cut_to_tokens",
        MHA_MASK,
        MHA_MASK.replace("[:num_tokens, :num_tokens]", ""),
        {"mha": ("test_shorter_sequences", "test_matches_reference~")},
        {"mha": ("fails for 3 tokens when context_length is 9", "cut it to T x T")},
    ),
    Mistake(
        "mha_missing_transpose",
        "context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, H, hd)",
        "context_vec = attn_weights @ values  # (b, H, T, hd)",
        {"mha": ("test_book_example", "test_shorter_sequences", "test_matches_reference~", *MHA_ALL_BUT_BOOK[2:])},
        {"mha": ("Likely mistake: missing transpose", common.HALF_SPLIT)},
    ),
    Mistake(
        "mha_split_without_transpose",
        MHA_SPLIT,
        "        keys = keys.view(b, self.num_heads, num_tokens, self.head_dim)  # (b, H, T, hd)\n"
        "        queries = queries.view(b, self.num_heads, num_tokens, self.head_dim)\n"
        "        values = values.view(b, self.num_heads, num_tokens, self.head_dim)\n",
        {"mha": ("test_book_example", "test_shorter_sequences", "test_matches_reference~", *MHA_ALL_BUT_BOOK[2:])},
        {"mha": ("Likely mistake: heads split by reshaping straight to", common.HALF_SPLIT)},
    ),
    Mistake(
        "mha_split_wrong_axes",
        MHA_SPLIT,
        MHA_SPLIT.replace("transpose(1, 2)", "transpose(1, 3)"),
        {"mha": MHA_ALL},
        {"mha": ("Likely mistake: wrong axes transposed when splitting the heads", common.HALF_SPLIT)},
    ),
    Mistake(
        "mha_merge_wrong_axes",
        "context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, H, hd)",
        "context_vec = (attn_weights @ values).transpose(1, 3)  # (b, T, H, hd)",
        {
            "mha": (
                "test_shorter_sequences",
                "test_matches_reference~",
                "test_input_not_modified",
                "test_new_inputs_new_answers",
                "test_gradients",
                "test_one_pass_for_all_heads",
                "test_no_ready_made_attention",
                "test_dropout",
            )
        },
        {"mha": ("Likely mistake: wrong axes transposed when merging the heads", common.HALF_SPLIT)},
    ),
    Mistake(
        "mha_heads_not_merged",
        MHA_RETURN,
        "return attn_weights @ values  # (b, H, T, hd)",
        {"mha": MHA_ALL},
        {"mha": ("Likely mistake: the heads are never merged", common.SHAPE_DRIFT)},
    ),
    Mistake(
        "mha_no_out_proj",
        MHA_RETURN,
        "return context_vec",
        {"mha": MHA_ALL},
        {"mha": "Likely mistake: missing output projection"},
    ),
    Mistake(
        "mha_one_qkv_projection",
        MHA_CLASS,
        QKV_CLASS,
        {"mha": MHA_ALL},
        {"mha": (CONSTRUCTOR_RULE, "your MultiHeadAttention has qkv instead of W_query, W_key and W_value")},
        more=((FUSE_PLACEMENT, QKV_FUSE),),
        waits={"fuse": FUSE_WAITS},
    ),
    # another layout of MultiHeadAttention's weights, or another signature: the one constructor diagnosis
    Mistake(
        "mha_raw_parameters",
        LINEAR_LAYERS,
        "        self.W_query = nn.Parameter(torch.randn(d_in, d_out) / d_in ** 0.5)\n"
        "        self.W_key = nn.Parameter(torch.randn(d_in, d_out) / d_in ** 0.5)\n"
        "        self.W_value = nn.Parameter(torch.randn(d_in, d_out) / d_in ** 0.5)\n"
        "        self.out_proj = nn.Linear(d_out, d_out)  # mixes the heads' outputs\n",
        {"mha": MHA_ALL},
        {"mha": (CONSTRUCTOR_RULE, "holds W_query (3, 2), W_key (3, 2) and W_value (3, 2) where the given")},
        waits={"fuse": FUSE_WAITS},
        more=(
            (
                PROJECTIONS,
                "        keys = x @ self.W_key  # (b, T, d_out)\n        queries = x @ self.W_query\n"
                "        values = x @ self.W_value\n",
            ),
            (FUSE_COPY, "                getattr(fused, name).data[:, start:stop] = getattr(head, name).weight.T\n"),
            (FUSE_BIAS, ""),
        ),
    ),
    Mistake(
        "mha_extra_parameter",
        "        self.out_proj = nn.Linear(d_out, d_out)  # mixes the heads' outputs\n",
        "        self.out_proj = nn.Linear(d_out, d_out)  # mixes the heads' outputs\n"
        "        self.temperature = nn.Parameter(torch.ones(1))  # a learnt scale\n",
        {"mha": MHA_ALL},
        {"mha": (CONSTRUCTOR_RULE, "also has temperature, which the grader cannot fill")},
        diagnoses=1,
        # fuse_heads is judged on the given weights (its placement passes); its own forward cannot be compared
        waits={"fuse": FUSE_WAITS},
    ),
    Mistake(
        "mha_arguments_in_another_order",
        GIVEN_SIGNATURE,
        GIVEN_SIGNATURE.replace("context_length, dropout, num_heads", "num_heads, context_length, dropout"),
        {"mha": MHA_ALL},
        {"mha": (SIGNATURE_RULE, "yours takes them in another order")},
        more=((FUSE_CALL, "        num_heads,\n        first.mask.shape[0],\n        first.dropout.p,\n"),),
        waits={"fuse": FUSE_WAITS},
    ),
    Mistake(
        "mha_loop_over_heads",
        MHA_ATTENTION,
        "        attn_scores = torch.stack(  # one head at a time\n"
        "            [queries[:, h] @ keys[:, h].transpose(1, 2) for h in range(self.num_heads)], dim=1\n"
        "        )  # (b, H, T, T)\n"
        "        attn_scores = attn_scores.masked_fill(\n"
        "            self.mask.bool()[:num_tokens, :num_tokens], -torch.inf\n"
        "        )\n"
        "        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)\n"
        "        attn_weights = self.dropout(attn_weights)\n"
        "        context_vec = torch.stack(\n"
        "            [attn_weights[:, h] @ values[:, h] for h in range(self.num_heads)], dim=2\n"
        "        )  # (b, T, H, hd)\n",
        {"mha": ("test_one_pass_for_all_heads",), "speed": SPEED},
        {"mha": "a loop over heads", "speed": "a Python loop over the heads"},
        diagnoses=2,  # the structure that loops, and the speed it costs
    ),
    Mistake(
        "mha_loop_with_dropout_per_head",
        MHA_ATTENTION,
        "        contexts = []\n"
        "        for h in range(self.num_heads):  # one head at a time\n"
        "            scores = queries[:, h] @ keys[:, h].transpose(1, 2)  # (b, T, T)\n"
        "            scores = scores.masked_fill(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)\n"
        "            weights = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))\n"
        "            contexts.append(weights @ values[:, h])  # (b, T, hd)\n"
        "        context_vec = torch.stack(contexts, dim=2)  # (b, T, H, hd)\n",
        {"mha": ("test_one_pass_for_all_heads",), "speed": SPEED},
        {"mha": "a loop over heads", "speed": "a Python loop over the heads"},
        diagnoses=2,  # the structure that loops, and the speed it costs
    ),
    Mistake(
        "mha_branches_on_a_value",  # a sanity check on the values: right, but not a graph of tensor operations
        MHA_SCALE,
        MHA_SCALE
        + '        if torch.isnan(attn_weights).any():\n            raise ValueError("NaN in the attention weights")\n',
        {"mha": ("test_one_pass_for_all_heads", "test_no_ready_made_attention"), "speed": SPEED},
        {"mha": ("could not be captured as a graph", "must not branch on a tensor's values")},
    ),
    Mistake(
        "mha_sdpa",
        MHA_ATTENTION,
        "        context_vec = torch.nn.functional.scaled_dot_product_attention(\n"
        "            queries, keys, values, dropout_p=self.dropout.p if self.training else 0.0, is_causal=True\n"
        "        ).transpose(1, 2)  # (b, T, H, hd)\n",
        {"mha": ("test_no_ready_made_attention",)},
        {"mha": "the forward calls scaled_dot_product_attention"},
    ),
    Mistake(
        "mha_dropout_on_context",
        "        attn_weights = self.dropout(attn_weights)\n\n"
        "        # Back to (b, T, H, hd) before merging, so each token's heads sit side by side.\n"
        "        context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, H, hd)\n",
        "        context_vec = self.dropout(attn_weights @ values).transpose(1, 2)  # (b, T, H, hd)\n",
        {"mha": ("test_dropout",)},
        {"mha": "Likely mistake: dropout applied to the context vectors"},
    ),
    Mistake(
        "mha_modifies_input",
        MHA_RETURN,
        "x.zero_()  # the input is not needed any more\n        " + MHA_RETURN,
        {"mha": ("test_input_not_modified", "test_gradients")},
        {"mha": ("the forward modified its input x in place", "changes a tensor in place that gradients need")},
    ),
    Mistake(
        "mha_forces_float32",
        MHA_RETURN,
        "return self.out_proj(context_vec).to(torch.float32)",
        {"mha": MHA_ALL_BUT_BOOK[:1] + ("test_matches_reference~",) + MHA_ALL_BUT_BOOK[2:]},
        {"mha": "keep the input's dtype"},
    ),
    # --- fuse
    Mistake(
        "fuse_out_proj_left_random",
        "        fused.out_proj.weight.copy_(torch.eye(fused.d_out))\n        fused.out_proj.bias.zero_()\n",
        "",
        {"fuse": FUSE_ALL},
        {"fuse": ("Likely mistake: out_proj is not the identity", common.OTHER_QUANTITY)},
    ),
    Mistake(
        "fuse_fresh_weights",
        FUSE_COPY,
        "                pass  # a MultiHeadAttention of the right size\n",
        {"fuse": FUSE_ALL},
        {"fuse": ("holds none of the wrapper's W_query weights", common.OTHER_QUANTITY)},
    ),
    Mistake(
        "fuse_heads_reversed",
        "zip(head_column_ranges(fused.d_out, num_heads), heads)",
        "zip(head_column_ranges(fused.d_out, num_heads), heads[::-1])",
        {
            "fuse": (
                "test_weights_placed_per_head~",
                "test_keeps_dtype_and_device",
                "test_fused_output_equals_wrapper~",
                "test_wrapper_left_unchanged",
            )
        },
        {"fuse": ("Likely mistake: heads placed in reverse order", common.INCONSISTENT_ORDER)},
    ),
    Mistake(
        "fuse_bias_not_copied",
        FUSE_BIAS,
        "",
        {
            "fuse": (
                "test_weights_placed_per_head~",
                "test_keeps_dtype_and_device",
                "test_fused_output_equals_wrapper~",
                "test_wrapper_left_unchanged",
            )
        },
        {"fuse": ("Likely mistake: the fused W_query.bias[0:4] (head 0's columns (0, 4) of W) is not head 0's",)},
    ),
    Mistake(
        "fuse_default_dtype",
        FUSE_DTYPE,
        "    )\n",
        {"fuse": ("test_keeps_dtype_and_device",)},
        {"fuse": "does not have the wrapper's dtype"},
    ),
    Mistake(
        "fuse_one_head",
        "        num_heads,\n        qkv_bias=first.W_query.bias is not None,",
        "        1,  # one wide head\n        qkv_bias=first.W_query.bias is not None,",
        {"fuse": ("test_fused_output_equals_wrapper~",)},
        {"fuse": "check the arguments fuse_heads passes to MultiHeadAttention (num_heads"},
    ),
]


def speed_lost_with_wrong_values(mistake: Mistake) -> Mistake:
    """The speed part counts only when the checks the rubric's [speed] requires pass: a mistake that fails
    one of them (in any case) earns no speed points either, as the rubric says."""
    for key in load_rubric().speed.requires:
        part, name = key.split("::")
        if any(failed.rstrip("~") == name for failed in mistake.fails.get(part, ())) and "speed" not in mistake.fails:
            return dataclasses.replace(mistake, fails={**mistake.fails, "speed": SPEED})
    return mistake


MISTAKES = [speed_lost_with_wrong_values(m) for m in MISTAKES]
# The one mistake graded with the speed part for the rule above (the first that the rule gives speed to).
SPEED_BY_RULE = next(m.id for m in MISTAKES if "speed" in m.fails and "speed" not in m.says)


def grades_speed(mistake: Mistake) -> bool:
    """Whether this mistake's submission is graded with the speed part: it is about speed, or shows the rule."""
    return "speed" in mistake.says or mistake.id == SPEED_BY_RULE


COMMON_MISTAKES = (
    common.HEAD_CHANGED,
    common.OTHER_QUANTITY,
    common.HALF_SPLIT,
    common.INCONSISTENT_ORDER,
    common.SHAPE_DRIFT,
)


def build(root, mistake: Mistake):
    path = mutated_reference(root, mistake.id, mistake.old, mistake.new)
    source = path.read_text()
    for old, new in mistake.more:
        assert source.count(old) == 1, f"{mistake.id}: {old!r} occurs {source.count(old)} times"
        source = source.replace(old, new)
    path.write_text(source)
    return path


@pytest.fixture(scope="session")
def graded(request, tmp_path_factory) -> dict[str, tuple[dict, object, object]]:
    """{mistake id: (results.json, the grading's outcome, the submission's path)} for the mistakes whose tests
    were selected (so `-k` grades only those), each graded once, two at a time in two long-lived grading
    processes. Each grading gets one intra-op thread: two gradings share two cores, and torch's spinning
    OpenMP threads would otherwise compete for them (the scores do not depend on it)."""
    root = tmp_path_factory.mktemp("wrong")
    selected = {
        item.callspec.params["mistake"].id
        for item in request.session.items
        if "mistake" in getattr(getattr(item, "callspec", None), "params", {})
    }

    paths = {m.id: build(root, m) for m in MISTAKES if m.id in selected}  # a stale snippet fails before grading
    by_id = {m.id: m for m in MISTAKES}
    without_speed = [part for part in load_rubric().parts if part != "speed"]

    def run(item):
        name, path = item
        parts = None if grades_speed(by_id[name]) else without_speed
        results, outcome = graders.grade(path, path.parent, parts=parts)
        return name, (results, outcome, path)

    graders = GradingPool()
    try:
        with pytest.MonkeyPatch.context() as patch, ThreadPoolExecutor(max_workers=2) as pool:
            patch.setenv("OMP_NUM_THREADS", "1")
            return dict(pool.map(run, paths.items()))
    finally:
        graders.close()


LIKELY = re.compile(r"Likely (?:mistake|cause): ([^\n]*)")
COUNTED = re.compile(r"^(?:failed|not credited|waiting) in [^\n]*\n")


def diagnoses(results: dict) -> set[tuple[str, str]]:
    """The distinct diagnoses, by part, of the failures that count against the submission. A check that is
    not credited (it rests on something wrong elsewhere) accuses nothing, and a failure that points to where
    its diagnosis is said ("the same as under ...") says nothing new."""
    said = set()
    for test in failures(results):
        if "not-credited" in test["tags"] or "the same as under" in test["output"]:
            continue
        # a row that counts its cases says each of its diagnoses once, on a line of its own: "[case]: ..."
        body = COUNTED.sub("", test["output"])
        groups = re.split(r"(?m)^\[[^\n]*?\]: ", body) if re.match(r"\[", body) else [body]
        for group in filter(None, groups):
            found = LIKELY.search(group)
            said.add((test["tags"][0], re.sub(r"[\d.]+", "#", found.group(1) if found else group)))
    return said


def function_of(test: dict) -> str:
    return test["tags"][1].split("::", 1)[1]


def self_checks_that_failed(path, results) -> set[str]:
    """The parts whose self-check cell (the one that calls `_check_<part>()`) raised while the file loaded. A
    cell that cannot find a name because the cell defining it has a syntax error waits for it (so the
    self-check says, `selfcheck.py`): it has not failed."""
    cell_part = {}
    for number, _line, source in read_cells(path):
        match = re.search(r"^_check_(\w+)\(\)\s*$", source, flags=re.M)
        if match:
            cell_part[number] = match.group(1)
    cells = results["extra_data"]["load"]["cells"]
    unparsed = any(c["type"] == "SyntaxError" for c in cells)
    return {
        cell_part[c["cell"]] for c in cells if c["cell"] in cell_part and not (unparsed and c["type"] == "NameError")
    }


def test_the_table():
    assert len({m.id for m in MISTAKES}) == len(MISTAKES) >= 30
    parts = set(load_rubric().parts)
    for mistake in MISTAKES:
        assert set(mistake.fails) <= parts and set(mistake.says) <= set(mistake.fails), mistake.id
        assert all(mistake.says.values()), mistake.id


def test_every_common_mistake_is_named():
    """Each of the five mistakes the notebook warns about is named in the feedback of a submission making it."""
    said = " ".join(
        " ".join((words,) if isinstance(words, str) else words)
        for mistake in MISTAKES
        for words in mistake.says.values()
    )
    assert [name for name in COMMON_MISTAKES if name not in said] == []
    notebook = REFERENCE.read_text().lower()
    for name in COMMON_MISTAKES:  # the notebook's "Common mistakes" uses the same names as its headings
        assert f"**{name.removeprefix('common mistake: ')}.**" in notebook, name


@pytest.mark.timeout(1800)  # the first case grades every submission (the session fixture)
@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.id for m in MISTAKES])
def test_wrong_submission_loses_exactly_its_points(mistake, graded, reference_results):
    results, outcome, path = graded[mistake.id]
    assert outcome.ok, outcome.problem
    assert results["extra_data"]["status"] == "graded", results["extra_data"]["reason"]
    full = part_scores(reference_results)
    assert all(score == maximum for score, maximum in full.values()), f"the reference lost points: {full}"
    if not grades_speed(mistake):
        full.pop("speed")
        mistake = dataclasses.replace(mistake, fails={p: f for p, f in mistake.fails.items() if p != "speed"})
    scores = part_scores(results)
    assert set(scores) == set(full), f"{mistake.id}: parts {sorted(scores)}, expected {sorted(full)}"
    rubric = load_rubric()

    for part, (score, maximum) in scores.items():
        tests = [t for t in results["tests"] if t["tags"][0] == part]
        failed = {function_of(t) for t in tests if t["status"] == "failed"}
        expected = {name.rstrip("~") for name in mistake.fails.get(part, ())}
        detail = f"{mistake.id}: part {part} scored {score}/{maximum}; failed: " + "; ".join(
            f"{t['name']}: {t['output'][:300]}" for t in tests if t["status"] == "failed"
        )
        assert maximum == full[part][1], detail
        assert failed == expected, detail
        # the points lost are the rubric's shares of the failed checks (in whole hundredths of a point, by the
        # largest remainder: within a hundredth of the exact share): all of a share when every case fails
        weights = {t["tags"][1]: rubric.weight(t["tags"][1]) for t in tests}
        for name in mistake.fails.get(part, ()):
            cases = [t for t in tests if function_of(t) == name.rstrip("~")]
            lost = sum(t["max_score"] - t["score"] for t in cases)
            share = rubric.part_points(part) * weights[cases[0]["tags"][1]] / sum(weights.values())
            if name.endswith("~"):
                assert 0 < lost < share - 1e-6, f"{detail}\n{name}: lost {lost} of {share}, expected some cases only"
            else:
                assert lost == pytest.approx(share, abs=0.01), f"{detail}\n{name}: lost {lost} of {share}"
        assert score == pytest.approx(maximum - sum(t["max_score"] - t["score"] for t in tests), abs=0.01)

    said = diagnoses(results)
    assert len(said) == mistake.diagnoses, f"{mistake.id}: {len(said)} distinct diagnoses:\n" + "\n".join(
        f"{part}: {text}" for part, text in sorted(said)
    )
    for test in failures(results):  # a check that rests on a wrong answer is not credited, and says why
        if PROPERTY_OF_WRONG_ANSWER in test["output"]:  # a wrong answer earns nothing for its side properties
            assert "not-credited" in test["tags"] and test["output"].startswith("not credited"), test
            cases = (test.get("extra_data") or {}).get("cases") or [""]
            not_passed = len((test.get("extra_data") or {}).get("failed_cases") or [""])
            assert test["max_score"] - test["score"] >= test["max_score"] * not_passed / len(cases) - 0.01, test
    # One mistake, one part: a check that cannot be judged for a mistake of another part is not charged (it
    # earns its points), says that it waits, and only where the table says so
    waiting = [t for t in results["tests"] if "not-charged" in t["tags"]]
    for test in waiting:
        assert test["status"] == "passed" and test["score"] == test["max_score"], test
        assert test["output"].startswith("waiting") and "not credited" not in test["output"], test
    assert {t["tags"][0] for t in waiting} == set(mistake.waits), (
        f"{mistake.id}: rows waiting in {sorted({t['tags'][0] for t in waiting})}, expected {sorted(mistake.waits)}"
    )
    for part, words in mistake.waits.items():
        assert scores[part][0] == scores[part][1], f"{mistake.id}: part {part} waits, and lost points: {scores[part]}"
        said = "\n---\n".join(t["output"] for t in waiting if t["tags"][0] == part)
        assert words.lower() in said.lower(), f"{mistake.id}: no row of part {part} that waits says {words!r}:\n{said}"
    for test in failures(results):  # a mistake named in words is recorded too, in the same words (the class report)
        said_elsewhere = "the same as under" in test["output"]
        if "not-credited" not in test["tags"] and "Likely mistake: " in test["output"] and not said_elsewhere:
            recorded = (test.get("extra_data") or {}).get("mistake", "")
            assert recorded and recorded in test["output"], f"{mistake.id}: {recorded!r} for:\n{test['output']}"

    for part, says in mistake.says.items():
        says = (says,) if isinstance(says, str) else says
        outputs = "\n---\n".join(t["output"] for t in failures(results, part))
        for words in says:
            assert words.lower() in outputs.lower(), (
                f"{mistake.id}: no failure of part {part} says {words!r}:\n{outputs[:3000]}"
            )
        first = failures(results, part)[0]["output"]
        assert says[0].lower() in first.lower(), (
            f"{mistake.id}: the first failure of {part}, the one the summary shows, does not say {says[0]!r}:\n{first}"
        )

    # Each mistake once, in its own part: the errors raised while loading fold under the part that made them,
    # so that the feedback page shows at most one load-time box per mistake (the untouched parts' stubs aside).
    run = GradingRun.from_gradescope(results)
    folded = {part for part in run.load.cell_parts.values() if part not in run.not_done()}
    assert len(run.load.loose_lines()) + len(folded) <= max(1, mistake.diagnoses), (
        f"{mistake.id}: load-time boxes {run.load.loose_lines()} and in parts {sorted(folded)}"
    )

    # The notebook's self-checks and the grader agree: a part loses points only for a requirement that a
    # visible check or the self-check also enforces, and a self-check fails only where points are lost.
    self_checks = self_checks_that_failed(path, results)
    losing = {part for part, (score, maximum) in scores.items() if score < maximum}
    for part in losing:
        visible = [t for t in failures(results, part) if t["visibility"] == "visible"]
        # (a check not credited waits for another part's failure: it adds no requirement of its own)
        hidden_only = [
            t for t in failures(results, part) if t["tags"][1] not in ANSWER_KEY and "not-credited" not in t["tags"]
        ]
        assert visible or part in self_checks or not hidden_only, (
            f"{mistake.id}: part {part} loses points in hidden checks only, and its self-check passes: "
            + "; ".join(t["name"] for t in hidden_only)
        )
    assert self_checks <= losing, (
        f"{mistake.id}: the self-checks of {sorted(self_checks - losing)} fail, and the grader takes nothing there"
    )


LAYOUTS = [
    m
    for m in MISTAKES
    if m.id in ("mha_one_qkv_projection", "mha_raw_parameters", "mha_extra_parameter", "mha_arguments_in_another_order")
]
RAW_ERRORS = ("Error(s) in loading state_dict", "size mismatch", "Missing key", "Unexpected key", "your code raised")


@pytest.mark.parametrize("mistake", LAYOUTS, ids=[m.id for m in LAYOUTS])
def test_a_constructor_the_grader_cannot_load_is_one_diagnosis_in_the_self_checks_words(mistake, graded):
    """A MultiHeadAttention whose weights are laid out otherwise (one qkv projection, raw parameters, an extra
    parameter) or whose arguments come in another order: said once, first (the part's first row), in the
    student's terms (what the grader needs, and why), with no raw torch error anywhere in its feedback; and
    the notebook's self-check says the same words before submission."""
    results, _, path = graded[mistake.id]
    said = [t for t in failures(results) if "not-credited" not in t["tags"]]
    assert [t["tags"][0] for t in said] == ["mha"], [t["name"] for t in said]
    words = said[0]["output"]
    first = next(t for t in results["tests"] if t["tags"][0] == "mha")
    assert first is said[0]
    rule = SIGNATURE_RULE if mistake.id == "mha_arguments_in_another_order" else CONSTRUCTOR_RULE
    assert words.startswith(rule) and "Keep the given constructor as it is" in words
    for test in results["tests"]:
        assert not any(raw in test["output"] for raw in RAW_ERRORS), test
    mha_self_check = next(
        number for number, _line, source in read_cells(path) if re.search(r"^_check_mha\(\)\s*$", source, re.M)
    )
    raised = {c["cell"]: c for c in results["extra_data"]["load"]["cells"]}[mha_self_check]
    assert raised["type"] == "AssertionError" and raised["message"] == words


# -- each part left a stub, alone: that part's own diagnosis, and no other part blamed ----------------------

SOLUTION = re.compile(r"(?P<indent>[ ]*)### BEGIN SOLUTION\n.*?### END SOLUTION\n", re.DOTALL)
# the part of each answer, by the name its solution region defines or belongs to
STUB_PARTS = {
    "HEADS_RUN": "quiz",
    "combine": "combine",
    "forward (wrapper)": "wrapper",
    "make_2d_wrapper": "two_dim",
    "EIGHT_COLUMNS_FOUR_HEADS": "columns",
    "head_column_ranges": "columns",
    "OUTPUT_SHAPE_STEP": "quiz",
    "split_columns": "columns",
    "forward (MultiHeadAttention)": "mha",
    "fuse_heads": "fuse",
}
# what else a part's checks may name, because the part itself is built on it
MAY_NAME = {"columns": ("head_column_ranges",)}
OTHER_FUNCTIONS = ("combine", "head_column_ranges", "split_columns", "make_2d_wrapper", "fuse_heads")


def stubbed(root, index: int):
    """reference/mha.py with its index-th solution region left as the release leaves it (a stub)."""
    source = REFERENCE.read_text()
    region = list(SOLUTION.finditer(source))[index]
    indent = region.group("indent")
    path = root / f"stub-{index}" / "mha.py"
    path.parent.mkdir(parents=True)
    path.write_text(
        source[: region.start()]
        + f"{indent}# YOUR CODE HERE\n{indent}raise NotImplementedError()\n"
        + source[region.end() :]
    )
    return path


def test_the_stub_table_covers_every_solution_region():
    assert len(list(SOLUTION.finditer(REFERENCE.read_text()))) == len(STUB_PARTS)


@pytest.fixture(scope="module")
def stubs(tmp_path_factory):
    root = tmp_path_factory.mktemp("stubs")
    parts = [part for part in load_rubric().parts if part != "speed"]
    graders = GradingPool()
    try:
        with pytest.MonkeyPatch.context() as patch, ThreadPoolExecutor(max_workers=2) as pool:
            patch.setenv("OMP_NUM_THREADS", "1")
            paths = [stubbed(root, i) for i in range(len(STUB_PARTS))]
            return list(pool.map(lambda path: graders.grade(path, path.parent, parts=parts)[0], paths))
    finally:
        graders.close()


@pytest.mark.parametrize("index,name", list(enumerate(STUB_PARTS)), ids=list(STUB_PARTS))
def test_a_part_left_a_stub_alone_is_that_parts_own_diagnosis(index, name, stubs):
    """One stub, the rest of the reference right: only that part fails (anything that rests on it is not
    credited and points to it), its failures are its own (a stub "not done yet" where it is a function), and
    no failure names another part's function as the cause."""
    part = STUB_PARTS[name]
    results = stubs[index]
    assert results["extra_data"]["status"] == "graded", results["extra_data"]["reason"]
    failed = [t for t in failures(results) if "not-credited" not in t["tags"]]
    assert failed and {t["tags"][0] for t in failed} == {part}, [(t["name"], t["output"][:200]) for t in failed]
    # graded on what it adds: no other part loses a point for this stub (not even as "not credited")
    losing = {p for p, (score, maximum) in part_scores(results).items() if score < maximum}
    assert losing == {part}, f"{name}: parts {sorted(losing)} lose points"
    if not name.isupper():  # a function left a stub (the quiz's and the literal's answers are values)
        assert COUNTED.sub("", failed[0]["output"]).startswith("not done yet"), failed[0]["output"]
    for test in failures(results):  # every check that meets a stub says it is not written yet, never quotes it
        assert "raised NotImplementedError" not in test["output"], test["output"]
    named = [f for f in OTHER_FUNCTIONS if f not in MAY_NAME.get(part, ()) and f != name]
    for test in failed:
        assert not any(f"your {f}" in test["output"] or f"fix {f}" in test["output"] for f in named), test
