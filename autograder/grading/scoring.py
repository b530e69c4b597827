"""From check outcomes to scored checks: a part's points shared among its checks by the rubric's weights.

A check earns all of its points when it passed and none when it failed, unless it says what fraction it
earned (`credit`, the speed part's partial credit). The speed part earns nothing while a check it
requires (`[speed] requires`, e.g. the mha part's values) failed: it is then not scored.

Each mistake is named once: a problem that many checks share (`NotScored` with a cause, e.g. a constructor
the grader cannot load weights into) is said in full by the first of them the student can see, and the
others are not scored and point to it (`name_once`); the cases of a parametrised check that came out the
same way (the same status, the same diagnosis) are one row, "7 of 7 cases: ..." (`group_cases`).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, replace

from autograder.contract import PART_IDS
from autograder.model import FAILED, GRADER, NOT_SCORED, PASSED, CheckResult
from autograder.rubric import Rubric

LIKELY = re.compile(r"Likely (?:mistake|cause): ([^\n]*)")  # a diagnosis is one line
NOT_SCORED_PREFIX = "not scored: "
COUNTED = re.compile(r"^\d+ of \d+ cases: ")
LABEL_CHARS = 100  # a failure's leading "what: " is a label when it is no longer than this
NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


@dataclass
class Outcome:
    """What one check's run came to, before points."""

    key: str  # "module::function", the rubric's key
    part: str
    name: str
    status: str | None = None  # PASSED / FAILED / NOT_SCORED; None: never ran
    message: str = ""
    evidence: str = GRADER
    credit: float | None = None  # the fraction of its points earned, when not all or nothing
    case: str = ""  # the id of a parametrised check's case
    cause: str = ""  # a problem this check shares with others (see `name_once`), in a few words
    mistake: str = ""  # the likely mistake a failure names (`CheckResult.mistake`)


def allocate_points(outcomes: list[Outcome], rubric: Rubric) -> list[float]:
    """A part's points are shared among its checks in proportion to their weights; the cases of one
    parametrised check share its share equally."""
    cases: defaultdict[str, int] = defaultdict(int)
    for outcome in outcomes:
        cases[outcome.key] += 1
    part_weight: defaultdict[str, float] = defaultdict(float)
    for key, part in {o.key: o.part for o in outcomes}.items():
        part_weight[part] += rubric.weight(key)
    points = []
    for outcome in outcomes:
        total = part_weight[outcome.part]
        share = rubric.weight(outcome.key) / total if total else 0.0
        points.append(rubric.part_points(outcome.part) * share / cases[outcome.key])
    return points


def score(outcomes: list[Outcome], rubric: Rubric) -> list[CheckResult]:
    """Scored rows, in part order (then in the order the checks ran)."""
    order = {part: i for i, part in enumerate(PART_IDS)}
    outcomes = sorted(gate_speed(outcomes, rubric), key=lambda o: order.get(o.part, len(order)))
    cases: dict[str, int] = defaultdict(int)
    for outcome in outcomes:
        cases[outcome.key] += 1
    results = []
    for outcome, max_score in zip(outcomes, allocate_points(outcomes, rubric)):
        status = outcome.status or FAILED
        message = outcome.message if status != PASSED else ""
        if outcome.status is None and not message:
            message = "not run (the grading run ended before this check)"
        earned = outcome.credit if outcome.credit is not None and outcome.status else float(status == PASSED)
        results.append(
            CheckResult(
                key=outcome.key,
                part=outcome.part,
                name=outcome.name,
                status=status,
                score=max_score * earned,
                max_score=max_score,
                message=message,
                visibility=rubric.visibility(outcome.key),
                evidence=outcome.evidence,
                cases=[outcome.case] if outcome.case else [],
                total_cases=cases[outcome.key],
                mistake=(outcome.mistake or outcome.cause) if status == FAILED else "",
            )
        )
    return say_once(group_cases(name_once(results, [o.cause for o in outcomes])))


