"""`python -m autograder doctor`: what this machine allows, what grading will have here, and whether
its speed part can be trusted.

1. The machine (`sandbox.machine.survey`, the same probe whose summary every results.json carries):
   user namespaces and what refuses them, bubblewrap, a fresh uid, control groups, CUDA.
2. What grading will have: the isolation `auto` chooses (or why it refuses), and the limits, control
   and timing guarantees that follow.
3. A speed self-test through the real grader: the speed part alone (`grade --part speed`), as graded,
   of the reference's own definitions and of a loop over heads with the right values, a few times
   each in one grading process. The speed part can be trusted here when the reference earns its
   points every time and the loop never does.
4. Other copies of the reference any user could read (beside the checkout, in home folders, in the temporary
   folders: `exposure.readable_copies`), which a worker's fresh uid could read under process isolation.
5. The one change that would improve grading here most, with its command.

Exit status: 0 when grading works here and its speed part can be trusted; 1 when the speed
self-test found it cannot be; 2 when grading would refuse here (no isolation) or could not run.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autograder.model import GradingRun, add_points, points_text
from autograder.sandbox import exposure
from autograder.sandbox.protocol import PingRequest, clean_text

if TYPE_CHECKING:
    from autograder.sandbox.machine import Machine

# A loop over heads with the right values: the projections once, then each head's attention on its own.
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
EXIT_OK, EXIT_SPEED_UNTRUSTED, EXIT_CANNOT_GRADE = 0, 1, 2


@dataclass
class SpeedRun:
    submission: str  # "reference" or "loop over heads"
    score: float
    max_score: float
    relative: float | None  # the submission's speedup as a fraction of the reference's, when measured
    said: str  # the check's message, or why the grading could not run
    graded: bool


def speed_self_test(device: str, isolation: str, gradings: int) -> list[SpeedRun]:
    """The speed part alone, graded `gradings` times each for the reference's definitions and a loop over
    heads, in this process (its timing workers kept from one grading to the next, as grade-class does)."""
    from autograder.grading import timing
    from autograder.grading.grade import Options, grade_submission
    from autograder.grading.workers import reference_cells

    definitions = "".join(f"# %%\n{source.strip()}\n\n" for _n, _line, source in reference_cells())
    sources = {"reference": definitions, "loop over heads": definitions + f"# %%\n{LOOP_OVER_HEADS.strip()}\n"}
    runs = []
    with tempfile.TemporaryDirectory(prefix="mha-doctor-") as folder, timing.KeptWorkers() as kept:
        for number in range(gradings):
            for name, source in sources.items():
                path = Path(folder, f"{number}-{name.replace(' ', '-')}", "mha.py")
                path.parent.mkdir()
                path.write_text(source)
                options = Options(
                    device=device,
                    out=None,
                    quiet=True,
                    isolation=isolation,
                    parts=("speed",),
                    kept_workers=kept,
                )
                run = grade_submission(path, options)
                runs.append(_speed_run(name, run))
    return runs


def worker_start(device: str, isolation: str) -> tuple[bool, str]:
    """Whether a worker here is forked from the grading process's fork server (or started fresh, and why), as
    grading starts one: with the rubric's settings, a ping through it."""
    from autograder.grading.workers import worker_config
    from autograder.rubric import load_rubric
    from autograder.sandbox.client import Worker, WorkerError

    config = worker_config(load_rubric(), device, [], isolation)
    if config.forks_per_server == 0:
        return False, "started fresh: the rubric's forks_per_server is 0"
    started = time.monotonic()
    try:
        worker = Worker([], "mha.py", config)
    except WorkerError as exc:
        return False, f"no worker can start here: {exc}"
    try:
        worker.request(PingRequest())
        forked = worker.process is not None and worker.process.forked
    except WorkerError as exc:
        return False, f"no worker could start here: {exc}"
    finally:
        worker.close()
    if forked:
        return True, (
            "forked from the grading process's fork server, each re-establishing a fresh worker's isolation "
            f"(the first, with the fork server's start: {time.monotonic() - started:.1f} s)"
        )
    return False, f"started fresh, each a new Python and torch: {worker.fresh_because}"


def _speed_run(name: str, run: GradingRun) -> SpeedRun:
    if not run.graded:
        return SpeedRun(name, 0.0, 0.0, None, run.reason, False)
    score = add_points(c.score for c in run.checks)
    top = add_points(c.max_score for c in run.checks)
    failed = next((c.message for c in run.checks if c.status != "passed"), "")
    relative = run.speed.relative if run.speed is not None else None
    return SpeedRun(name, score, top, relative, failed, True)


def speed_verdict(runs: list[SpeedRun]) -> tuple[bool, str]:
    """Whether the speed part can be trusted here, and why."""
    if any(not r.graded for r in runs):
        reason = next(r.said for r in runs if not r.graded)
        return False, f"the speed part could not be graded here: {reason}"
    reference = [r for r in runs if r.submission == "reference"]
    loop = [r for r in runs if r.submission != "reference"]
    missed = [r for r in reference if r.score < r.max_score]
    earned = [r for r in loop if r.score > 0]
    if not missed and not earned:
        return True, "the reference earned every speed point in every grading, the loop over heads none"
    parts = []
    if missed:
        parts.append(f"the reference lost speed points in {len(missed)} of {len(reference)} gradings")
    if earned:
        parts.append(f"the loop over heads earned speed points in {len(earned)} of {len(loop)}")
    return False, "; ".join(parts)


# -- the report ----------------------------------------------------------------------------------


