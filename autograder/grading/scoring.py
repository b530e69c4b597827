"""From check outcomes to scored checks: a part's points shared among its checks by the rubric's weights.

A check earns all of its points when it passed and none when it failed, unless it says what fraction it
earned (`credit`, the speed part's partial credit). The speed part earns nothing while a check it
requires (`[speed] requires`, e.g. the mha part's values) failed: it is then not credited (the rubric's
declared rule), and its rows say it waits for that part.

One rounding rule, applied here and nowhere else: every score is a whole number of hundredths of a point.
A part's points are shared among its checks, and a check's among its cases, by the largest remainder, so
that they add up to the part's points exactly; a partial credit is rounded half up to a hundredth. Every
total and part score is then an exact sum, and every output shows the same numbers
(`model.add_points`, `model.points_text`).

Each mistake is named once: a problem that many checks share (`NotCredited` with a cause, e.g. a
constructor the grader cannot load weights into) is said in full by the first of them the student can
see, and the others of its part are not credited and point to it (`name_once`). One mistake costs one part:
where the problem is another part's (`owner`, e.g. the mha part's constructor, which fuse_heads builds), the
checks of any other part that meet it are not charged: they earn their points and say that they wait for that
part (`NOT_CHARGED`); the speed part aside, by its declared rule. A check is one row: the cases of a
parametrised check are counted and named in it, "failed in 2 of 4 cases: [3 heads, bias] and [6 heads,
bias]" (`group_cases`), the way `explain --check` names them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from fractions import Fraction

from autograder.contract import PART_IDS
from autograder.grading import graphs
from autograder.model import (
    FAILED,
    GRADER,
    HUNDREDTHS,
    NOT_CHARGED,
    NOT_CREDITED,
    PASSED,
    CheckResult,
    CheckStatus,
    add_points,
    hundredths,
)
from autograder.rubric import Rubric

NOT_CREDITED_PREFIX = "not credited: "
NOT_CHARGED_PREFIX = "waiting: "  # a check not charged, and the speed part gated: they wait for another part
PREFIXES = (NOT_CREDITED_PREFIX, NOT_CHARGED_PREFIX)
ORDER = (FAILED, NOT_CREDITED, NOT_CHARGED)  # a row of several cases has the first of its cases' statuses here
ALWAYS_CHARGED = ("speed",)  # the parts never not charged: no speed points while the values are wrong (declared)
NOT_RUN = "not run (the grading run ended before this check)"
OWN = "\0"  # how the diagnosis of a failure that names none starts: it is its own, the same as no other


@dataclass
class Outcome:
    """What one check's run came to, before points."""

    key: str  # "module::function", the rubric's key
    part: str
    name: str
    status: CheckStatus | None = None  # None: never ran
    message: str = ""
    evidence: str = GRADER
    credit: float | None = None  # the fraction of its points earned, when not all or nothing
    case: str = ""  # the id of a parametrised check's case
    cause: str = ""  # a problem this check shares with others (see `name_once`), in a few words
    owner: str = ""  # the part whose mistake `cause` is; "" when it is the check's own part's
    mistake: str = ""  # the likely mistake a failure names (`CheckResult.mistake`)
    diagnosis: str = ""  # what went wrong, the same for every case that meets it (`harness.fail`)
    detail: str = ""  # what the message says before it explains its likely mistake (`CheckResult.detail`)


def allocate_points(outcomes: list[Outcome], rubric: Rubric) -> list[float]:
    """A part's points are shared among its checks in proportion to their weights, and a check's among its
    cases equally, each in whole hundredths by the largest remainder (ties to the earlier check or case),
    so that the shares add up to the part's points exactly."""
    keys: dict[str, list[int]] = {}  # check key -> the indices of its outcomes
    for index, outcome in enumerate(outcomes):
        keys.setdefault(outcome.key, []).append(index)
    by_part: dict[str, list[str]] = {}
    for key in keys:
        by_part.setdefault(outcomes[keys[key][0]].part, []).append(key)
    points = [0.0] * len(outcomes)
    for part, part_keys in by_part.items():
        total = hundredths(rubric.part_points(part))
        for key, check_share in zip(part_keys, shares(total, [rubric.weight(k) for k in part_keys])):
            for index, case_share in zip(keys[key], shares(check_share, [1.0] * len(keys[key]))):
                points[index] = case_share / HUNDREDTHS
    return points


