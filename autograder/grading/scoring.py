"""From check outcomes to scored checks: a part's points shared among its checks by the rubric's weights.

A check earns all of its points when it passed and none when it failed, unless it says what fraction it
earned (`credit`, the speed part's partial credit). The speed part earns nothing while a check it
requires (`[speed] requires`, e.g. the mha part's values) failed."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

from autograder.contract import PART_IDS
from autograder.model import FAILED, GRADER, PASSED, CheckResult
from autograder.rubric import Rubric


@dataclass
class Outcome:
    """What one check's run came to, before points."""

    key: str  # "module::function", the rubric's key
    part: str
    name: str
    status: str | None = None  # PASSED / FAILED; None: never ran
    message: str = ""
    evidence: str = GRADER
    credit: float | None = None  # the fraction of its points earned, when not all or nothing


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
    """Scored checks, in part order (then in the order they ran)."""
    order = {part: i for i, part in enumerate(PART_IDS)}
    outcomes = sorted(gate_speed(outcomes, rubric), key=lambda o: order.get(o.part, len(order)))
    results = []
    for outcome, max_score in zip(outcomes, allocate_points(outcomes, rubric)):
        status = outcome.status or FAILED
        message = outcome.message if status == FAILED else ""
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
            )
        )
    return results


def gate_speed(outcomes: list[Outcome], rubric: Rubric) -> list[Outcome]:
    """The speed part's checks fail, with no points, while a check `[speed] requires` failed (a check that
    did not run in this grading, e.g. a hidden one under `check`, does not count either way)."""
    required = set(rubric.speed.requires) if rubric.speed else set()
    failed = [o for o in outcomes if o.key in required and o.status != PASSED]
    if not failed:
        return outcomes
    reason = (
        f"no speed points: they count only when the values are right, and the check "
        f'"{failed[0].part}: {failed[0].name}" failed'
    )
    return [
        replace(o, status=FAILED, credit=0.0, message=reason + (f"\n(measured: {o.message})" if o.message else ""))
        if o.part == "speed"
        else o
        for o in outcomes
    ]
