"""The grading model: what one grading run found, typed, built once.

Every output reads this model: the terminal summary, results.json (Gradescope's format, made only at
the edge by `to_gradescope`), the class table and CSV, the gradebook and the feedback. None of them
parses text. A results.json written by `to_gradescope` reads back into the same model with
`from_gradescope`, so a class can be summarised from the files alone.

A run either graded the submission (`status == "graded"`, whatever the score) or could not
(`"cannot_grade"`: a broken rubric, a check that failed for a reason of the grader's own, a file that
is not a submission), in which case it carries no score and `make grade` retries it next time.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from autograder.atomic import open_atomically
from autograder.contract import PART_IDS, Workload
from autograder.sandbox.protocol import (
    CellProblem,  # the worker's own report, as it crossed the wire
    clean_text,
)

T = TypeVar("T")

RunStatus = Literal["graded", "cannot_grade"]  # a grading's
GRADED: RunStatus = "graded"
CANNOT_GRADE: RunStatus = "cannot_grade"
# What results.json says while a grading runs: a grader killed before it writes its own leaves this behind.
UNFINISHED = "grading did not finish: the grader was stopped before it wrote its results"
# A check's status. NOT_CREDITED: it earns none of its points while something of its own part it rests on is
# wrong (a property of the part's own wrong output: a wrong answer earns nothing for side properties), or, by
# the rubric's declared rule, the speed part while the values it requires are wrong; the message says what, and
# where that is said in full; it accuses the submission of nothing of its own. NOT_CHARGED: it could not be
# judged because of a mistake in another part (charged there, once): it earns its points, so that one mistake
# costs one part (the part's row says `waiting`, docs/vocabulary.md). Gradescope knows only passed and failed:
# results.json writes the first as failed with the tag "not-credited", the second as passed (its points are
# earned) with the tag "not-charged".
CheckStatus = Literal["passed", "failed", "not_credited", "not_charged"]  # a check's
PASSED: CheckStatus = "passed"
FAILED: CheckStatus = "failed"
NOT_CREDITED: CheckStatus = "not_credited"
NOT_CHARGED: CheckStatus = "not_charged"
NOT_CREDITED_TAG = "not-credited"
NOT_CHARGED_TAG = "not-charged"
OLD_NOT_CREDITED_TAGS = ("not-scored",)  # the same status, as records written before it was renamed say it
GRADER, WORKER = "grader", "worker"  # who vouches for a check's evidence
# The mistakes that say a part is not done yet rather than done wrongly (`CheckResult.mistake`): a function
# left a stub, a value (a quiz's answer, a literal) left None, as the release leaves them. The class report
# counts a part that meets one as not done, once, whatever else its checks found to fail there.
NOT_DONE_STUB = "not done yet: the released stub still raises NotImplementedError"
NOT_DONE_UNANSWERED = "not done yet: the answer is still None, as released"
NOT_DONE_MISTAKES = (NOT_DONE_STUB, NOT_DONE_UNANSWERED)
COUNTED_CASES = re.compile(r"^(?:failed|not credited|waiting) in (?:all )?\d+ (?:of \d+ )?cases")  # a row's count
CASE_LIST = re.compile(r"\[[^\]\n]*\](?:, \[[^\]\n]*\])*(?: and \[[^\]\n]*\])?")  # "[a], [b] and [c]"
CASE_LABEL = re.compile(r"^\[[^\]\n]*\]: ")  # "[a]: " before what a case says
NOT_DONE_YET = "not done yet"  # a part that meets one, as every output words it (docs/vocabulary.md)
WAITING = "waiting"  # a check, or a part, that rests on another part that is not right yet (docs/vocabulary.md)
ROW_WORDS = {PASSED: "passed", FAILED: "failed", NOT_CREDITED: "not credited", NOT_CHARGED: WAITING}  # a row's word
# The speed part's one named mistake, however the timing ends (too slow to time, past the deadline the
# reference's time sets, or timed below the bands).
NOT_ONE_PASS = "too slow for speed points: the heads are not computed in one batched pass (a loop over the heads?)"
# Why a run could not grade, by name, where the grader knows it (`GradingRun.cannot_grade_cause`). TIMING_LOCK:
# the device's timing lock could not be taken now (another grading held it, or its folder is unusable); nothing
# of the submission's was judged, and a class run grades it again at its end.
TIMING_LOCK = "timing_lock"
MODEL_VERSION = 1
HUNDREDTHS = 100  # every score is a whole number of hundredths of a point (`scoring.allocate_points`)


def hundredths(points: float) -> int:
    """A score in whole hundredths of a point. Every score the grader makes is one already, so this only
    undoes a float's representation error (1.88 is 1.8799999999999999), never rounds away a fraction."""
    return round(points * HUNDREDTHS)