def shares(total: int, weights: list[float]) -> list[int]:
    """`total` whole units shared in proportion to `weights` by the largest remainder (Hamilton's method)."""
    weight = sum(Fraction(w) for w in weights)
    if not weight:
        return [0] * len(weights)
    quotas = [Fraction(total) * Fraction(w) / weight for w in weights]
    given = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - given[i]), i))
    for i in by_remainder[: total - sum(given)]:
        given[i] += 1
    return given


def earned(max_score: float, credit: float) -> float:
    """A partial credit's points: the fraction of the check's hundredths, rounded half up."""
    return math.floor(hundredths(max_score) * credit + 0.5) / HUNDREDTHS


def score(outcomes: list[Outcome], rubric: Rubric) -> list[CheckResult]:
    """Scored rows, in part order (then in the order the checks ran)."""
    order = {part: i for i, part in enumerate(PART_IDS)}
    outcomes = sorted(gate_speed(outcomes, rubric), key=lambda o: order.get(o.part, len(order)))
    results = []
    for index, (outcome, max_score) in enumerate(zip(outcomes, allocate_points(outcomes, rubric))):
        status = outcome.status or FAILED
        if status == NOT_CHARGED and outcome.part in ALWAYS_CHARGED:
            status = NOT_CREDITED
        message = outcome.message if status != PASSED else ""
        said = outcome.diagnosis or outcome.mistake or outcome.cause or f"{OWN}{index}"
        if outcome.status is None and not message:
            message = said = NOT_RUN
        fraction = (
            outcome.credit if outcome.credit is not None and outcome.status else float(status in (PASSED, NOT_CHARGED))
        )
        results.append(
            CheckResult(
                key=outcome.key,
                part=outcome.part,
                name=outcome.name,
                status=status,
                score=earned(max_score, fraction),
                max_score=max_score,
                message=message,
                visibility=rubric.visibility(outcome.key),
                evidence=outcome.evidence,
                cases=[outcome.case] if outcome.case else [],
                failed_cases=[outcome.case] if outcome.case and status != PASSED else [],
                mistake=(outcome.mistake or outcome.cause) if status == FAILED else "",
                diagnosis=said if status != PASSED else "",
                detail=outcome.detail if status != PASSED else "",
            )
        )
    return say_once(group_cases(name_once(results, [o.cause for o in outcomes], [o.owner for o in outcomes])))


def gate_speed(outcomes: list[Outcome], rubric: Rubric) -> list[Outcome]:
    """The speed part's checks are not credited, with no points, while a check `[speed] requires` failed. Where
    one of those did not run (`preview` runs only the visible checks), the checks of its part that ran and
    compare what the grader computed (not what the worker reports of itself) stand in for it. The reason
    names the part to fix, never a check the student may not see."""
    required = set(rubric.speed.requires) if rubric.speed else set()
    ran = {o.key for o in outcomes}
    absent = {key.split("::", 1)[0] for key in required - ran}  # the parts of the required checks not run here
    stand_ins = {o.key for o in outcomes if o.part in absent and o.evidence == GRADER and o.part != "speed"}
    failed = [o for o in outcomes if o.key in (required & ran) | stand_ins and o.status != PASSED]
    if not failed:
        return outcomes
    parts = list(dict.fromkeys(o.part for o in failed))
    named = " and ".join(f'"{rubric.part_title(p)}" ({p})' for p in parts)
    if any(o.key.endswith("::test_matches_reference") or o.key in stand_ins for o in failed):
        reason = (
            f"{NOT_CHARGED_PREFIX}speed counts only once the values of {named} are right, and they are not yet. "
            "Fix them first: a fast forward that computes something else earns nothing (the rubric's rule)"
        )
    elif all({o.mistake, o.diagnosis} & graphs.CANNOT_JUDGE for o in failed):  # its graph could not be judged
        reason = (
            f"{NOT_CHARGED_PREFIX}speed counts only for a forward whose graph of PyTorch operations the grader can "
            f"capture and check, as the checks of {named} do, and they could not: their message says why"
        )
    else:  # the values are right; what the speed part rests on besides (no ready-made attention) is not
        reason = (
            f"{NOT_CHARGED_PREFIX}speed counts only for a forward that passes the checks of {named} it rests on (no "
            "ready-made attention), and one of them failed: the speed of a forward that is not your own computation "
            "earns nothing"
        )

    def gated(o: Outcome) -> Outcome:
        measured = o.credit is not None  # the speed was measured: its figures still tell the student something
        return replace(
            o,
            status=NOT_CREDITED,
            credit=0.0,
            cause="",
            message=reason + (f"\n(measured: {o.message})" if measured and o.message else ""),
            detail="",
        )

    return [gated(o) if o.part == "speed" else o for o in outcomes]