def _section(title: str, rows: list[tuple[str, str]]) -> str:
    width = max(len(key) for key, _ in rows)
    lines = [title]
    for key, value in rows:
        wrapped = textwrap.wrap(value, 100 - width - 4) or [""]
        lines.append(f"  {key:<{width}}  {wrapped[0]}")
        lines += [f"  {'':<{width}}  {more}" for more in wrapped[1:]]
    return "\n".join(lines)


def machine_report(machine: Machine) -> str:
    summary = machine.summary()
    allows = _section(
        "What this machine allows",
        [
            ("user", f"{machine.user}; Python {machine.python}"),
            ("user namespaces", summary["user_namespaces"]),
            ("bubblewrap", summary["bubblewrap"]),
            ("fresh uid", summary["fresh_uid"]),
            ("control groups", summary["control_groups"]),
            ("CUDA", summary["cuda"]),
        ],
    )
    grading = _section(
        "What grading will have here",
        [("chosen isolation", machine.isolation or f"none, `auto` refuses: {machine.refusal}")]
        + list(machine.guarantees.items()),
    )
    return f"{allows}\n\n{grading}"


def _sentences(text: str, limit: int) -> str:
    """The whole sentences of `text` that fit in `limit` characters (at least the first, cut)."""
    kept = ""
    for sentence in text.split(". "):
        longer = f"{kept}. {sentence}" if kept else sentence
        if kept and len(longer) > limit:
            return kept.rstrip(".") + "."
        kept = longer
    return kept if len(kept) <= limit else kept[: limit - 3] + "..."


def speed_report(runs: list[SpeedRun], trusted: bool, why: str, seconds: float) -> str:
    rows = []
    for name in dict.fromkeys(r.submission for r in runs):
        mine = [r for r in runs if r.submission == name]
        measured = [r.relative for r in mine if r.relative is not None]
        unmeasured = next((r.said for r in mine if r.relative is None), "")
        figures = (
            f"relative {statistics.median(measured):.2f} (median of {len(measured)}; "
            f"{min(measured):.2f} to {max(measured):.2f})"
            if measured
            else "not measured: " + _sentences(unmeasured.splitlines()[0].split(": ", 2)[-1], 200)
            if unmeasured
            else "not measured"
        )
        points = ", ".join(f"{points_text(r.score)}/{points_text(r.max_score)}" for r in mine)
        rows.append((name, f"{figures.rstrip('.')}; points {points}"))
    rows.append(("verdict", ("can be trusted: " if trusted else "CANNOT be trusted: ") + why))
    return _section(f"Speed self-test (the speed part as graded, {seconds:.0f} s)", rows)


def copies_report(copies: list[str]) -> str:
    """The other copies of the reference that any user could read, and the command that closes them."""
    rows = [("copy", path) for path in copies]
    rows.append(
        ("why", "a worker's fresh uid under process isolation, or any other user here, could read the solution")
    )
    rows.append(("do", "chmod -R o-rwx " + " ".join(shlex.quote(path) for path in copies)))
    return _section("WARNING: other copies of the reference any user can read", rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder doctor", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--isolation",
        choices=("auto", "namespace", "process"),
        default=None,
        help="the isolation the speed self-test grades with (default: what grading would use here)",
    )
    parser.add_argument(
        "--gradings", type=int, default=2, help="speed self-test: gradings of each submission (default 2)"
    )
    parser.add_argument("--no-speed", action="store_true", help="skip the speed self-test (a few seconds in all)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")


def say(text: str) -> None:
    """Print `text` cleaned (`protocol.clean_text`): it quotes what the grading said, and what the machine's
    tools said, which no one here chose."""
    print(clean_text(text, len(text)), flush=True)


def run(args: argparse.Namespace) -> int:
    import os

    from autograder.sandbox.machine import survey

    machine = survey()
    isolation = args.isolation or os.environ.get("AUTOGRADER_ISOLATION", "auto")
    findings: dict[str, Any] = {"machine": machine.to_dict()}
    if not args.json:
        say(machine_report(machine))
    copies = exposure.readable_copies(exposure.places_for_copies())
    findings["reference_copies"] = copies
    if copies and not args.json:
        say("\n" + copies_report(copies))
    status = EXIT_OK if machine.isolation else EXIT_CANNOT_GRADE
    can_grade = machine.isolation is not None or isolation != "auto"
    device = "cuda" if args.device == "auto" and machine.cuda.available else args.device
    device = "cpu" if device == "auto" else device
    if can_grade:
        forked, said = worker_start(device, isolation)
        findings["workers"] = {"forked": forked, "said": said}
        if not args.json:
            print("\n" + _section("How workers start here", [("workers", said)]), flush=True)
    if args.no_speed or not can_grade:
        if not args.json and not can_grade:
            say("\nSpeed self-test: not run (grading refuses here without --isolation process)")
    else:
        started = time.monotonic()
        runs = speed_self_test(device, isolation, max(1, args.gradings))
        trusted, why = speed_verdict(runs)
        findings["speed"] = {"trusted": trusted, "why": why, "runs": [r.__dict__ for r in runs]}
        if not args.json:
            say("\n" + speed_report(runs, trusted, why, time.monotonic() - started))
        if not trusted:
            status = max(status, EXIT_SPEED_UNTRUSTED)
        if not trusted and not machine.advice:
            machine.advice = "grade on a quieter machine, or one with writable control groups"
    if copies and not machine.advice and "process" in (machine.isolation, isolation):
        machine.advice = "close the other copies of the reference: chmod -R o-rwx " + " ".join(map(shlex.quote, copies))
    findings["advice"] = machine.advice
    if args.json:
        say(json.dumps(findings, indent=2))
    else:
        title = "The one change that would improve grading here"
        say("\n" + (_section(title, [("do", machine.advice)]) if machine.advice else f"{title}: none"))
    return status


if __name__ == "__main__":
    sys.exit(main())