def add_points(values: Iterable[float]) -> float:
    """The sum of scores, exact: in whole hundredths, so a total is the sum of its parts as shown."""
    return sum(hundredths(v) for v in values) / HUNDREDTHS


def points_text(points: float) -> str:
    """A score as every output writes it: up to two decimals, no trailing zeros ("85.63", "7.5", "100")."""
    text = f"{hundredths(points) / HUNDREDTHS:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def clean_strings(value: T) -> T:
    """`value` with every string in it (in lists, tuples, dicts and their keys, and the fields of dataclasses
    such as a `GradingRun`) cleaned as the worker's strings are (`protocol.clean_text`, nothing cut): no
    control character but newline and tab, no bidirectional control, no lone surrogate. A file name or a
    folder name is the student's choice, and reaches results.json, the summary and `explain` through the
    grader's own messages too; and a results.json given to `explain` may be forged."""
    cleaned: Any
    if isinstance(value, str):
        cleaned = clean_text(value, len(value))
    elif isinstance(value, list):
        cleaned = [clean_strings(item) for item in value]
    elif isinstance(value, tuple):
        cleaned = tuple(clean_strings(item) for item in value)
    elif isinstance(value, dict):
        cleaned = {clean_strings(key): clean_strings(item) for key, item in value.items()}
    elif is_dataclass(value) and not isinstance(value, type):
        cleaned = replace(value, **{f.name: clean_strings(getattr(value, f.name)) for f in fields(value) if f.init})
    else:
        cleaned = value
    return cleaned  # type: ignore[no-any-return]


@dataclass
class CheckResult:
    """One row of the results: a check, with all its cases when it is parametrised (a mistake met on seven
    hidden cases is one row that counts them)."""

    key: str  # "module::function", the rubric's key
    part: str
    name: str  # what it checks, for people
    status: CheckStatus
    score: float  # whole hundredths of a point, as every output shows it
    max_score: float
    message: str = ""  # why it failed, for the student
    visibility: str = "visible"
    evidence: str = GRADER  # WORKER: it rests on what the worker reported about itself
    cases: list[str] = field(default_factory=list)  # a parametrised check's cases (ids), in the order they ran
    failed_cases: list[str] = field(default_factory=list)  # those of them that did not pass
    # The likely mistake a failed check named, in words that are the same for every student who made it (a
    # description from checks/mistakes.py, or the check's own), set where the check names it, never read
    # back from the message: what the class report counts. Empty when it named none.
    mistake: str = ""
    # What went wrong, in words the same for every case that meets it (`harness.fail`'s diagnosis, else the
    # mistake): how the scoring tells which failures say the same (`scoring.diagnosis`). Set where the check
    # failed; results.json does not keep it, and it takes no part in comparing two rows.
    diagnosis: str = field(default="", compare=False)
    # What the message says before it explains its likely mistake, that explanation's label included
    # (`harness.Failure.detail`): all the row says of it where the explanation is said in full elsewhere
    # (`scoring.say_once`); "" when it explains none. Like `diagnosis`, results.json does not keep it, and it
    # takes no part in comparing two rows.
    detail: str = field(default="", compare=False)

    @property
    def case_count(self) -> int:
        return len(self.cases) or 1

    @property
    def passed_cases(self) -> int:
        if self.status == PASSED:
            return self.case_count
        return self.case_count - len(self.failed_cases) if self.cases else 0

    @property
    def word(self) -> str:
        """The row's word, as every output writes it (docs/vocabulary.md): `waiting` for a check that rests on
        another part (not charged; or the speed part, which by the rubric's declared rule earns nothing while
        the values it requires are wrong), `not credited` for a property of the part's own wrong output."""
        if self.status == NOT_CHARGED or (self.status == NOT_CREDITED and self.part == "speed"):
            return WAITING
        return ROW_WORDS.get(self.status, self.status)