def name_once(results: list[CheckResult], causes: list[str], owners: list[str] | None = None) -> list[CheckResult]:
    """A problem several checks share (the same `cause`) is said in full, as a failure, by the first of
    them the student can see in the part whose mistake it is (its `owner`; else the first visible, else the
    first); the others of that part are not credited and point to it. The checks of any other part that meet
    it are not charged: they earn their points and say that they wait for the owner's part (the speed part
    aside: `ALWAYS_CHARGED`). Where the owner's part did not run, they say the whole problem themselves."""
    owners = owners or [""] * len(results)
    first: dict[str, CheckResult] = {}
    ranked = sorted(
        zip(results, causes, owners),
        key=lambda rco: (bool(rco[2]) and rco[0].part != rco[2], rco[0].visibility != "visible"),
    )
    for result, cause, owner in ranked:
        if cause and cause not in first and not elsewhere(result, owner):
            first[cause] = result
    named = []
    for result, cause, owner in zip(results, causes, owners):
        where = first.get(cause)
        if cause and elsewhere(result, owner):
            said = where is not None and where.visibility == "visible"
            pointer = f' (said in full under "{where.part}: {where.name}")' if where is not None and said else ""
            message = (
                f"{NOT_CHARGED_PREFIX}{cause}{pointer}. This check waits for part {owner} and costs nothing here: "
                f"the mistake is charged once, in part {owner}"
            )
            if where is None:  # the owner's part did not run: the whole problem is said here
                message += f"\n{result.message}"
            result = replace(result, status=NOT_CHARGED, score=result.max_score, message=message, mistake="", detail="")
        elif cause and where is not None and where is not result:
            seen = f' (said in full under "{where.part}: {where.name}")' if where.visibility == "visible" else ""
            message = f"{NOT_CREDITED_PREFIX}{cause}{seen}"
            result = replace(result, status=NOT_CREDITED, message=message, mistake="", detail="")
        named.append(result)
    return named


def elsewhere(result: CheckResult, owner: str) -> bool:
    """Whether a shared problem is another part's mistake for this check: then it is not charged here."""
    return bool(owner) and result.part != owner and result.part not in ALWAYS_CHARGED


def diagnosis(result: CheckResult) -> str:
    """What a failure said went wrong, whatever its message says of the case: set where the check failed
    (`harness.fail`'s diagnosis, else its likely mistake, else the problem it shares with other checks),
    never read from the message. The cases of a check with one diagnosis are one group of its row; checks
    of a part with one diagnosis say it once. A failure that names none is its own."""
    return result.diagnosis or f"{OWN}{id(result)}"