def gate_speed(outcomes: list[Outcome], rubric: Rubric) -> list[Outcome]:
    """The speed part's checks are not scored, with no points, while a check `[speed] requires` failed (a
    check that did not run in this grading, e.g. a hidden one under `check`, does not count either way). The
    reason names the part to fix, never a check the student may not see."""
    required = set(rubric.speed.requires) if rubric.speed else set()
    failed = [o for o in outcomes if o.key in required and o.status != PASSED]
    if not failed:
        return outcomes
    parts = list(dict.fromkeys(o.part for o in failed))
    named = " and ".join(f'"{rubric.part_title(p)}" ({p})' for p in parts)
    if any(o.key.endswith("::test_matches_reference") for o in failed):
        reason = (
            f"not scored: speed counts only once the values of {named} are right, and they are not yet. "
            "Fix them first: a fast forward that computes something else earns nothing"
        )
    else:  # the values are right; what the speed part rests on besides (no ready-made attention) is not
        reason = (
            f"not scored: speed counts only for a forward that passes the checks of {named} it rests on (no "
            "ready-made attention, the same computation whether or not it is observed), and one of them "
            "failed: the speed of a forward that is not your own computation earns nothing"
        )

    def gated(o: Outcome) -> Outcome:
        measured = o.credit is not None  # the speed was measured: its figures still tell the student something
        return replace(
            o,
            status=NOT_SCORED,
            credit=0.0,
            cause="",
            message=reason + (f"\n(measured: {o.message})" if measured and o.message else ""),
        )

    return [gated(o) if o.part == "speed" else o for o in outcomes]


def name_once(results: list[CheckResult], causes: list[str]) -> list[CheckResult]:
    """A problem several checks share (the same `cause`) is said in full, as a failure, by the first of
    them the student can see (else the first); the others are not scored and point to it."""
    first: dict[str, CheckResult] = {}
    for result, cause in sorted(zip(results, causes), key=lambda rc: rc[0].visibility != "visible"):
        if cause and cause not in first:
            first[cause] = result
    named = []
    for result, cause in zip(results, causes):
        if cause and first[cause] is not result:
            where = first[cause]
            seen = f' (said in full under "{where.part}: {where.name}")' if where.visibility == "visible" else ""
            result = replace(result, status=NOT_SCORED, message=f"not scored: {cause}{seen}", mistake="")
        named.append(result)
    return named


def diagnosis(result: CheckResult) -> str:
    """What a failure says, without what differs from case to case: its likely mistake when it names one,
    else its message without the label of what was compared ("output (12 heads): ..."), the numbers or the
    case's own label. The cases of a check that say the same are one row; checks of a part that say the
    same say it once."""
    found = LIKELY.search(result.message)
    if found:
        text = found.group(1)
    else:
        text = COUNTED.sub("", result.message)
        label, colon, rest = text.partition(": ")
        if colon and "\n" not in label and len(label) <= LABEL_CHARS:
            text = rest
    for case in result.cases:
        for label in sorted(case.split("-"), key=len, reverse=True):
            if label:
                text = text.replace(label, "<case>")
    return NUMBER.sub("#", text)


def group_cases(results: list[CheckResult]) -> list[CheckResult]:
    """The cases of a parametrised check with the same status and diagnosis as one row, where its first
    case was; a failing row's message says how many cases it stands for and shows the first one's."""
    groups: dict[tuple[object, ...], list[CheckResult]] = {}
    for result in results:
        same = (result.key, result.status, diagnosis(result)) if result.cases else (id(result),)
        groups.setdefault(same, []).append(result)
    rows = []
    for members in groups.values():
        first = members[0]
        if len(members) == 1:
            name = f"{first.name} [{first.cases[0]}]" if first.cases and first.total_cases > 1 else first.name
            rows.append(replace(first, name=name))
            continue
        count = f"{len(members)} of {first.total_cases} cases"
        rows.append(
            replace(
                first,
                name=first.name if len(members) == first.total_cases else f"{first.name} [{count}]",
                score=sum(m.score for m in members),
                max_score=sum(m.max_score for m in members),
                message=counted(first.message, count),
                cases=[case for m in members for case in m.cases],
            )
        )
    return rows


def counted(message: str, count: str) -> str:
    """A grouped row's message: how many cases it stands for, then the first case's message."""
    if not message:
        return ""
    if message.startswith(NOT_SCORED_PREFIX):
        return f"not scored ({count}): {message.removeprefix(NOT_SCORED_PREFIX)}"
    return f"{count}: {message}"


def say_once(rows: list[CheckResult]) -> list[CheckResult]:
    """Each diagnosis said in full once per part: by the first row the student can see that says it. The
    other rows of the part that say the same keep what is theirs (what differed, on which input) and point
    to it."""
    first: dict[tuple[str, str], CheckResult] = {}
    for row in rows:
        if row.status == FAILED and row.visibility == "visible":
            first.setdefault((row.part, diagnosis(row)), row)
    said = []
    for row in rows:
        where = first.get((row.part, diagnosis(row))) if row.status == FAILED else None
        if where is not None and where is not row:
            pointer = f'the same as under "{where.part}: {where.name}"'
            found = LIKELY.search(row.message)
            if found:
                message = f"{row.message[: found.start(1)]}{pointer}."
            else:
                message = f"{row.message.split(chr(10), 1)[0]} ({pointer})"
            row = replace(row, message=message)
        said.append(row)
    return said