@dataclass
class PartResult:
    part: str
    title: str
    score: float
    max_score: float
    passed: int
    total: int
    first_failure: CheckResult | None


@dataclass
class LoadReport:
    problem: str | None = None  # the file could not be read or loaded at all
    cells: list[CellProblem] = field(default_factory=list)
    defined: dict[str, str] = field(default_factory=dict)
    # {cell number, as a string: the part} for the cells whose error a part that lost points explains (a demo
    # or self-check using a wrong or unwritten part; `grading.load_parts`): said once, in that part
    cell_parts: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """Every problem, as it was raised (results.json's output keeps them all)."""
        return self._lines(self.cells)

    def loose_lines(self) -> list[str]:
        """The problems no part explains, as they were raised: what a page shows on its own."""
        return self._lines([c for c in self.cells if str(c.cell) not in self.cell_parts])

    def folded(self, part: str) -> list[CellProblem]:
        return [c for c in self.cells if self.cell_parts.get(str(c.cell)) == part]

    def folded_line(self, part: str) -> str:
        """The cells whose error `part` explains, in one sentence, or ""."""
        cells = self.folded(part)
        if not cells:
            return ""
        numbers = [str(c.cell) for c in cells]
        which = f"cell {numbers[0]}" if len(cells) == 1 else f"cells {', '.join(numbers[:-1])} and {numbers[-1]}"
        kinds = " or ".join(dict.fromkeys(c.type for c in cells))
        return f"While loading, {which} raised {kinds} because of it"

    def _lines(self, cells: list[CellProblem]) -> list[str]:
        lines = []
        if self.problem:
            lines.append(f"Your file could not be loaded: {self.problem}")
        lines += [
            f"While loading, cell {c.cell} raised {c.type}" + (f": {c.message}" if c.message else "") for c in cells
        ]
        return lines


# -- the speed part's figures ------------------------------------------------------------------------
# results.json's extra_data.speed, written by `SpeedFigures.to_json` and read back by `SpeedFigures.from_json`.
# Every figure may be missing from a record (a workload that failed before it was timed has none; records
# written by older graders lack some): a figure that is missing, or is not of its type (the file may be
# forged), reads as None. Keys this grader does not write are kept as they were read (`kept`).


def _number(value: object) -> float | None:
    """A figure that is a number (as written: an int stays an int), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _json(value: object) -> object:
    """A figure as results.json writes it: a typed one (`RelativeSpread`, `Workload`) by its own `to_json`."""
    to_json = getattr(value, "to_json", None)
    return to_json() if callable(to_json) else value


def _numbers(value: object) -> dict[str, float] | None:
    if not isinstance(value, dict):
        return None
    return {str(k): v for k, v in value.items() if _number(v) is not None}


@dataclass(frozen=True)
class SpeedBands:
    """The rubric's bands the speed part was scored with (`[speed]`), for the feedback to explain."""

    full_credit_at: float
    no_credit_at: float
    give_up_below: float | None = None  # absent from records written before it existed

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"full_credit_at": self.full_credit_at, "no_credit_at": self.no_credit_at}
        if self.give_up_below is not None:
            data["give_up_below"] = self.give_up_below
        return data

    @classmethod
    def from_json(cls, data: object) -> SpeedBands | None:
        if not isinstance(data, dict):
            return None
        full, none = _number(data.get("full_credit_at")), _number(data.get("no_credit_at"))
        if full is None or none is None:
            return None
        return cls(full, none, _number(data.get("give_up_below")))


@dataclass(frozen=True)
class Decision:
    """The verdict that stopped a workload's rounds (`verdict.Verdict`'s figures), when one did."""

    median: float
    low: float
    high: float
    confidence: float
    rounds: int
    stopped_because: str
    close: bool

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in DECISION_KEYS}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decision | None:
        median, low, high, confidence = (_number(data.get(k)) for k in ("median", "low", "high", "confidence"))
        rounds, stopped, close = data.get("rounds"), data.get("stopped_because"), data.get("close")
        if median is None or low is None or high is None or confidence is None:
            return None
        if not isinstance(rounds, int) or not isinstance(stopped, str) or not isinstance(close, bool):
            return None
        return cls(median, low, high, confidence, rounds, stopped, close)


