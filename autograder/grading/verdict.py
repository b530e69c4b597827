"""The speed part's verdict: a confidence interval for the median relative speedup, taken in batches of rounds
until it settles the credit.

Each measured round gives one relative speedup (the submission's speedup over the wrapper as a fraction of
the reference's, `timing.summarize`); the score is the credit of their median. After `min_rounds` rounds, and
then after every `batch_rounds` more, the caller asks `decide` whether the rounds so far settle the credit:

- the interval lies entirely at or above `full_credit_at`: full points ("full");
- entirely at or below `no_credit_at`: none ("none");
- the credit it implies varies by at most `settle_points` points ("settled"), which is how a submission
  near an edge of the band stops early (an interval from 0.745 to 0.80 is between 97.5 % and 100 % of the
  points);
- otherwise measure another batch, up to `max_rounds`; there the median is scored and the verdict says it
  was close ("max_rounds").

Whatever the reason, the credit is that of the median of all the rounds taken (for "full" and "none" the
whole interval agrees with it).

The interval: order statistics, not a bootstrap. Between the k-th smallest and the k-th largest of n rounds
lies the true median of the rounds' distribution unless fewer than k rounds fall on one side of it; the
count of rounds below the median is a fair coin's count whatever the distribution, so the interval's error,
2 P(Binomial(n, 1/2) < k), is exact and distribution-free (it assumes only rounds that are independent
draws of one continuous distribution, which the interleaved rounds aim at). That matters here: timing noise
is heavy-tailed and lopsided (a round that the machine interrupts is slow, never fast), where intervals built
on a mean and a standard error, or on a normal approximation, are wrong, and one wild round moves an
order-statistics interval by one rank and no further. A bootstrap gives no exact error at the handful of
rounds a clear case takes (the bootstrap distribution of a median of 5 values has 5 points), needs a fixed
seed to give the same verdict twice, and its error under repeated looks has no closed form. Order statistics
give the same verdict for the same rounds with no randomness at all.

Repeated looks: asking after every batch gives the data as many chances to mislead as there are looks, so
each look's interval is wider than a single look's would be, and the error of the whole sequence is computed
exactly rather than bounded. The count of rounds below the true median is a fair coin's random walk, so the
chance that the interval misses the median at one look or more is a sum over the walk's paths, which a small
dynamic program gives exactly for any choice of ranks (`family_error`). The error, 1 - confidence, is spent
as in Lan and DeMets's error spending, in its exact discrete form (`plan`):

- the first look, where most verdicts end (every clear case whose rounds all agree), may spend two thirds
  of it: its rank is the largest whose error fits (with few rounds, rank 1: from the slowest round to the
  fastest, an error of 2^(1 - n); so at confidence 0.9 the first look needs at least 5 rounds);
- the rest is spent evenly over the later looks: at each, the largest rank for which the exact error of
  the looks so far stays within what they may have spent by then (what one look leaves unspent, a later
  one may use). A later look never takes a smaller rank than an earlier one, at no cost: the count below
  the median only grows, so such a look could only miss where an earlier one had.

Every look's interval holds the median together with every other look's with probability at least the
confidence, so the interval reported holds it with that probability whatever rule stopped the rounds. The
exact sum matters: a Bonferroni split (the error divided by the number of looks) would leave the first look
no bounded interval at 5 rounds, and give the last look about half the error this plan gives it, because
looks at nested data mostly miss together (the split's real error is a fifth of what it budgets).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from fractions import Fraction
from functools import cache, lru_cache
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from autograder.model import Decision


class VerdictSettings(Protocol):
    """The rubric's `[speed]` settings the verdict reads (`rubric.SpeedSettings` has them all): named here, so
    that the rubric, which imports this module to check its plan, is not imported back."""

    @property
    def confidence(self) -> float: ...
    @property
    def min_rounds(self) -> int: ...
    @property
    def batch_rounds(self) -> int: ...
    @property
    def max_rounds(self) -> int: ...
    @property
    def settle_points(self) -> float: ...
    @property
    def full_credit_at(self) -> float: ...
    @property
    def no_credit_at(self) -> float: ...


Reason = Literal["full", "none", "settled", "max_rounds", "cut_short", "capped"]
LARGEST_MAX_ROUNDS = 200  # the plan's exact error takes time quadratic in this; no grading needs more rounds
FIRST_LOOK_SHARE = Fraction(2, 3)  # of the error, 1 - confidence: what the first look may spend


class PlanError(ValueError):
    """Settings under which the verdict could never conclude (the rubric reports it as a RubricError)."""


def credit(relative: float, no_credit_at: float, full_credit_at: float) -> float:
    """The fraction of the speed part's points for a speedup that is `relative` of the reference's: none
    at or below `no_credit_at`, all from `full_credit_at`, linear in between."""
    if relative >= full_credit_at:
        return 1.0
    if relative <= no_credit_at:
        return 0.0
    return (relative - no_credit_at) / (full_credit_at - no_credit_at)


# -- the plan: when to look, and which order statistics bound the interval at each look ---------------------


@dataclass(frozen=True)
class Plan:
    """`looks`: the numbers of measured rounds after which the verdict is asked; `ranks`: per look, the rank
    k of its interval, from the k-th smallest round to the k-th largest; `error`: the exact probability that
    the interval misses the median at one look or more (at most 1 - confidence)."""

    looks: tuple[int, ...]
    ranks: tuple[int, ...]
    error: float

    def rank(self, rounds: int) -> int:
        """The rank of the last look at or before `rounds` rounds (0 before the first look)."""
        return max((k for look, k in zip(self.looks, self.ranks) if look <= rounds), default=0)


def look_schedule(min_rounds: int, batch_rounds: int, max_rounds: int) -> tuple[int, ...]:
    """After `min_rounds`, then every `batch_rounds` more, and at `max_rounds` (the last batch may be short)."""
    return (*range(min_rounds, max_rounds, batch_rounds), max_rounds)


@cache
def _below(n: int) -> tuple[int, ...]:
    """_below(n)[j]: how many of the 2^n sequences of n rounds have at most j rounds below the median."""
    counts = [math.comb(n, j) for j in range(n + 1)]
    return tuple(sum(counts[: j + 1]) for j in range(n + 1))


def single_look_error(n: int, rank: int) -> Fraction:
    """The exact probability that [k-th smallest, k-th largest] of n rounds misses the median: fewer than k
    rounds on one side of it, 2 P(Binomial(n, 1/2) <= k - 1). Rank 0 is the unbounded interval."""
    return Fraction(2 * _below(n)[rank - 1], 2**n) if rank else Fraction(0)


class _Walk:
    """The count of rounds below the median, a fair coin's walk: `alive[s]` is how many of the 2^rounds
    sequences reach count s without the interval having missed the median at any look so far."""

    def __init__(self) -> None:
        self.alive, self.rounds, self.missed = [1], 0, Fraction(0)

    def advance(self, rounds: int) -> None:
        while self.rounds < rounds:
            self.alive = [a + b for a, b in zip([0, *self.alive], [*self.alive, 0])]
            self.rounds += 1

    def outside(self, rank: int) -> list[int]:
        """The counts at which the interval of this rank misses: below `rank`, or above rounds - rank."""
        return [*range(rank), *range(self.rounds - rank + 1, self.rounds + 1)] if rank else []

    def miss(self, rank: int) -> Fraction:
        """The probability of missing first at a look here with this rank."""
        return Fraction(sum(self.alive[s] for s in self.outside(rank)), 2**self.rounds)

    def look(self, rank: int) -> None:
        self.missed += self.miss(rank)
        for s in self.outside(rank):
            self.alive[s] = 0


def family_error(looks: Sequence[int], ranks: Sequence[int]) -> Fraction:
    """The exact probability that the interval misses the median at one or more of the looks."""
    walk = _Walk()
    for look, rank in zip(looks, ranks):
        walk.advance(look)
        walk.look(rank)
    return walk.missed


def _spendable(error: Fraction, look: int, looks: int) -> Fraction:
    """How much of the error the looks up to this one (counted from 0) may have spent in all."""
    if looks == 1:
        return error
    return error * (FIRST_LOOK_SHARE + (1 - FIRST_LOOK_SHARE) * Fraction(look, looks - 1))


def smallest_min_rounds(confidence: float, single_look: bool = False) -> int:
    """The fewest rounds whose widest interval (slowest to fastest round) the first look may use: its
    error, 2^(1 - n), within what the first look may spend."""
    allowed = _spendable(1 - Fraction(str(confidence)), 0, 1 if single_look else 2)
    n = 1
    while single_look_error(n, 1) > allowed:
        n += 1
    return n


@lru_cache(maxsize=64)
def plan(confidence: float, min_rounds: int, batch_rounds: int, max_rounds: int) -> Plan:
    """The looks and their ranks (see the module's docstring). Raises PlanError for settings under which no
    verdict could be reached at the first look, or that need more rounds than LARGEST_MAX_ROUNDS."""
    if not 0 < confidence < 1:
        raise PlanError(f"confidence must lie strictly between 0 and 1, not {confidence!r}")
    if batch_rounds < 1:
        raise PlanError(f"batch_rounds must be at least 1, not {batch_rounds!r}")
    if not 1 <= min_rounds <= max_rounds:
        raise PlanError(f"needs 1 <= min_rounds <= max_rounds; min_rounds = {min_rounds}, max_rounds = {max_rounds}")
    if max_rounds > LARGEST_MAX_ROUNDS:
        raise PlanError(f"max_rounds = {max_rounds} is more than the {LARGEST_MAX_ROUNDS} any grading may take")
    error = 1 - Fraction(str(confidence))
    looks = look_schedule(min_rounds, batch_rounds, max_rounds)
    walk = _Walk()
    ranks: list[int] = []
    for index, n in enumerate(looks):
        walk.advance(n)
        allowed = _spendable(error, index, len(looks))
        rank = ranks[-1] if ranks else 0  # a smaller rank than an earlier look's could only miss where it did
        while rank < (n + 1) // 2 and walk.missed + walk.miss(rank + 1) <= allowed:
            rank += 1
        if rank == 0:
            raise PlanError(
                f"min_rounds = {min_rounds} can never settle a verdict at confidence {confidence:g}: even the "
                f"widest interval, from the slowest round to the fastest, misses the median with probability "
                f"2^(1 - {min_rounds}) = {2.0 ** (1 - min_rounds):.3g}, more than the first look may spend "
                f"({float(allowed):.3g}); use min_rounds >= {smallest_min_rounds(confidence, len(looks) == 1)} "
                "or a lower confidence"
            )
        walk.look(rank)
        ranks.append(rank)
    return Plan(looks, tuple(ranks), float(walk.missed))


def settings_plan(settings: VerdictSettings) -> Plan:
    return plan(settings.confidence, settings.min_rounds, settings.batch_rounds, settings.max_rounds)


def next_look(rounds: int, settings: VerdictSettings) -> int | None:
    """After how many measured rounds in all to ask `decide` next, given `rounds` so far (None: past the last)."""
    return next((look for look in settings_plan(settings).looks if look > rounds), None)


# -- the verdict ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """What the rounds showed: the median relative speedup and its interval (`low`, `high`, at the stated
    `confidence` for the whole sequence of looks), how many rounds, why they stopped, the credit (a fraction
    of `points`, the points this verdict decides) and whether it was close (no rule settled it)."""

    median: float
    low: float
    high: float
    rounds: int
    stopped_because: Reason
    credit: float
    close: bool
    points: float
    confidence: float

    @property
    def earned(self) -> float:
        return self.credit * self.points

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def decision(self) -> Decision:
        """What results.json records of the verdict that stopped a workload's rounds."""
        from autograder.model import Decision  # here: the rubric imports this module, and nothing more with it

        return Decision(
            self.median, self.low, self.high, self.confidence, self.rounds, self.stopped_because, self.close
        )


def _interval(relatives: Sequence[float], rank: int) -> tuple[float, float]:
    ordered = sorted(relatives)
    return ordered[rank - 1], ordered[len(ordered) - rank]


def _rule(low: float, high: float, settings: VerdictSettings, points: float) -> Reason | None:
    """Which rule, if any, the interval settles the credit by."""
    if low >= settings.full_credit_at:
        return "full"
    if high <= settings.no_credit_at:
        return "none"
    bands = (settings.no_credit_at, settings.full_credit_at)
    if (credit(high, *bands) - credit(low, *bands)) * points <= settings.settle_points:
        return "settled"
    return None


def _verdict(
    relatives: Sequence[float], low: float, high: float, reason: Reason, settings: VerdictSettings, points: float
) -> Verdict:
    median = statistics.median(relatives)
    return Verdict(
        median=median,
        low=low,
        high=high,
        rounds=len(relatives),
        stopped_because=reason,
        credit=credit(median, settings.no_credit_at, settings.full_credit_at),
        close=reason in ("max_rounds", "cut_short"),
        points=points,
        confidence=settings.confidence,
    )


def decide(relatives: Sequence[float], settings: VerdictSettings, points: float) -> Verdict | None:
    """The verdict after the rounds so far, or None to measure the next batch (see `next_look`). `points`:
    the points the verdict decides (the part's, or its share of them when it has several workloads). Asked
    only at the plan's looks: the error it promises counts those and no others (ValueError otherwise). At
    `max_rounds` it always returns a verdict."""
    schedule = settings_plan(settings)
    n = len(relatives)
    if n not in schedule.looks:
        raise ValueError(f"the verdict is asked after {n} rounds; it may be asked after {schedule.looks} only")
    low, high = _interval(relatives, schedule.rank(n))
    reason = _rule(low, high, settings, points)
    if reason is None and n < settings.max_rounds:
        return None
    return _verdict(relatives, low, high, reason or "max_rounds", settings, points)


def final(relatives: Sequence[float], settings: VerdictSettings, points: float) -> Verdict:
    """The verdict on whatever rounds were taken, when the rounds must stop (at least one round): `decide`'s
    at one of its looks; otherwise the interval of the last look reached, on all the rounds (more rounds at
    the same rank only widen its coverage), or before the first look the range of the rounds (no rule is
    applied to it). When no rule settles it, the median is scored and the verdict is close: "max_rounds" at
    or past `max_rounds`, "cut_short" before."""
    if not relatives:
        raise ValueError("a verdict needs at least one round")
    schedule, n = settings_plan(settings), len(relatives)
    rank = schedule.rank(n)
    low, high = _interval(relatives, max(rank, 1))
    reason = _rule(low, high, settings, points) if rank else None
    if reason is None:
        reason = "max_rounds" if n >= settings.max_rounds else "cut_short"
    return _verdict(relatives, low, high, reason, settings, points)


def capped(relatives: Sequence[float], settings: VerdictSettings, points: float) -> Verdict:
    """The verdict when the grading's timing holds reached the rubric's cap (`hold_seconds`) before the rounds
    settled the credit: `final`'s, but an unsettled one is credited the top of its interval, not the median
    (the cap is the grader's choice, never the submission's doing, so its doubt is the submission's benefit),
    and said to be close ("capped")."""
    said = final(relatives, settings, points)
    if said.stopped_because not in ("max_rounds", "cut_short"):
        return said
    top = credit(said.high, settings.no_credit_at, settings.full_credit_at)
    return replace(said, stopped_because="capped", credit=max(said.credit, top))


def describe(verdict: Verdict, settings: VerdictSettings) -> str:
    """The verdict in a student's words."""
    v = verdict
    said = (
        f"your forward is {v.median:.2f} of the reference's speedup ({v.low:.2f} to {v.high:.2f} with "
        f"{v.confidence:.0%} confidence, {v.rounds} rounds)"
    )
    points = f"{v.earned:.3g} of {v.points:g} points"
    if v.stopped_because == "full":
        return f"{said}: full points (all of the interval at or above {settings.full_credit_at:g})"
    if v.stopped_because == "none":
        return f"{said}: no points (all of the interval at or below {settings.no_credit_at:g})"
    if v.stopped_because == "settled":
        return (
            f"{said}: {points}, scored on the median; anywhere in the interval would change that by at most "
            f"{settings.settle_points:g} points"
        )
    if v.stopped_because == "max_rounds":
        return f"{said}: the verdict was close after {v.rounds} rounds, scored on the median: {points}"
    if v.stopped_because == "capped":
        return (
            f"{said}: the timing reached its time limit before the verdict was clear, so it was scored on the top "
            f"of the interval, the benefit of the doubt: {points}"
        )
    return f"{said}: the rounds stopped before the verdict was clear, scored on the median: {points}"
