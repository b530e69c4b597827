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
not credited rest on another and are skipped). The submission is found beside a class's record
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
from pathlib import Path
from typing import Any

import torch

from autograder.grading.checks import harness
from autograder.grading.checks.harness import Raised
from autograder.model import FAILED, PASSED, CheckResult, GradingRun, points_text
from autograder.sandbox.protocol import ModuleInfo

CASES = re.compile(r" \[[^\]]*\]$")  # a row's "[case]" or "[7 of 9 cases]", in records of an earlier grader
FEW = 8  # values of a tensor shown: its first row's first few
ITEMS = 4  # items of a list shown
MESSAGE_CHARS = 1500  # of a case's failure message


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
    from autograder.course.store import PACKAGE_DIR, grader_files, reference_files, sha256_file, sha256_tree

    was = json.loads(recorded.read_text())
    now = {"submission": sha256_file(submission), "grader": sha256_tree(grader_files(), PACKAGE_DIR)}
    reference = reference_files()
    now["reference"] = sha256_tree(reference, reference[0].parent) if reference else "none"
    return [name for name, value in now.items() if was.get(name) not in (None, value)]


def show(value: object, depth: int = 0) -> str:
    """What the grader sent or got, for people: a tensor's shape, dtype and a few of its values; a module
    living in the worker by its class; a list item by item (a few); anything else bounded."""
    if isinstance(value, torch.Tensor):
        head = f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
        if not value.numel():
            return f"{head}, empty"
        numbers = value.detach().cpu().double()
        row = numbers.reshape(-1, numbers.shape[-1])[0] if numbers.dim() else numbers.reshape(1)
        few = ", ".join(f"{v:.4g}" for v in row[:FEW].tolist()) + (", ..." if row.numel() > FEW else "")
        first = "its first row" if numbers.dim() > 1 else "its values"
        stats = f"; mean {numbers.mean():.4g}, std {numbers.std():.4g}" if numbers.numel() > 1 else ""
        return f"{head}, {first} [{few}]{stats}"
    if isinstance(value, ModuleInfo):
        return f"your {value.cls}"
    if isinstance(value, Raised):
        return f"raised {value.type}" + (f": {value.message[:200]}" if value.message else "")
    if isinstance(value, (list, tuple)) and depth == 0:
        items = [show(v, depth + 1) for v in value[:ITEMS]]
        more = f", and {len(value) - ITEMS} more" if len(value) > ITEMS else ""
        if all(not isinstance(v, (torch.Tensor, ModuleInfo, list, tuple)) for v in value):
            return repr(value)[:300]
        return f"a list of {len(value)}: " + "; ".join(items) + more
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)}"
    text = repr(value)
    return text if len(text) <= 300 else text[:300] + " ..."


