"""Realistic wrong submissions, graded end to end: each must lose exactly the points it deserves, with a diagnosis.

Every submission is the reference solution with one snippet replaced, the way a student would get one step
wrong. For each one the table says which parts must lose points ("some": less than full marks; "all":
exactly 0), which part's failure output must name the mistake, and with what words. Every part not listed
must keep full marks: a mistake in one step is not charged twice, except where one step calls another
(the wrapper calls combine, make_2d_wrapper builds a wrapper, fuse_heads runs the student's
MultiHeadAttention and head_column_ranges).

All submissions are graded once per session, two at a time.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from helpers import failures, grade, mutated_reference, part_scores

pytestmark = pytest.mark.slow  # every test grades whole submissions

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
MAKE_2D = "    return MultiHeadAttentionWrapper(d_in, 1, context_length, dropout, num_heads=2, qkv_bias=qkv_bias)\n"


@dataclass(frozen=True)
class Mistake:
    id: str
    old: str  # a snippet of reference/mha.py (it must occur exactly once) ...
    new: str  # ... and what the student wrote instead
    lost: dict[str, str]  # part -> "some" (0 < score < max) or "all" (score 0); every other part keeps full marks
    part: str  # the part whose failure output must name the mistake
    says: str | tuple[str, ...]  # ... with these words (each of them, case-insensitive)
    only: tuple[str, ...] = ()  # when given: substrings of the names of the only tests that may fail
    more: tuple[tuple[str, str], ...] = ()  # further (old, new) replacements in the same submission


MISTAKES = [
    # --- quiz
    Mistake("quiz_both_wrong", 'HEADS_RUN = "B"\n', 'HEADS_RUN = "A"\n', {"quiz": "all"}, "quiz",
            ("HEADS_RUN = 'A' is not right", "OUTPUT_SHAPE_STEP = 'A' is not right"),
            more=(('OUTPUT_SHAPE_STEP = "C"\n', 'OUTPUT_SHAPE_STEP = "A"\n'),)),
    # --- combine (the wrapper calls combine, make_2d_wrapper builds a wrapper: both lose points with it)
    Mistake("combine_batch_dim", "return torch.cat(outputs, dim=-1)", "return torch.cat(outputs, dim=0)",
            {"combine": "some", "wrapper": "some", "two_dim": "some"}, "combine",
            "Likely mistake: concatenated along the batch dimension"),
    Mistake("combine_reversed", "return torch.cat(outputs, dim=-1)", "return torch.cat(outputs[::-1], dim=-1)",
            {"combine": "some", "wrapper": "some", "two_dim": "some"}, "combine",
            "Likely mistake: heads in the wrong order (reversed)"),
    Mistake("combine_summed", "return torch.cat(outputs, dim=-1)", "return sum(outputs)",
            {"combine": "some", "wrapper": "some", "two_dim": "some"}, "combine",
            "Likely mistake: heads summed instead of concatenated"),
    # --- wrapper
    Mistake("wrapper_heads_reversed", "outputs = [head(x) for head in self.heads]",
            "outputs = [head(x) for head in reversed(self.heads)]",
            {"wrapper": "some", "two_dim": "some"}, "wrapper",
            ("the heads ran in the order [3, 2, 1, 0]",
             "Likely mistake: the heads' outputs are combined in the wrong order")),
    # --- two_dim
    Mistake("two_dim_one_head_of_width_two", MAKE_2D,
            "    return MultiHeadAttentionWrapper(d_in, 2, context_length, dropout, num_heads=1, qkv_bias=qkv_bias)\n",
            {"two_dim": "all"}, "two_dim", "the exercise keeps num_heads=2"),
    Mistake("two_dim_head_changed", MAKE_2D,
            "    wrapper = MultiHeadAttentionWrapper(d_in, 2, context_length, dropout, num_heads=2, "
            "qkv_bias=qkv_bias)\n"
            "    for head in wrapper.heads:  # narrow each head's values to one column\n"
            "        head.W_value = nn.Linear(d_in, 1, bias=qkv_bias)\n"
            "    return wrapper\n",
            {"two_dim": "all"}, "two_dim", "head internals changed"),
    # --- columns (fuse_heads places weights with head_column_ranges)
    Mistake("columns_literal_inclusive", "EIGHT_COLUMNS_FOUR_HEADS = [(0, 2), (2, 4), (4, 6), (6, 8)]",
            "EIGHT_COLUMNS_FOUR_HEADS = [(0, 1), (2, 3), (4, 5), (6, 7)]", {"columns": "some"}, "columns",
            "Likely mistake: inclusive ranges"),
    Mistake("columns_function_inclusive", "return [(h * width, (h + 1) * width) for h in range(num_heads)]",
            "return [(h * width, (h + 1) * width - 1) for h in range(num_heads)]",
            {"columns": "some", "fuse": "all"}, "columns", "Likely mistake: inclusive ranges"),
    Mistake("split_rows", "return [W[:, start:stop] for start, stop in head_column_ranges(W.shape[1], num_heads)]",
            "return [W[start:stop] for start, stop in head_column_ranges(W.shape[0], num_heads)]",
            {"columns": "some"}, "columns", "Likely mistake: rows instead of columns"),
    # --- mha (fuse_heads' own forward is the student's MultiHeadAttention.forward)
    Mistake("mha_scale_d_out", MHA_SCALE,
            "        attn_weights = torch.softmax(attn_scores / self.d_out ** 0.5, dim=-1)\n",
            {"mha": "some", "fuse": "some"}, "mha", "Likely mistake: scores scaled by sqrt(d_out)"),
    Mistake("mha_no_mask",
            "        attn_scores = attn_scores.masked_fill(\n"
            "            self.mask.bool()[:num_tokens, :num_tokens], -torch.inf\n"
            "        )\n"
            "        # Scale by sqrt(head_dim)",
            "        # Scale by sqrt(head_dim)",
            {"mha": "some", "fuse": "some"}, "mha", "Likely mistake: no causal mask"),
    Mistake("mha_missing_transpose", "context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, H, hd)",
            "context_vec = attn_weights @ values  # (b, H, T, hd)",
            {"mha": "some", "fuse": "some"}, "mha", "Likely mistake: missing transpose"),
    Mistake("mha_split_without_transpose", MHA_SPLIT,
            "        keys = keys.view(b, self.num_heads, num_tokens, self.head_dim)  # (b, H, T, hd)\n"
            "        queries = queries.view(b, self.num_heads, num_tokens, self.head_dim)\n"
            "        values = values.view(b, self.num_heads, num_tokens, self.head_dim)\n",
            {"mha": "some", "fuse": "some"}, "mha", "Likely mistake: heads split by reshaping straight to"),
    Mistake("mha_no_out_proj", "return self.out_proj(context_vec)  # (b, T, d_out)", "return context_vec",
            {"mha": "some"}, "mha", "Likely mistake: missing output projection"),
    Mistake("mha_loop_over_heads", MHA_ATTENTION,
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
            {"mha": "some"}, "mha", "a loop over heads", only=("as many matrix multiplies for 12 heads as for 2",)),
    Mistake("mha_sdpa", MHA_ATTENTION,
            "        context_vec = torch.nn.functional.scaled_dot_product_attention(\n"
            "            queries, keys, values, dropout_p=self.dropout.p if self.training else 0.0, is_causal=True\n"
            "        ).transpose(1, 2)  # (b, T, H, hd)\n",
            {"mha": "some"}, "mha", "the forward calls scaled_dot_product_attention",
            only=("writes the attention itself",)),
    Mistake("mha_dropout_on_context",
            "        attn_weights = self.dropout(attn_weights)\n\n"
            "        # Back to (b, T, H, hd) before merging, so each token's heads sit side by side.\n"
            "        context_vec = (attn_weights @ values).transpose(1, 2)  # (b, T, H, hd)\n",
            "        context_vec = self.dropout(attn_weights @ values).transpose(1, 2)  # (b, T, H, hd)\n",
            {"mha": "some"}, "mha", "Likely mistake: dropout applied to the context vectors",
            only=("dropout acts on the attention weights",)),
    Mistake("mha_modifies_input",
            "        # One matrix multiply per projection computes every head's queries, keys and values.\n",
            "        x /= self.head_dim ** 0.25  # pre-scale, so queries @ keys is already scaled\n",
            {"mha": "some", "fuse": "some"}, "mha", "the forward modified its input x in place"),
    Mistake("mha_forces_float32", "return self.out_proj(context_vec)  # (b, T, d_out)",
            "return self.out_proj(context_vec).to(torch.float32)",
            {"mha": "some", "fuse": "some"}, "mha", "keep the input's dtype"),
    # --- fuse
    Mistake("fuse_out_proj_left_random",
            "        fused.out_proj.weight.copy_(torch.eye(fused.d_out))\n        fused.out_proj.bias.zero_()\n", "",
            {"fuse": "some"}, "fuse", "Likely mistake: out_proj is not the identity"),
    Mistake("fuse_heads_reversed", "zip(head_column_ranges(fused.d_out, num_heads), heads)",
            "zip(head_column_ranges(fused.d_out, num_heads), heads[::-1])",
            {"fuse": "some"}, "fuse", "Likely mistake: heads placed in reverse order"),
]


def build(root, mistake: Mistake):
    path = mutated_reference(root, mistake.id, mistake.old, mistake.new)
    source = path.read_text()
    for old, new in mistake.more:
        assert source.count(old) == 1, f"{mistake.id}: {old!r} occurs {source.count(old)} times"
        source = source.replace(old, new)
    path.write_text(source)
    return path


@pytest.fixture(scope="session")
def graded(tmp_path_factory) -> dict[str, tuple[dict, object]]:
    """{mistake id: (results.json, the grading run)} for every wrong submission, each graded once, two at a
    time. Each grading gets one intra-op thread: two gradings share two cores, and torch's spinning OpenMP
    threads would otherwise compete for them (the scores do not depend on it)."""
    root = tmp_path_factory.mktemp("wrong")

    def run(mistake: Mistake):
        path = build(root, mistake)
        return mistake.id, grade(path, path.parent)

    with pytest.MonkeyPatch.context() as patch, ThreadPoolExecutor(max_workers=2) as pool:
        patch.setenv("OMP_NUM_THREADS", "1")
        return dict(pool.map(run, MISTAKES))


def test_the_table():
    assert len({m.id for m in MISTAKES}) == len(MISTAKES) >= 18
    for mistake in MISTAKES:
        assert mistake.part in mistake.lost, mistake.id
        assert set(mistake.lost.values()) <= {"some", "all"}, mistake.id


@pytest.mark.timeout(900)  # the first case grades every submission (the session fixture)
@pytest.mark.parametrize("mistake", MISTAKES, ids=[m.id for m in MISTAKES])
def test_wrong_submission_loses_exactly_its_points(mistake, graded, reference_results):
    results, run = graded[mistake.id]
    assert run.returncode == 0, run.stderr
    full = part_scores(reference_results)
    assert all(score == maximum for score, maximum in full.values()), f"the reference lost points: {full}"
    scores = part_scores(results)
    assert set(scores) == set(full), f"{mistake.id}: parts {sorted(scores)}, expected {sorted(full)}"

    for part, (score, maximum) in scores.items():
        outcome = mistake.lost.get(part)
        detail = (f"{mistake.id}: part {part} scored {score}/{maximum}, expected "
                  f"{ {None: 'full marks', 'all': '0', 'some': 'some points lost, not all'}[outcome]}; failed: "
                  + "; ".join(t["name"] for t in failures(results, part)))
        assert maximum == full[part][1], detail
        if outcome is None:
            assert score == maximum, detail
        elif outcome == "all":
            assert score == 0, detail
        else:
            assert 0 < score < maximum, detail

    outputs = "\n---\n".join(t["output"] for t in failures(results, mistake.part))
    for words in (mistake.says,) if isinstance(mistake.says, str) else mistake.says:
        assert words.lower() in outputs.lower(), (
            f"{mistake.id}: no failure of part {mistake.part} says {words!r}:\n{outputs[:3000]}")
    if mistake.only:
        others = [t["name"] for t in failures(results) if not any(name in t["name"] for name in mistake.only)]
        assert not others, f"{mistake.id}: only tests named like {mistake.only} may fail; these failed too: {others}"
