"""Submissions for the speed part's verdicts: the reference's definitions with one change each."""

from __future__ import annotations

from autograder.grading.timing import reference_cells


def definitions() -> str:
    """The reference's code cells that only define (no demonstrations, no self-checks): what the grader's
    reference timing worker loads."""
    return "".join(f"# %%\n{source.strip()}\n\n" for _number, _line, source in reference_cells())


def with_cell(code: str) -> str:
    return definitions() + f"# %%\n{code.strip()}\n"


# Heads one at a time inside the weight split: the projections once, then scores, mask, softmax and the
# weighted sum per head (the sample class's brook).
LOOP_OVER_HEADS = """
def _forward(self, x):
    b, num_tokens, _ = x.shape
    split = lambda t: t.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
    keys, queries, values = split(self.W_key(x)), split(self.W_query(x)), split(self.W_value(x))
    heads = []
    for h in range(self.num_heads):
        scores = queries[:, h] @ keys[:, h].transpose(1, 2)
        scores = scores.masked_fill(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        weights = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))
        heads.append(weights @ values[:, h])
    return self.out_proj(torch.cat(heads, dim=-1))

MultiHeadAttention.forward = _forward
"""

# The tightest loop: everything batched but the two attention matmuls, one head at a time.
LOOP_OVER_HEADS_MATMULS_ONLY = """
def _forward(self, x):
    b, num_tokens, _ = x.shape
    split = lambda t: t.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)
    keys, queries, values = split(self.W_key(x)), split(self.W_query(x)), split(self.W_value(x))
    scores = torch.stack([queries[:, h] @ keys[:, h].transpose(1, 2) for h in range(self.num_heads)], dim=1)
    scores = scores.masked_fill(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
    weights = self.dropout(torch.softmax(scores / self.head_dim ** 0.5, dim=-1))
    context = torch.stack([weights[:, h] @ values[:, h] for h in range(self.num_heads)], dim=2)
    return self.out_proj(context.reshape(b, num_tokens, self.d_out))

MultiHeadAttention.forward = _forward
"""

SLEEPS = """
import time

_honest = MultiHeadAttention.forward

def _forward(self, x):
    time.sleep(0.05)
    return _honest(self, x)

MultiHeadAttention.forward = _forward
"""

# Burns the CPU from import on, in two threads (hashlib lets go of the GIL) and two processes, hoping to
# slow the reference down while it is timed.
BURNERS = """
import hashlib
import subprocess
import sys
import threading

def _burn():
    data = bytes(1 << 20)
    while True:
        hashlib.sha256(data).digest()

for _ in range(2):
    threading.Thread(target=_burn, daemon=True).start()
    subprocess.Popen([sys.executable, "-c", "while True: pass"])
"""

CACHED_BY_SHAPE = """
_honest = MultiHeadAttention.forward

def _forward(self, x):
    answers = self.__dict__.setdefault("_answers", {})
    key = (tuple(x.shape), x.dtype, self.training)
    if key not in answers:
        answers[key] = _honest(self, x)
    return answers[key]

MultiHeadAttention.forward = _forward
"""

# Keyed by the input's identity and storage address: new inputs that reuse an old one's memory get its answer.
CACHED_BY_IDENTITY = """
_honest = MultiHeadAttention.forward

def _forward(self, x):
    answers = self.__dict__.setdefault("_answers", {})
    key = (id(x), x.data_ptr(), tuple(x.shape))
    if key not in answers:
        answers[key] = _honest(self, x)
    return answers[key]

MultiHeadAttention.forward = _forward
"""

VARIANTS = {
    "reference": definitions,
    "loop_over_heads": lambda: with_cell(LOOP_OVER_HEADS),
    "loop_over_heads_matmuls_only": lambda: with_cell(LOOP_OVER_HEADS_MATMULS_ONLY),
    "sleeps_50ms": lambda: with_cell(SLEEPS),
    "burners_at_import": lambda: with_cell(BURNERS),
    "cached_by_shape": lambda: with_cell(CACHED_BY_SHAPE),
    "cached_by_identity": lambda: with_cell(CACHED_BY_IDENTITY),
}