@dataclass(frozen=True)
class RelativeSpread:
    """The per-round relative speedups' quartiles and extremes (`timing.summarize`)."""

    q1: float
    q3: float
    min: float
    max: float

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: object) -> RelativeSpread | None:
        """The spread as `to_json` wrote it (every figure a number, in its order), else None."""
        if not isinstance(data, dict) or list(data) != [f.name for f in fields(cls)]:
            return None
        q1, q3, low, high = (_number(value) for value in data.values())
        if q1 is None or q3 is None or low is None or high is None:
            return None
        return cls(q1, q3, low, high)


DECISION_KEYS = ("median", "low", "high", "confidence", "rounds", "stopped_because", "close")
# The figures of a measured workload, in the order results.json writes them; then those of every workload.
MEASURED_KEYS = ("speedup", "reference_speedup", "relative", "relative_spread", "ms_per_call", "per_round_ms")


@dataclass(frozen=True)
class WorkloadFigures:
    """One timed workload's figures (`timing.summarize`, then the speed check's): the median times, the
    submission's speedup over the wrapper, the reference's, and the first as a fraction of the second
    (`relative`, the scored figure); or, for a workload whose timing failed, why (`failed`)."""

    speedup: float | None = None
    reference_speedup: float | None = None
    relative: float | None = None  # the median of the per-round relative speedups
    relative_spread: RelativeSpread | None = None
    ms_per_call: dict[str, float] | None = None  # by target (`workers.SUBMISSION`, ...): the median charged time
    per_round_ms: dict[str, dict[str, list[float]]] | None = None  # charged, wall, cpu, waiting -> target -> rounds
    rounds: int | None = None
    timed_seconds: float | None = None
    decision: Decision | None = None  # the verdict that stopped the rounds, when one did
    workload: Workload | None = None  # the rubric's [[speed.workloads]] table, as graded
    failed: str | None = None  # why the timing failed, when it did
    credit: float | None = None  # the fraction of the workload's points earned
    seconds: float | None = None  # the whole check's time on this workload
    said: str | None = None  # the verdict in words
    # by target: how often each ATen operation runs in one forward of the graph that was timed
    operations: dict[str, dict[str, int]] | None = None
    kept: dict[str, Any] = field(default_factory=dict)

    @property
    def interval(self) -> tuple[float, float, float] | None:
        """The verdict's interval for the median relative speedup: low, high, confidence."""
        d = self.decision
        return (d.low, d.high, d.confidence) if d else None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for name in (*MEASURED_KEYS, "rounds", "timed_seconds"):
            if getattr(self, name) is not None:
                data[name] = _json(getattr(self, name))
        verdict: dict[str, Any] = {}
        if self.decision is not None:
            d = self.decision
            data["relative_interval"] = {"low": d.low, "high": d.high, "level": d.confidence}
            data["verdict"] = verdict = d.to_json()
        for name in ("workload", "failed", "credit", "seconds"):
            if getattr(self, name) is not None:
                data[name] = _json(getattr(self, name))
        if self.said is not None:
            data.setdefault("verdict", verdict)["said"] = self.said
        if self.operations is not None:
            data["operations"] = self.operations
        return {**data, **self.kept}

    @classmethod
    def from_json(cls, data: object) -> WorkloadFigures:
        if not isinstance(data, dict):
            return cls()
        read = data.get("verdict")
        verdict: dict[str, Any] = read if isinstance(read, dict) else {}
        decision = Decision.from_json(verdict)
        said = verdict.get("said")
        if decision is None and set(verdict) - {"said"}:  # an older or odd verdict: kept whole, as read
            said = None
        spread, workload = (
            RelativeSpread.from_json(data.get("relative_spread")),
            Workload.from_json(data.get("workload")),
        )
        per_round = data.get("per_round_ms")
        rounds, failed = data.get("rounds"), data.get("failed")
        known = {*MEASURED_KEYS, "rounds", "timed_seconds", "workload", "failed", "credit", "seconds", "operations"}
        # a spread or a workload that is not one this grader writes is kept as read
        known -= {name for name, value in (("relative_spread", spread), ("workload", workload)) if value is None}
        if said is not None or decision is not None:
            known.add("verdict")
        if decision is not None:
            known.add("relative_interval")  # made from the decision
        return cls(
            speedup=_number(data.get("speedup")),
            reference_speedup=_number(data.get("reference_speedup")),
            relative=_number(data.get("relative")),
            relative_spread=spread,
            ms_per_call=_numbers(data.get("ms_per_call")),
            per_round_ms=per_round if isinstance(per_round, dict) else None,
            rounds=rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else None,
            timed_seconds=_number(data.get("timed_seconds")),
            decision=decision,
            workload=workload,
            failed=failed if isinstance(failed, str) else None,
            credit=_number(data.get("credit")),
            seconds=_number(data.get("seconds")),
            said=said if isinstance(said, str) else None,
            operations=_operations(data.get("operations")),
            kept={k: v for k, v in data.items() if k not in known},
        )


