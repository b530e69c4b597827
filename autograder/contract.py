"""The student contract, the grade's parts and the speed part's workloads: defined here once, imported
everywhere else."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# The assignment's id: nbgrader's assignment and notebook name, and the name a submission's file is expected
# to have (mha.ipynb or mha.py). (The self-check, which students run standalone, spells it out itself.)
ASSIGNMENT = "mha"

# Part ids are fixed: instructors, feedback, gradebooks and other tools group by them. This order is
# the order of the notebook, of results.json and of every report.
PART_IDS = ("quiz", "combine", "wrapper", "two_dim", "columns", "mha", "fuse", "speed")


@dataclass(frozen=True)
class Name:
    """A name a submission defines."""

    name: str
    kind: str  # "class", "function" or "answer"
    given: str  # "given" (complete in the release), "constructor given" or "stub"
    summary: str


CONTRACT = (
    Name(
        "CausalAttention",
        "class",
        "given",
        "one head: causal scaled dot-product attention, (b, T, d_in) -> (b, T, d_out)",
    ),
    Name("combine", "function", "stub", "per-head (b, T, d_h) tensors -> (b, T, sum d_h), head 0's columns first"),
    Name(
        "MultiHeadAttentionWrapper",
        "class",
        "constructor given",
        "forward: every head on the same x, one after another in order, then combine",
    ),
    Name("make_2d_wrapper", "function", "stub", "a 2-head wrapper whose context vectors are 2-dimensional"),
    Name("head_column_ranges", "function", "stub", "[(0, w), (w, 2w), ...], one half-open range per head"),
    Name("split_columns", "function", "stub", "the per-head column blocks W[:, start:stop] of a (d_in, d_out) matrix"),
    Name("EIGHT_COLUMNS_FOUR_HEADS", "answer", "stub", "the ranges for 8 columns and 4 heads"),
    Name("HEADS_RUN", "answer", "stub", "question 1, a letter"),
    Name("OUTPUT_SHAPE_STEP", "answer", "stub", "question 2, a letter"),
    Name(
        "MultiHeadAttention",
        "class",
        "constructor given",
        "forward: the weight-split parallel computation, all heads in one batched pass",
    ),
    Name("fuse_heads", "function", "stub", "a MultiHeadAttention whose output equals the wrapper's"),
)
CONTRACT_NAMES = tuple(n.name for n in CONTRACT)

# The part each name of the contract belongs to (the given CausalAttention to none), and the parts each part's
# code calls or builds on: where an error in one comes from, when the code of another raises it.
PART_OF_NAME = {
    "combine": "combine",
    "MultiHeadAttentionWrapper": "wrapper",
    "make_2d_wrapper": "two_dim",
    "head_column_ranges": "columns",
    "split_columns": "columns",
    "EIGHT_COLUMNS_FOUR_HEADS": "columns",
    "HEADS_RUN": "quiz",
    "OUTPUT_SHAPE_STEP": "quiz",
    "MultiHeadAttention": "mha",
    "fuse_heads": "fuse",
}
BUILDS_ON = {
    "wrapper": ("combine",),
    "two_dim": ("wrapper",),
    "fuse": ("columns", "mha", "wrapper"),
    "speed": ("mha", "wrapper"),
}


def with_what_it_builds_on(parts: set[str]) -> set[str]:
    """`parts` and every part they build on, directly or not (`BUILDS_ON`)."""
    found, todo = set(parts), list(parts)
    while todo:
        for below in BUILDS_ON.get(todo.pop(), ()):
            if below not in found:
                found.add(below)
                todo.append(below)
    return found


def means(meaning: str) -> Any:
    """A required field of a rubric table's type (`Workload`, `rubric.Limits`, `rubric.SpeedSettings`), with what
    it sets or bounds: the rubric's documentation of the key."""
    return field(metadata={"meaning": meaning})


@dataclass(frozen=True)
class Workload:
    """One shape of work the speed part times, on one device: a `[[speed.workloads]]` table of the rubric
    (`rubric.py` reads and checks it, each key as its field's `meaning` says), and as results.json records what
    was graded (`model.WorkloadFigures`)."""

    device: str = means("cpu or cuda: the device this workload is timed on")
    name: str = means("what it is, shown in results (unique per device)")
    dtype: str = means("float32, bfloat16, float16 or float64")
    batch: int = means("inputs per forward")
    tokens: int = means("sequence length, which is also the context length")
    d_in: int = means("input features")
    d_out: int = means("output features, a multiple of heads")
    heads: int = means("attention heads")
    calls: int = means("forwards of the reference and of the submission per timed request")
    wrapper_calls: int = means("forwards of the wrapper per timed request (it is many times slower)")
    flush_mib: float = means("CUDA: MiB written before each forward to empty the L2 cache (0 on the CPU)")

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.batch, self.tokens, self.d_in)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> Workload | None:
        """A workload as `to_json` wrote it (every field, in its order, of its type: it writes back the same), else
        None (a file may be forged or older)."""
        names = [f.name for f in fields(cls)]
        if not isinstance(data, dict) or list(data) != names:
            return None
        kinds = {"str": (str,), "int": (int,), "float": (int, float)}
        for f in fields(cls):
            value = data[f.name]
            if isinstance(value, bool) or not isinstance(value, kinds[str(f.type)]):
                return None
        return cls(**data)