def group_cases(results: list[CheckResult]) -> list[CheckResult]:
    """Each check one row, where its first case was: its cases' points added up, its status the worst of
    theirs (failed, then not credited, then not charged, then passed), and a message that counts and names the cases that did
    not pass and says, once per diagnosis, what went wrong."""
    by_key: dict[str, list[CheckResult]] = {}
    for result in results:
        by_key.setdefault(result.key if result.cases else f"{result.key}#{id(result)}", []).append(result)
    rows = []
    for members in by_key.values():
        first = members[0]
        if len(members) == 1:
            rows.append(first)
            continue
        failing = [m for m in members if m.status != PASSED]
        status = next((s for s in ORDER if any(m.status == s for m in failing)), PASSED)
        said = list(dict.fromkeys(group_of(m) for m in failing))
        message, detail = counted(failing, len(members))
        rows.append(
            replace(
                first,
                status=status,
                score=add_points(m.score for m in members),
                max_score=add_points(m.max_score for m in members),
                message=message,
                detail=detail,
                cases=[m.cases[0] for m in members],
                failed_cases=[m.cases[0] for m in failing],
                mistake=next((m.mistake for m in failing if m.mistake), ""),
                diagnosis=said[0][1] if len(said) == 1 else "\n".join(f"{s}: {d}" for s, d in said),
            )
        )
    return rows


def group_of(case: CheckResult) -> tuple[str, str]:
    """The group of a row's message a case that did not pass is said in: by its diagnosis; the cases not
    credited wait for the same thing, so they are one group."""
    return case.status, diagnosis(case) if case.status == FAILED else ""


def case_list(cases: list[str]) -> str:
    """Cases as `explain --check KEY[case]` names them: "[2 heads], [4 heads] and [1 head]"."""
    named = [f"[{case}]" for case in cases]
    return named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]


def counted(failing: list[CheckResult], total: int) -> tuple[str, str]:
    """A row's message: how many of its cases failed (or were not credited, or wait) and which, then each
    diagnosis once, with the cases it was met in when there are several; and what it says before the first
    explanation of a likely mistake it says whole (its `detail`), else ""."""
    if not failing:
        return "", ""
    header = []
    for verb in dict.fromkeys(m.word for m in sorted(failing, key=lambda m: ORDER.index(m.status))):
        cases = [m.cases[0] for m in failing if m.word == verb]
        if cases:
            header.append(
                f"{verb} in all {total} cases"
                if len(cases) == total
                else f"{verb} in {len(cases)} of {total} cases: {case_list(cases)}"
            )
    groups: dict[tuple[str, str], list[CheckResult]] = {}
    for member in failing:
        groups.setdefault(group_of(member), []).append(member)
    prefix = next((p for p in PREFIXES if failing[0].message.startswith(p)), None)
    if len(groups) == 1 and len(header) == 1 and prefix:
        return f"{header[0]}: {failing[0].message.removeprefix(prefix)}", ""
    lines, detail = ["; ".join(header)], ""
    if len(groups) == 1:
        first = failing[0]
        return "\n".join([*lines, first.message]), "\n".join([*lines, first.detail]) if first.detail else ""
    for group in groups.values():
        named = f"{case_list([m.cases[0] for m in group])}: "
        if not detail and group[0].detail and len(group[0].detail) <= SHORTER:  # said whole in `shorter`'s words
            detail = "\n".join([*lines, named + group[0].detail])
        lines.append(named + shorter(group[0].message))
    return "\n".join(lines), detail


SHORTER = 1200  # the characters of each of several diagnoses a row's message says


def shorter(message: str, limit: int = SHORTER) -> str:
    """One of several diagnoses in a row's message: at most `limit` characters of it."""
    return message if len(message) <= limit else message[:limit] + " ..."


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
            if row.detail:  # what it said before its explanation of the likely mistake, which is said there
                message = f"{row.detail}{pointer}."
            else:  # a row of several cases starts with the line that counts them (`counted`): kept
                head = row.message.split("\n", 1)[0] + "\n" if len(row.cases) > 1 else ""
                message = f"{head}{row.message[len(head) :].split(chr(10), 1)[0]} ({pointer})"
            row = replace(row, message=message)
        said.append(row)
    return said