def _operations(value: object) -> dict[str, dict[str, int]] | None:
    """Operation counts by target as read back: a dict of dicts of whole counts, else absent."""
    if not isinstance(value, dict):
        return None
    counts = {}
    for target, ops in value.items():
        if not (isinstance(ops, dict) and all(type(n) is int for n in ops.values())):
            return None
        counts[str(target)] = {str(k): n for k, n in ops.items()}
    return counts


@dataclass(frozen=True)
class SpeedFigures:
    """The speed part's measurements in one grading: where and how it timed, the bands it scored with, each
    workload's figures, and the headline figures (the geometric means over the workloads measured; None
    when none was)."""

    device: str | None = None
    threads: int | None = None
    bands: SpeedBands | None = None
    workloads: dict[str, WorkloadFigures] = field(default_factory=dict)
    speedup: float | None = None
    reference_speedup: float | None = None
    relative: float | None = None
    kept: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.device is not None:
            data["device"] = self.device
        if self.threads is not None:
            data["threads"] = self.threads
        if self.bands is not None:
            data["bands"] = self.bands.to_json()
        data["workloads"] = {name: figures.to_json() for name, figures in self.workloads.items()}
        data.update(speedup=self.speedup, reference_speedup=self.reference_speedup, relative=self.relative)
        return {**data, **self.kept}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpeedFigures:
        device, threads, workloads = data.get("device"), data.get("threads"), data.get("workloads")
        known = {"device", "threads", "bands", "workloads", "speedup", "reference_speedup", "relative"}
        return cls(
            device=device if isinstance(device, str) else None,
            threads=threads if isinstance(threads, int) and not isinstance(threads, bool) else None,
            bands=SpeedBands.from_json(data.get("bands")),
            workloads={
                str(name): WorkloadFigures.from_json(figures)
                for name, figures in (workloads.items() if isinstance(workloads, dict) else ())
            },
            speedup=_number(data.get("speedup")),
            reference_speedup=_number(data.get("reference_speedup")),
            relative=_number(data.get("relative")),
            kept={k: v for k, v in data.items() if k not in known},
        )


