"""A disputed grade, explained: a failed check's hidden inputs, expected and actual values, from its seed.

    python -m autograder explain RESULTS.json [--check KEY] [--submission FILE] [--device cpu|cuda]

A grading run records its hidden seed in results.json (`extra_data.seed`), and each check draws its inputs
from a generator seeded by (that seed, the check's id) alone. So grading only the failed checks again, with
that seed, on the same file, with the same grader, gives the same inputs and the same outcome; while they
run, the harness notes what it sent to the submission (`note`: the tensors a forward was given, the
arguments of a call) and every comparison it made (the expected values, from reference/, and the
submission's). This command prints them, per check and case, and says whether the outcome was reproduced.

KEY is a check's key as results.json tags it (`mha::test_matches_reference`), optionally with one case
(`mha::test_matches_reference[float64-12 heads]`); without --check, every failed check is explained (those
not scored rest on another and are skipped). The submission is found beside a class's record
(`results/<student>/mha/` -> `submitted/<student>/mha/`), else next to RESULTS.json; `--submission` names it.

The speed part is not reproducible by seed: its inputs are, but its figures are timings, which depend on
the machine and on what else ran on it at that moment; it is explained in words, and regraded with
`grade --part speed`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from autograder.grading import scoring
from autograder.grading.checks import harness
from autograder.model import FAILED, CheckResult, GradingRun
from autograder.sandbox.protocol import clean_text

CASES = re.compile(r" \[[^\]]*\]$")  # a row's "[case]" or "[7 of 9 cases]"
SHOWN = 48  # a tensor with at most this many numbers is printed whole


def check_id(key: str, case: str = "") -> str:
    """'mha::test_x' and a case -> 'test_mha.py::test_x[case]', the node id pytest runs it as."""
    module, function = key.split("::", 1)
    return f"test_{module}.py::{function}" + (f"[{case}]" if case else "")


def submission_of(results: Path, name: str) -> Path | None:
    """The graded file: in a class, `submitted/<student>/mha/<name>` for `results|autograded/<student>/mha/`."""
    folder = results.resolve().parent
    course = folder.parent.parent.parent
    if folder.parent.parent.name in ("results", "autograded"):
        candidate = course / "submitted" / folder.parent.name / folder.name / name
        if candidate.is_file():
            return candidate
    candidate = folder / name
    return candidate if candidate.is_file() else None


def changed_since(results: Path, submission: Path) -> list[str]:
    """What differs from when the run was graded, when the class record says (its inputs.json)."""
    recorded = results.resolve().parent / "inputs.json"
    if not recorded.is_file():
        return []
    from autograder.course.store import PACKAGE_DIR, grader_files, reference_files, sha256_tree, submission_hash

    was = json.loads(recorded.read_text())
    now = {"submission": submission_hash(submission), "grader": sha256_tree(grader_files(), PACKAGE_DIR)}
    reference = reference_files()
    now["reference"] = sha256_tree(reference, reference[0].parent) if reference else "none"
    return [name for name, value in now.items() if was.get(name) not in (None, value)]


def show(tensor: object) -> str:
    if not isinstance(tensor, torch.Tensor):
        return repr(tensor)[:400]
    head = f"{tuple(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"
    values = tensor.detach().cpu().double()
    if values.numel() <= SHOWN:
        return f"{head}\n{_indent(str(values.to(tensor.dtype) if tensor.is_floating_point() else tensor))}"
    first = values.reshape(-1, values.shape[-1])[0] if values.dim() else values
    return (
        f"{head}, mean {values.mean():.4g}, std {values.std():.4g}; its first row:\n"
        f"{_indent(str(first[:12].to(torch.float64)))}"
    )


def _indent(text: str, by: str = "      ") -> str:
    return "\n".join(by + line for line in text.splitlines())


def comparison(expected: object, actual: object) -> str:
    lines = [f"    expected (the reference): {show(expected)}", f"    actual (the submission):  {show(actual)}"]
    if (
        isinstance(expected, torch.Tensor)
        and isinstance(actual, torch.Tensor)
        and expected.shape == actual.shape
        and expected.numel()
    ):
        diff = (actual.detach().cpu().double() - expected.detach().cpu().double()).abs()
        where = tuple(int(i) for i in torch.unravel_index(diff.nan_to_num(float("inf")).argmax(), diff.shape))
        lines.append(
            f"    largest difference {diff.max().item():.4g} at {list(where)}: expected "
            f"{expected[where].item():.6g}, actual {actual[where].item():.6g}"
        )
    return "\n".join(lines)


def explain_speed(run: GradingRun, submission: str) -> str:
    speed = run.speed or {}
    lines = [
        "speed: not reproducible by seed. Its inputs come from the seed, but what is scored is a timing: your",
        "forward's speedup over the wrapper divided by the reference's, in the same run. Both are measured in",
        "interleaved rounds on the machine that graded, so the machine cancels out to first order, but not",
        "what else ran on it, nor its clock speed at that moment: a regrade measures again and may land on",
        "the other side of a band (a figure of 1.04 one time and 0.93 the next is ordinary).",
    ]
    for name, figures in (speed.get("workloads") or {}).items():
        if "relative" in figures:
            spread = figures.get("relative_spread") or {}
            lines.append(
                f"  {name}: {figures['relative']:.3f} (median of {figures.get('rounds')} rounds; middle half "
                f"{spread.get('q1', float('nan')):.3f} to {spread.get('q3', float('nan')):.3f}), "
                f"{figures.get('credit', 0):.0%} of the points"
            )
            interval = figures.get("relative_interval")  # issue 20: the confidence interval, once recorded
            if isinstance(interval, dict):
                lines.append(f"    interval: {interval.get('low'):.3f} to {interval.get('high'):.3f}")
        else:
            lines.append(f"  {name}: not timed: {figures.get('failed', '')}")
    lines.append(f"To measure again: python -m autograder grade {submission} --part speed --seed {run.seed}")
    return "\n".join(lines)


def say(text: object, error: bool = False) -> None:
    """Print `text` cleaned (`protocol.clean_text`): file and folder names are the student's, and the
    results.json explained may be forged (an OSC 52 clipboard write, an OSC 8 link in a check's name)."""
    line = str(text)
    print(clean_text(line, len(line)), file=sys.stderr if error else sys.stdout)


def explain(results_path: Path, keys: list[str] | None, submission: Path | None, device: str | None) -> int:
    from autograder.grading import grade as grading

    try:
        run = GradingRun.from_gradescope(json.loads(Path(results_path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        say(f"{results_path}: not a results.json this grader wrote ({type(exc).__name__}: {exc})", error=True)
        return 2
    if not run.graded or run.seed is None:
        say(f"{results_path}: this run has no scores to explain ({run.reason or 'no seed recorded'})", error=True)
        return 2
    submission = submission or submission_of(Path(results_path), run.submission)
    if submission is None:
        say(f"cannot find {run.submission} for {results_path}: name it with --submission", error=True)
        return 2
    rows = [c for c in run.checks if c.status == FAILED] if not keys else []
    for key in keys or []:
        base, _, case = key.partition("[")
        found = [c for c in run.checks if c.key == base and (not case or case.rstrip("]") in c.cases)]
        if not found:
            say(f"{results_path}: no check {key} (its checks: {', '.join(sorted({c.key for c in run.checks}))})")
            return 2
        rows += [c if not case else _only(c, case.rstrip("]")) for c in found]
    speed_rows = [c for c in rows if c.part == "speed"]
    rows = [c for c in rows if c.part != "speed"]
    say(f"{submission}: seed {run.seed}, graded on {run.device}, torch {run.torch}")
    for what in changed_since(Path(results_path), submission):
        say(f"note: the {what} changed since this run was graded; what follows is today's {what}'s")
    if rows:
        wanted = tuple(dict.fromkeys(f"{c.key}[{case}]" if case else c.key for c in rows for case in c.cases or [""]))
        options = grading.Options(device=device or run.device or "auto", out=None, quiet=True, seed=run.seed)
        again, notes = regrade(submission, replace(options, checks=wanted))
        if not again.graded:
            say(f"cannot grade it again: {again.reason}", error=True)
            return 2
        whole: GradingRun | None = None
        if any(outcome(again, row, case) != row.status for row in rows for case in row.cases or [""]):
            # Alone, a check runs without what ran before it in the grading (the speed part first, which builds
            # the submission's module on its own workload, then the other parts): graded whole again, as it was.
            graded_parts = tuple(dict.fromkeys(c.part for c in run.checks))
            whole, notes = regrade(submission, replace(options, parts=graded_parts))
        changed = changed_since(Path(results_path), submission) + [
            what
            for what, was, now in (
                ("torch version", run.torch, torch.__version__),
                ("device", run.device, options.device),
            )
            if was and now != "auto" and was != now
        ]
        recorded = (Path(results_path).resolve().parent / "inputs.json").is_file()
        for row in rows:
            for case in row.cases or [""]:
                say("")
                verdict = reproduction(row, case, again, whole, changed, recorded)
                say(report(row, case, verdict, [n for n in notes if n["check"] == check_id(row.key, case)]))
    if speed_rows:
        say("")
        try:
            say(explain_speed(run, str(submission)))
        except (TypeError, ValueError, AttributeError) as exc:  # figures of a results.json written elsewhere
            say(f"speed: the figures in {results_path} cannot be read ({type(exc).__name__}: {exc})")
    return 0


def _only(row: CheckResult, case: str) -> CheckResult:
    return replace(row, cases=[case])


def regrade(submission: Path, options: Any) -> tuple[GradingRun, list[dict[str, Any]]]:
    """The submission graded again with `options` (its seed), and what the harness noted while it ran."""
    from autograder.grading import grade as grading

    harness.NOTES = []
    try:
        again = grading.grade_submission(submission, options)
        return again, harness.NOTES
    finally:
        harness.NOTES = None


def found(run: GradingRun, row: CheckResult, case: str) -> CheckResult | None:
    return next((c for c in run.checks if c.key == row.key and (not case or case in c.cases)), None)


def outcome(run: GradingRun, row: CheckResult, case: str) -> str | None:
    """The status of `row`'s check (and case) in `run`; None when it did not run."""
    now = found(run, row, case)
    return None if now is None else now.status


def reproduction(
    row: CheckResult, case: str, alone: GradingRun, whole: GradingRun | None, changed: list[str], recorded: bool
) -> str:
    """The line saying whether the check's outcome was reproduced, and when it was not, why: "not reproduced"
    only when neither the check graded alone nor the whole grading gave what it was graded."""
    now = found(alone, row, case)
    if now is not None and now.status == row.status:
        return f"again:   {now.status}: {_first(now.message)}"
    alone_said = "it did not run" if now is None else f"{now.status} ({_first(now.message)})"
    again = found(whole, row, case) if whole is not None else None
    if again is not None and again.status == row.status:
        return (
            f"again:   {again.status} (reproduced, graded whole as it was: {_first(again.message)}). Graded alone it "
            f"was {alone_said}: alone, it runs without what runs before it in a grading (the speed part first, "
            "which builds your module on its own workload, then the other parts), so your code behaves "
            "differently after those"
        )
    if whole is not None and not whole.graded:
        why = f"and graded whole it could not be graded ({whole.reason})"
    elif changed:
        why = f"the {' and the '.join(changed)} changed since it was graded"
    elif recorded:
        why = (
            "yet the file, the grader and the reference are as they were when it was graded (the class record "
            "says so): its outcome varies between gradings of the same code (a deadline, the machine's load)"
        )
    else:
        why = (
            "and no record beside this results.json says whether the file or the grader changed since it was "
            "graded (a class run's record does): either did, or its outcome varies between gradings"
        )
    whole_said = "" if again is None else f"; graded whole, {again.status}"
    return f"again:   NOT reproduced: graded alone, {alone_said}{whole_said}; {why}"


def report(row: CheckResult, case: str, verdict: str, notes: list[dict[str, Any]]) -> str:
    label = f"{row.part}: {CASES.sub('', row.name)}" + (f" [{case}]" if case else "")
    lines = [label, f"  graded:  {row.status}: {_first(row.message)}", f"  {verdict}"]
    for item in notes:
        if item["kind"] == "input":
            lines.append(f"  input to {item['what']}: {show(item['value'])}")
        elif item["kind"] == "call":
            lines.append(f"  call {item['what']}({', '.join(show(a) for a in item['args'])})")
        elif item["kind"] == "compared":
            lines.append(f"  compared: {item['what']}\n{comparison(item['expected'], item['actual'])}")
    if not notes:
        lines.append("  (no tensor was sent or compared: the message above says what was checked)")
    return "\n".join(lines)


def _first(message: str) -> str:
    lines = [line for line in scoring.COUNTED.sub("", message or "").splitlines() if line.strip()]
    return (lines[0][:300] + (" ..." if len(lines) > 1 else "")) if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder explain", description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a results.json written by the grader")
    parser.add_argument(
        "--check", action="append", default=None, metavar="KEY", help="a check's key[case] (repeatable)"
    )
    parser.add_argument("--submission", type=Path, default=None, help="the graded file (default: found from RESULTS)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: the device it was graded on")
    args = parser.parse_args(argv)
    return explain(args.results, args.check, args.submission, args.device)
