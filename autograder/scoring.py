"""Turning check outcomes into Gradescope's results.json, with points from the rubric."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from autograder.rubric import PART_IDS, Rubric


@dataclass
class Outcome:
    key: str  # "module::function", the rubric's key
    part: str
    name: str
    status: str | None = None  # "passed" / "failed"; None: never ran
    message: str = ""


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


def build_results(outcomes: list[Outcome], rubric: Rubric, meta: dict) -> dict:
    order = {part: i for i, part in enumerate(PART_IDS)}
    outcomes = sorted(outcomes, key=lambda o: order.get(o.part, len(order)))
    tests = []
    for number, (outcome, max_score) in enumerate(zip(outcomes, allocate_points(outcomes, rubric)), start=1):
        status = outcome.status or "failed"
        message = outcome.message if status == "failed" else ""
        if outcome.status is None and not message:
            message = "not run (the grading run ended before this check)"
        tests.append({
            "name": f"{outcome.part}: {outcome.name}",
            "number": str(number),
            "score": round(max_score if status == "passed" else 0.0, 6),
            "max_score": round(max_score, 6),
            "status": status,
            "output": message,
            "visibility": rubric.visibility(outcome.key),
            "tags": [outcome.part, outcome.key],
        })
    score = round(sum(t["score"] for t in tests), 2)
    max_score = round(sum(t["max_score"] for t in tests), 2)
    results = {
        "score": score,
        "max_score": max_score,
        "execution_time": round(meta.get("execution_time", 0.0), 2),
        "output": meta.get("output", ""),
        "output_format": "text",
        "visibility": "visible",
        "stdout_visibility": "hidden",
        "tests": tests,
        "extra_data": {k: v for k, v in meta.items() if k not in ("output", "execution_time", "leaderboard")},
    }
    if meta.get("leaderboard"):
        results["leaderboard"] = meta["leaderboard"]
    return results


def part_summary(results: dict) -> list[dict]:
    """Per part: points, max points, and the first failed check's message."""
    parts: dict[str, dict] = {}
    for test in results["tests"]:
        part = test["tags"][0]
        entry = parts.setdefault(part, {"part": part, "score": 0.0, "max_score": 0.0, "first_failure": None,
                                        "passed": 0, "total": 0})
        entry["score"] += test["score"]
        entry["max_score"] += test["max_score"]
        entry["total"] += 1
        entry["passed"] += test["status"] == "passed"
        if test["status"] == "failed" and entry["first_failure"] is None:
            entry["first_failure"] = test
    for entry in parts.values():
        entry["score"], entry["max_score"] = round(entry["score"], 2), round(entry["max_score"], 2)
    return list(parts.values())