@dataclass(frozen=True)
class GradingRun:
    """One grading of one submission, made once where the grading ends (`grade.grade_submission`, from what its
    steps returned) or read back from results.json (`from_gradescope`); a copy with a field changed is
    `dataclasses.replace`'s."""

    status: RunStatus
    submission: str
    device: str = ""
    isolation: str = ""
    sandbox: dict[str, str] = field(default_factory=dict)  # what held the worker in, in words
    seed: int | None = None
    torch: str = ""
    visible_only: bool = False
    reason: str = ""  # why it could not grade, in words
    cannot_grade_cause: str = (
        ""  # why it could not grade, by name, where known (TIMING_LOCK); results.json only has it then
    )
    checks: list[CheckResult] = field(default_factory=list)
    load: LoadReport = field(default_factory=LoadReport)
    events: list[str] = field(default_factory=list)  # what happened to the worker (hangs, crashes)
    student_output: str = ""  # what the submission printed, truncated
    execution_time: float = 0.0
    worker_starts: int = 0
    resources: dict[str, float] = field(default_factory=dict)  # peak memory (MiB) and CPU seconds used
    speed: SpeedFigures | None = None  # the speed part's measurements, when it ran
    flags: list[str] = field(default_factory=list)  # for the instructor: e.g. an implausible speedup
    grader_errors: list[str] = field(default_factory=list)  # why the grader failed (never the student's)
    titles: dict[str, str] = field(default_factory=dict)  # part id -> the rubric's title
    machine: dict[str, str] = field(default_factory=dict)  # what this machine allows (sandbox.machine.survey)

    @property
    def graded(self) -> bool:
        return self.status == GRADED

    @property
    def score(self) -> float:
        return add_points(c.score for c in self.checks) if self.graded else 0.0

    @property
    def max_score(self) -> float:
        return add_points(c.max_score for c in self.checks) if self.graded else 0.0

    def parts(self) -> list[PartResult]:
        """Per part, in the fixed part order: totals and the first failed check."""
        titles = self.titles
        by_part: dict[str, list[CheckResult]] = {}
        for check in self.checks:
            by_part.setdefault(check.part, []).append(check)
        order = {p: i for i, p in enumerate(PART_IDS)}
        results = []
        for part in sorted(by_part, key=lambda p: order.get(p, len(order))):
            checks = by_part[part]
            results.append(
                PartResult(
                    part=part,
                    title=titles.get(part, part),
                    score=add_points(c.score for c in checks),
                    max_score=add_points(c.max_score for c in checks),
                    passed=sum(c.passed_cases for c in checks),
                    total=sum(c.case_count for c in checks),
                    first_failure=next(
                        (c for c in checks if c.status == FAILED),
                        next((c for c in checks if c.status == NOT_CREDITED), None),
                    ),
                )
            )
        return results

    def not_done(self) -> list[str]:
        """The parts not done yet: a check of theirs met a stub or an answer left None (`NOT_DONE_MISTAKES`)."""
        found = {c.part for c in self.checks if c.status == FAILED and c.mistake in NOT_DONE_MISTAKES}
        return [p.part for p in self.parts() if p.part in found]

    def diagnosis(self, part: PartResult, may_show: Callable[[CheckResult], bool] = lambda check: True) -> str:
        """A part's first mistake in the student's terms: the mistake its first failed check that may be shown
        names, else that check's first sentence saying something of its own (not the count of its cases); ""
        when every failed check of the part is withheld."""
        failure = next((c for c in self.checks if c.part == part.part and c.status == FAILED and may_show(c)), None)
        if failure is None:
            return ""
        if failure.mistake:
            return failure.mistake
        lines = [line for line in failure.message.splitlines() if line.strip()]
        own = [line for line in lines if not (COUNTED_CASES.match(line) or CASE_LIST.fullmatch(line))]
        said = CASE_LABEL.sub("", own[0] if own else failure.name)
        return said.split(". ", 1)[0].rstrip(".")  # its first sentence: the explanation follows on the page

    def headline(self, may_show: Callable[[CheckResult], bool] = lambda check: True) -> str:
        """The one line to read first: the file could not be loaded; or each part that lost points for a
        mistake of its own, that mistake in the student's terms (never an error raised elsewhere), then the parts
        not done yet. `may_show`: the checks whose details the reader may see (a feedback page's rule)."""
        if self.load.problem:
            return f"Your file could not be loaded: {self.load.problem}"
        not_done = self.not_done()
        said = []
        for part in self.parts():
            if part.part in not_done or not any(c.part == part.part and c.status == FAILED for c in self.checks):
                continue
            diagnosis = self.diagnosis(part, may_show)
            said.append(f"{part.title}: {diagnosis or 'points lost in checks whose details are not shown yet'}")
        if not_done:
            said.append(f"{NOT_DONE_YET}: " + "; ".join(self.titles.get(part, part) for part in not_done))
        return ". ".join(said)

    def output_text(self) -> str:
        """results.json's top-level `output`: what happened, for the student."""
        if not self.graded:
            return f"This submission could not be graded: {self.reason}"
        lines = [f"Isolation: {self.isolation}."] + self.load.lines()
        lines += [f"Worker: {event}" for event in dict.fromkeys(self.events)]
        if self.student_output.strip():
            lines.append("What your code printed (truncated):\n" + self.student_output.strip())
        return "\n".join(lines)

    # -- the edge: Gradescope's results.json
    def to_gradescope(self) -> dict[str, Any]:
        tests = [
            {
                "name": f"{c.part}: {c.name}",
                "number": str(number),
                "score": hundredths(c.score) / HUNDREDTHS,
                "max_score": hundredths(c.max_score) / HUNDREDTHS,
                "status": PASSED if c.status in (PASSED, NOT_CHARGED) else FAILED,
                "output": c.message,
                "visibility": c.visibility,
                "tags": [c.part, c.key]
                + (["worker-reported"] if c.evidence == WORKER else [])
                + ([NOT_CREDITED_TAG] if c.status == NOT_CREDITED else [])
                + ([NOT_CHARGED_TAG] if c.status == NOT_CHARGED else []),
                **({"extra_data": extra_of(c)} if c.cases or c.mistake else {}),
            }
            for number, c in enumerate(self.checks, start=1)
        ]
        extra = {k: v for k, v in asdict(self).items() if k not in ("checks", "execution_time")}
        extra["speed"] = self.speed.to_json() if self.speed is not None else None
        if not self.cannot_grade_cause:
            del extra["cannot_grade_cause"]
        extra["model_version"] = MODEL_VERSION
        results = {
            "score": self.score,
            "max_score": self.max_score,
            "execution_time": round(self.execution_time, 2),
            "output": self.output_text(),
            "output_format": "text",
            "visibility": "visible",
            "stdout_visibility": "hidden",
            "tests": tests,
            "extra_data": extra,
        }
        if self.speed is not None and self.speed.speedup is not None:
            results["leaderboard"] = [
                {"name": "speedup over the wrapper", "value": round(self.speed.speedup, 3), "order": "desc"}
            ]
        return clean_strings(results)  # the file's name, and messages quoting it, are the student's

    @classmethod
    def from_gradescope(cls, data: dict[str, Any]) -> GradingRun:
        """Read a results.json written by `to_gradescope` back into the model, every string cleaned
        (`clean_strings`): the file may have been written by anyone."""
        data = clean_strings(data)
        extra = data.get("extra_data") or {}
        if extra.get("model_version") != MODEL_VERSION:
            raise ValueError("not a results.json written by this grader (no model_version in extra_data)")
        load = extra.get("load") or {}
        checks = []
        for test in data.get("tests", []):
            part, key = test["tags"][0], test["tags"][1]
            cases = test.get("extra_data") or {}
            credited = not ({NOT_CREDITED_TAG, *OLD_NOT_CREDITED_TAGS} & set(test["tags"]))
            status = test["status"] if credited else NOT_CREDITED
            if NOT_CHARGED_TAG in test["tags"]:
                status = NOT_CHARGED
            checks.append(
                CheckResult(
                    key=key,
                    part=part,
                    name=test["name"].split(": ", 1)[-1],
                    status=status,
                    score=float(test["score"]),
                    max_score=float(test["max_score"]),
                    message=test.get("output", ""),
                    visibility=test.get("visibility", "visible"),
                    evidence=WORKER if "worker-reported" in test["tags"] else GRADER,
                    cases=list(cases.get("cases", [])),
                    failed_cases=list(cases.get("failed_cases", [])),
                    mistake=str(cases.get("mistake", "")),
                )
            )
        fields = {k: v for k, v in extra.items() if k in cls.__dataclass_fields__ and k not in ("load", "speed")}
        speed = extra.get("speed")
        return cls(
            **fields,
            speed=SpeedFigures.from_json(speed) if isinstance(speed, dict) and speed else None,
            checks=checks,
            load=LoadReport(
                load.get("problem"),
                [CellProblem(**c) for c in load.get("cells", [])],
                load.get("defined", {}),
                {str(k): str(v) for k, v in (load.get("cell_parts") or {}).items()},
            ),
            execution_time=float(data.get("execution_time", 0.0)),
        )


def write_results(out: Path, run: GradingRun, mode: int = 0o644) -> None:
    """results.json, atomically (`atomic.open_atomically`: a temporary file renamed over the old one), readable
    by feedback tools (`mode`: a class's record is private to the grader's user and group): a reader, or a
    kill at any moment, finds the old file or the new, never half of one."""
    with open_atomically(Path(out), mode) as handle:
        json.dump(run.to_gradescope(), handle, indent=2, ensure_ascii=False)
        handle.write("\n")


def write_unfinished(out: Path, submission: str) -> None:
    """The placeholder results.json a grading writes before anything else (`UNFINISHED`, cannot grade): a
    grader killed at any later moment leaves it, or its own full results, never an older run's score."""
    write_results(out, GradingRun(status=CANNOT_GRADE, submission=submission, reason=UNFINISHED))


def extra_of(check: CheckResult) -> dict[str, Any]:
    """A row's own fields that Gradescope's format has no place for (its test's `extra_data`)."""
    extra: dict[str, Any] = {}
    if check.cases:
        extra.update(cases=check.cases, failed_cases=check.failed_cases)
    if check.mistake:
        extra["mistake"] = check.mistake
    return extra
