"""Which students one shard of a class grades, so many machines can share a class without talking.

A shard is written `K/N`: shard K of N, with K counted from 0 (0 <= K < N), as Kubernetes counts
its indexed jobs' completions and as `sbatch --array=0-(N-1)` counts array tasks. The students are
sorted by name and dealt round-robin, so the shards are disjoint, cover the class, and differ in
size by at most one student, whatever the names. Every shard computes the same split from the
same `submitted/` folder, so nothing has to be handed out in advance.

`auto` takes the index from the engine running the shard:
- Slurm array task: SLURM_ARRAY_TASK_ID, normalised by SLURM_ARRAY_TASK_MIN and _STEP, so
  `--array=1-4` or `--array=0-6:2` work too; the count is SLURM_ARRAY_TASK_COUNT.
- Kubernetes indexed job: JOB_COMPLETION_INDEX (0-based). Kubernetes does not tell a pod how many
  completions there are, so write `auto/N` (or `$(JOB_COMPLETION_INDEX)/N` in the manifest).
`auto/N` takes the index from the environment and checks it against N.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class ShardError(ValueError):
    """A shard that cannot be used; the message says what was wrong and what to write instead."""


@dataclass(frozen=True)
class Shard:
    index: int  # 0-based
    count: int

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ShardError(f"a class cannot be split into {self.count} shards: the count must be at least 1")
        if not 0 <= self.index < self.count:
            raise ShardError(
                f"shard {self.index}/{self.count} does not exist: shards are numbered from 0 "
                f"to {self.count - 1} (write K/N with 0 <= K < N)"
            )

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def select(self, students: Sequence[str]) -> list[str]:
        """This shard's students: every N-th name of the sorted class, starting at the K-th."""
        return sorted(set(students))[self.index :: self.count]


ENGINE_VARIABLES = ("SLURM_ARRAY_TASK_ID", "JOB_COMPLETION_INDEX")


def parse_shard(text: str, environ: Mapping[str, str] | None = None) -> Shard:
    """`K/N`, `auto` or `auto/N` (see the module's docstring) into a Shard."""
    environ = os.environ if environ is None else environ
    text = text.strip()
    index_text, _, count_text = text.partition("/")
    count = _number(count_text, "N", text) if count_text else None
    if index_text.strip() == "auto":
        return shard_from_environment(environ, count)
    if count is None:
        raise ShardError(f"--shard {text!r}: write K/N (shard K of N, K from 0 to N-1), auto or auto/N")
    return Shard(_number(index_text, "K", text), count)


def shard_from_environment(environ: Mapping[str, str], count: int | None = None) -> Shard:
    """The shard of a Slurm array task or a Kubernetes indexed job (`count` given: checked against it)."""
    if "SLURM_ARRAY_TASK_ID" in environ:
        task = _number(environ["SLURM_ARRAY_TASK_ID"], "SLURM_ARRAY_TASK_ID")
        first = _number(environ.get("SLURM_ARRAY_TASK_MIN", "0"), "SLURM_ARRAY_TASK_MIN")
        step = _number(environ.get("SLURM_ARRAY_TASK_STEP", "1"), "SLURM_ARRAY_TASK_STEP")
        if step < 1 or (task - first) % step:
            raise ShardError(f"Slurm array task {task} is not on the array's grid (min {first}, step {step})")
        index = (task - first) // step
        tasks = environ.get("SLURM_ARRAY_TASK_COUNT")
        slurm_count = _number(tasks, "SLURM_ARRAY_TASK_COUNT") if tasks is not None else None
        if count is not None and slurm_count is not None and count != slurm_count:
            raise ShardError(f"--shard auto/{count}, but this Slurm array has {slurm_count} tasks")
        count = count if count is not None else slurm_count
        if count is None:
            raise ShardError("SLURM_ARRAY_TASK_COUNT is not set: write --shard auto/N with the array's size")
        return Shard(index, count)
    if "JOB_COMPLETION_INDEX" in environ:
        if count is None:
            raise ShardError(
                "a Kubernetes indexed job does not say how many completions it has: "
                "write --shard auto/N, N being the Job's `completions`"
            )
        return Shard(_number(environ["JOB_COMPLETION_INDEX"], "JOB_COMPLETION_INDEX"), count)
    raise ShardError(
        "--shard auto needs SLURM_ARRAY_TASK_ID (a Slurm array task) or JOB_COMPLETION_INDEX "
        "(a Kubernetes indexed job); neither is set, so write the shard as K/N"
    )


def engine_index_in(environ: Mapping[str, str] | None = None) -> str | None:
    """The name of the shard-index variable an array engine set, if any (to warn an unsharded run)."""
    environ = os.environ if environ is None else environ
    return next((name for name in ENGINE_VARIABLES if name in environ), None)


def _number(text: str, what: str, spec: str | None = None) -> int:
    try:
        return int(text.strip())
    except ValueError:
        where = f" in --shard {spec!r}" if spec is not None else ""
        raise ShardError(f"{what}{where} must be a whole number, not {text.strip()!r}") from None