def comparison(what: str, expected: object, actual: object) -> str:
    """A comparison the check made: what it compares, the two sides, and where they differ most."""
    both = isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)
    kind = "shape, dtype and values" if both else "values"
    lines = [
        f"  compares {kind}: {what}",
        f"    expected (the reference): {show(expected)}",
        f"    actual (yours):           {show(actual)}",
    ]
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)):
        lines.append("    the same" if expected == actual else "    they differ")
    elif expected.shape != actual.shape:
        lines.append(f"    the shapes differ: {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    elif expected.dtype != actual.dtype:
        lines.append(f"    the dtypes differ: {actual.dtype}, expected {expected.dtype}")
    elif expected.numel():
        diff = (actual.detach().cpu().double() - expected.detach().cpu().double()).abs()
        where = tuple(int(i) for i in torch.unravel_index(diff.nan_to_num(float("inf")).argmax(), diff.shape))
        lines.append(
            f"    largest difference {diff.max().item():.4g} at {list(where)}: expected "
            f"{expected[where].item():.6g}, yours {actual[where].item():.6g}"
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


def explain(results_path: Path, keys: list[str] | None, submission: Path | None, device: str | None) -> int:
    from autograder.grading import grade as grading

    run = GradingRun.from_gradescope(json.loads(Path(results_path).read_text()))
    if not run.graded or run.seed is None:
        print(
            f"{results_path}: this run has no scores to explain ({run.reason or 'no seed recorded'})", file=sys.stderr
        )
        return 2
    submission = submission or submission_of(Path(results_path), run.submission)
    if submission is None:
        print(f"cannot find {run.submission} for {results_path}: name it with --submission", file=sys.stderr)
        return 2
    rows = [c for c in run.checks if c.status == FAILED] if not keys else []
    for key in keys or []:
        base, _, case = key.partition("[")
        found = [c for c in run.checks if c.key == base and (not case or case.rstrip("]") in c.cases)]
        if not found:
            print(f"{results_path}: no check {key}; its keys, as --check (CHECK=) takes them:")
            print(keys_text(run.checks))
            return 2
        rows += [c if not case else _only(c, case.rstrip("]")) for c in found]
    print(f"{submission}: seed {run.seed}, graded on {run.device}, torch {run.torch}")
    if not keys and not rows:
        print(f"nothing failed: {points_text(run.score)} of {points_text(run.max_score)} points, every check passed")
        return 0
    for what in changed_since(Path(results_path), submission):
        print(f"note: the {what} changed since this run was graded; what follows is today's {what}'s")
    print("failed checks, by the key --check (CHECK=) takes:" if not keys else "the checks asked for:")
    print(keys_text(rows))
    speed_rows = [c for c in rows if c.part == "speed"]
    rows = [c for c in rows if c.part != "speed"]
    if rows:
        wanted = tuple(dict.fromkeys(key for row in rows for key in case_keys(row)))
        harness.NOTES = []
        try:
            options = grading.Options(
                device=device or run.device or "auto", out=None, quiet=True, seed=run.seed, checks=wanted
            )
            again = grading.grade_submission(submission, options)
            notes = harness.NOTES
        finally:
            harness.NOTES = None
        if not again.graded:
            print(f"cannot grade it again: {again.reason}", file=sys.stderr)
            return 2
        for row in rows:
            for case in explained_cases(row):
                print()
                print(report(row, case, again, [n for n in notes if n["check"] == check_id(row.key, case)]))
    if speed_rows:
        print()
        print(explain_speed(run, str(submission)))
    return 0


def case_keys(row: CheckResult) -> list[str]:
    return [f"{row.key}[{case}]" for case in row.cases] if row.cases else [row.key]


def explained_cases(row: CheckResult) -> list[str]:
    """The cases of a row to explain: those that failed (all of them when it was asked for by case)."""
    if not row.cases:
        return [""]
    return [c for c in row.cases if c in row.failed_cases] or row.cases


def keys_text(rows: list[CheckResult]) -> str:
    lines = []
    for row in rows:
        cases = [c for c in row.cases if not row.failed_cases or c in row.failed_cases]
        for key in [f"{row.key}[{case}]" for case in cases] if row.cases else [row.key]:
            lines.append(f"  {key}  ({row.part}: {CASES.sub('', row.name)}; {row.status.replace('_', ' ')})")
    return "\n".join(lines)


def _only(row: CheckResult, case: str) -> CheckResult:
    from dataclasses import replace

    return replace(row, cases=[case], failed_cases=[case] if case in row.failed_cases else [])


def report(row: CheckResult, case: str, again: GradingRun, notes: list[dict[str, Any]]) -> str:
    """One case of a check: its key, what it checks, the outcome graded and again, what the grader built, sent
    and compared (inputs, expected and actual), and this case's own failure message."""
    key = f"{row.key}[{case}]" if case else row.key
    lines = [key, f"  checks: {CASES.sub('', row.name)}"]
    graded = FAILED if not case or case in row.failed_cases else PASSED
    lines.append(f"  graded: {graded.replace('_', ' ')}")
    now = next((c for c in again.checks if c.key == row.key and (not case or case in c.cases)), None)
    if now is None:
        lines.append("  again:  this check did not run")
    else:
        status = now.status if not case or case in now.failed_cases or now.status == PASSED else PASSED
        same = status == graded
        lines.append(
            f"  again:  {status.replace('_', ' ')}"
            + ("" if same else " (NOT what it was graded: the file or the grader changed)")
        )
    failures = [n for n in notes if n["kind"] == "failed"]
    for item in notes:
        kind = item["kind"]
        if kind == "build":
            args = [show(a, 1) for a in item["args"]] + [f"{k}={show(v, 1)}" for k, v in item["kwargs"].items()]
            weights = " with the hidden weights" if item.get("weights") else ""
            dtype = f" in {item['dtype']}" if item.get("dtype") else ""
            lines.append(f"  built {item['what']}({', '.join(args)}){weights}{dtype}")
        elif kind == "input":
            lines.append(f"  ran {item['what']} on x: {show(item['value'])}")
        elif kind == "call":
            lines.append(f"  called {item['what']}(" + ", ".join(show(a) for a in item["args"]) + ")")
        elif kind == "returned":
            lines.append(f"    it returned {show(item['value'])}")
        elif kind == "compared":
            lines.append(comparison(item["what"], item["expected"], item["actual"]))
        elif kind == "counted":
            lines.append(f"  compares counts: {item['what']}: {item['expected']} for 2 heads, {item['actual']} for 12")
        elif kind == "failed" and item is not failures[-1]:  # a step the check looked at, then went on
            lines.append(f"    that failed: {str(item['message']).splitlines()[0][:300]}")
    if failures:  # the check's own verdict is its last failure
        lines.append("  why it failed: " + _indent(str(failures[-1]["message"])[:MESSAGE_CHARS]).lstrip())
    elif now is not None and now.status != PASSED:
        lines.append("  why it failed: " + _indent(now.message[:MESSAGE_CHARS]).lstrip())
    return "\n".join(lines)


def _indent(text: str, by: str = "    ") -> str:
    return "\n".join(by + line for line in text.splitlines())


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
