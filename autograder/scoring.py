"""From check outcomes to scored checks: a part's points shared among its checks by the rubric's weights."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

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


def allocate_points(outcomes: list[Outcome], rubric: Rubric) -> list[float]:
    """A part's points are shared among its checks in proportion to their weights; the cases of one
    parametrised check share its share equally."""
    cases = defaultdict(int)
    for outcome in outcomes:
        cases[outcome.key] += 1
    part_weight = defaultdict(float)
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
    outcomes = sorted(outcomes, key=lambda o: order.get(o.part, len(order)))
    results = []
    for outcome, max_score in zip(outcomes, allocate_points(outcomes, rubric)):
        status = outcome.status or FAILED
        message = outcome.message if status == FAILED else ""
        if outcome.status is None and not message:
            message = "not run (the grading run ended before this check)"
        results.append(CheckResult(key=outcome.key, part=outcome.part, name=outcome.name, status=status,
                                   score=max_score if status == PASSED else 0.0, max_score=max_score,
                                   message=message, visibility=rubric.visibility(outcome.key),
                                   evidence=outcome.evidence))
    return results
