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
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from autograder.grading.checks import harness
from autograder.grading.checks.harness import Raised
from autograder.model import FAILED, PASSED, CheckResult, GradingRun, points_text
from autograder.sandbox.protocol import ModuleInfo, clean_text

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
    from autograder.course.store import PACKAGE_DIR, grader_files, reference_files, sha256_tree, submission_hash

    was = json.loads(recorded.read_text())
    now = {"submission": submission_hash(submission), "grader": sha256_tree(grader_files(), PACKAGE_DIR)}
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
        if value.stub:
            return "not written yet (it still raises NotImplementedError)"
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
    workloads = run.speed.workloads if run.speed is not None else {}
    lines = [
        "speed: not reproducible by seed. Its inputs come from the seed, but what is scored is a timing: your",
        "forward's speedup over the wrapper divided by the reference's, in the same run. Both are measured in",
        "interleaved rounds on the machine that graded, so the machine cancels out to first order, but not",
        "what else ran on it, nor its clock speed at that moment: a regrade measures again and may land on",
        "the other side of a band (a figure of 1.04 one time and 0.93 the next is ordinary).",
    ]
    for name, figures in workloads.items():
        if figures.relative is not None:
            spread = figures.relative_spread
            q1, q3 = (spread.q1, spread.q3) if spread else (float("nan"), float("nan"))
            credit = figures.credit if figures.credit is not None else 0
            lines.append(
                f"  {name}: {figures.relative:.3f} (median of {figures.rounds} rounds; middle half "
                f"{q1:.3f} to {q3:.3f}), "
                f"{credit:.0%} of the points"
            )
            interval = figures.interval  # the verdict's confidence interval, where one was recorded
            if interval is not None:
                lines.append(f"    interval: {interval[0]:.3f} to {interval[1]:.3f}")
        else:
            lines.append(f"  {name}: not timed: {figures.failed or ''}")
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
        matched = [c for c in run.checks if c.key == base and (not case or case.rstrip("]") in c.cases)]
        if not matched:
            say(f"{results_path}: no check {key}; its keys, as --check (CHECK=) takes them:")
            say(keys_text(run.checks))
            return 2
        rows += [c if not case else _only(c, case.rstrip("]")) for c in matched]
    say(f"{submission}: seed {run.seed}, graded on {run.device}, torch {run.torch}")
    if not keys and not rows:
        say(f"nothing failed: {points_text(run.score)} of {points_text(run.max_score)} points, every check passed")
        return 0
    inputs_changed = changed_since(Path(results_path), submission)  # hashes the file and the grader: once
    for what in inputs_changed:
        say(f"note: the {what} changed since this run was graded; what follows is today's {what}'s")
    say("failed checks, by the key --check (CHECK=) takes:" if not keys else "the checks asked for:")
    say(keys_text(rows))
    speed_rows = [c for c in rows if c.part == "speed"]
    rows = [c for c in rows if c.part != "speed"]
    if rows:
        wanted = tuple(dict.fromkeys(key for row in rows for key in case_keys(row)))
        options = grading.Options(device=device or run.device or "auto", out=None, quiet=True, seed=run.seed)
        again, notes = regrade(submission, replace(options, checks=wanted))
        if not again.graded:
            say(f"cannot grade it again: {again.reason}", error=True)
            return 2
        whole: GradingRun | None = None
        if any(outcome(again, row, case) != graded_status(row, case) for row in rows for case in explained_cases(row)):
            # Alone, a check runs without what ran before it in the grading (the speed part first, which builds
            # the submission's module on its own workload, then the other parts): graded whole again, as it was.
            graded_parts = tuple(dict.fromkeys(c.part for c in run.checks))
            whole, notes = regrade(submission, replace(options, parts=graded_parts))
        changed = inputs_changed + [
            what
            for what, was, now in (
                ("torch version", run.torch, torch.__version__),
                ("device", run.device, options.device),
            )
            if was and now != "auto" and was != now
        ]
        recorded = (Path(results_path).resolve().parent / "inputs.json").is_file()
        for row in rows:
            for case in explained_cases(row):
                say("")
                verdict = reproduction(row, case, again, whole, changed, recorded)
                shown = found(whole, row, case) if whole is not None else found(again, row, case)
                say(report(row, case, verdict, shown, [n for n in notes if n["check"] == check_id(row.key, case)]))
    if speed_rows:
        say("")
        try:
            say(explain_speed(run, str(submission)))
        except (TypeError, ValueError, AttributeError) as exc:  # figures of a results.json written elsewhere
            say(f"speed: the figures in {results_path} cannot be read ({type(exc).__name__}: {exc})")
    return 0


def regrade(submission: Path, options: Any) -> tuple[GradingRun, list[dict[str, Any]]]:
    """The submission graded again with `options` (its seed), and what the harness noted while it ran."""
    from autograder.grading import grade as grading

    notes = harness.Notes()
    again = grading.grade_submission(submission, replace(options, notes=notes))
    return again, notes.items


def found(run: GradingRun | None, row: CheckResult, case: str) -> CheckResult | None:
    if run is None:
        return None
    return next((c for c in run.checks if c.key == row.key and (not case or case in c.cases)), None)


def graded_status(row: CheckResult, case: str) -> str:
    """The status `row` records for one case: failed for a failed case, passed for the others."""
    return row.status if not case or case in row.failed_cases or row.status == PASSED else PASSED


def outcome(run: GradingRun | None, row: CheckResult, case: str) -> str | None:
    """The status of `row`'s check (and case) in `run`; None when it did not run."""
    now = found(run, row, case)
    return None if now is None else graded_status(now, case)


def reproduction(
    row: CheckResult, case: str, alone: GradingRun, whole: GradingRun | None, changed: list[str], recorded: bool
) -> str:
    """The line saying whether the check's outcome was reproduced, and when it was not, why: "NOT reproduced"
    only when neither the check graded alone nor the whole grading gave what it was graded."""
    graded = graded_status(row, case)
    now = outcome(alone, row, case)
    if now == graded:
        return f"again:  {now.replace('_', ' ')}"
    alone_said = "it did not run" if now is None else now.replace("_", " ")
    again = outcome(whole, row, case)
    if again == graded:
        return (
            f"again:  {graded.replace('_', ' ')} (reproduced, graded whole as it was). Graded alone it was "
            f"{alone_said}: alone, it runs without what runs before it in a grading (the speed part first, "
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
    whole_said = "" if again is None else f"; graded whole, {again.replace('_', ' ')}"
    return f"again:  NOT reproduced: graded alone, {alone_said}{whole_said}; {why}"


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
    return replace(row, cases=[case], failed_cases=[case] if case in row.failed_cases else [])


def report(row: CheckResult, case: str, verdict: str, now: CheckResult | None, notes: list[dict[str, Any]]) -> str:
    """One case of a check: its key, what it checks, the outcome graded and again (`verdict`), what the
    grader built, sent and compared (inputs, expected and actual), and this case's own failure message."""
    key = f"{row.key}[{case}]" if case else row.key
    lines = [key, f"  checks: {CASES.sub('', row.name)}"]
    lines.append(f"  graded: {graded_status(row, case).replace('_', ' ')}")
    lines.append(f"  {verdict}")
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
