"""The speed part's sequential verdict (`grading/verdict.py`): its plan's exact error, its stopping rules on
constructed rounds, and, on seeded simulations of heavy-tailed and lopsided timing noise with a known median,
its coverage, its cost in rounds and the spread of its credit against the old fixed 21-round median.

Every simulation draws from `random.Random(seed).random()` (whose sequence Python keeps stable) through
closed-form inverse distribution functions, so each count below is the same on every run and machine; the
bounds asserted sit well clear of the counts."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
import statistics
from fractions import Fraction

import pytest

from autograder.grading import verdict
from autograder.rubric import load_rubric

SPEED = load_rubric().speed
POINTS = load_rubric().part_points("speed")
ERROR = 1 - SPEED.confidence


def settings(**changes):
    return dataclasses.replace(SPEED, **changes)


# -- the plan ------------------------------------------------------------------------------------------------


def misses_by_enumeration(plan) -> Fraction:
    """The plan's error counted over every sequence of rounds above and below a median of 1.0: the fraction of
    the 2^n orderings for which the interval (as `final` reports it at each look) misses 1.0 at some look."""
    n = plan.looks[-1]
    rule = settings(confidence=0.75, min_rounds=plan.looks[0], batch_rounds=plan.looks[1] - plan.looks[0], max_rounds=n)
    assert verdict.settings_plan(rule) == plan
    missed = 0
    for signs in itertools.product((-1, 1), repeat=n):
        rounds = [1.0 + sign * (i + 1) / 100 for i, sign in enumerate(signs)]
        views = (verdict.final(rounds[:look], rule, POINTS) for look in plan.looks)
        missed += any(not v.low <= 1.0 <= v.high for v in views)
    return Fraction(missed, 2**n)


def test_the_plans_error_is_the_exact_chance_of_missing_at_any_look():
    plan = verdict.plan(0.75, 4, 2, 12)  # 2^12 orderings
    assert plan.looks == (4, 6, 8, 10, 12)
    exact = verdict.family_error(plan.looks, plan.ranks)
    assert misses_by_enumeration(plan) == exact
    assert float(exact) == plan.error <= 0.25


@pytest.mark.parametrize("confidence", [0.8, 0.9, 0.95, 0.99])
@pytest.mark.parametrize("min_rounds,batch_rounds,max_rounds", [(9, 1, 9), (9, 1, 40), (9, 3, 35), (12, 5, 100)])
def test_every_plan_keeps_its_error_within_one_minus_confidence(confidence, min_rounds, batch_rounds, max_rounds):
    plan = verdict.plan(confidence, min_rounds, batch_rounds, max_rounds)
    assert plan.looks[0] == min_rounds and plan.looks[-1] == max_rounds
    assert all(b - a == batch_rounds for a, b in zip(plan.looks, plan.looks[1:-1]))
    assert float(verdict.family_error(plan.looks, plan.ranks)) == plan.error <= 1 - confidence
    assert 1 <= plan.ranks[0] and list(plan.ranks) == sorted(plan.ranks)
    assert all(rank <= (look + 1) // 2 for look, rank in zip(plan.looks, plan.ranks))


def bonferroni_ranks(plan, error):
    """Per look, the narrowest interval whose single-look error is within error / (number of looks)."""
    share = Fraction(str(error)) / len(plan.looks)
    return [
        max((k for k in range(1, (n + 1) // 2 + 1) if verdict.single_look_error(n, k) <= share), default=0)
        for n in plan.looks
    ]


def test_the_exact_plan_beats_a_bonferroni_split_of_the_same_error():
    plan = verdict.settings_plan(SPEED)
    split = bonferroni_ranks(plan, ERROR)
    assert split[0] == 0  # the split cannot conclude at the first look at all
    assert all(mine >= theirs for mine, theirs in zip(plan.ranks, split))
    assert verdict.family_error(plan.looks, split) < ERROR / 3  # what the split really spends


def test_the_packaged_rubric_concludes_at_its_first_look():
    plan = verdict.settings_plan(SPEED)
    assert plan.looks[0] == SPEED.min_rounds and plan.ranks[0] == 1
    assert verdict.smallest_min_rounds(SPEED.confidence) == SPEED.min_rounds
    assert [verdict.next_look(n, SPEED) for n in (0, 4, 5, 6)] == [5, 5, 8, 8]
    assert verdict.next_look(SPEED.max_rounds, SPEED) is None


@pytest.mark.parametrize(
    "changes,message",
    [
        (dict(min_rounds=4), "min_rounds = 4 can never settle a verdict at confidence 0.9"),
        (dict(min_rounds=4), "use min_rounds >= 5"),
        (dict(confidence=0.99), "use min_rounds >= 9"),
        (dict(confidence=1.0), "strictly between 0 and 1"),
        (dict(confidence=0.0), "strictly between 0 and 1"),
        (dict(batch_rounds=0), "batch_rounds must be at least 1"),
        (dict(max_rounds=4), "needs 1 <= min_rounds <= max_rounds"),
        (dict(max_rounds=500), "more than the 200 any grading may take"),
    ],
)
def test_impossible_plans_are_refused(changes, message):
    rule = settings(**changes)
    with pytest.raises(verdict.PlanError, match=message.replace("(", r"\(")):
        verdict.plan(rule.confidence, rule.min_rounds, rule.batch_rounds, rule.max_rounds)


# -- the rules, on constructed rounds ------------------------------------------------------------------------


def test_a_clear_case_stops_at_the_first_look():
    twin = [0.93, 0.88, 0.97, 0.91, 0.95]
    full = verdict.decide(twin, SPEED, POINTS)
    assert full == verdict.Verdict(0.93, 0.88, 0.97, 5, "full", 1.0, False, POINTS, SPEED.confidence)
    loop = [0.18, 0.17, 0.19, 0.2, 0.18]
    assert verdict.decide(loop, SPEED, POINTS).stopped_because == "none"
    assert verdict.decide(loop, SPEED, POINTS).credit == 0.0


def test_one_slow_round_delays_full_points_until_a_look_can_set_it_aside():
    twin = [0.93, 0.88, 0.97, 0.71, 0.95]  # one round the machine interrupted
    assert verdict.decide(twin, SPEED, POINTS) is None
    more = [*twin, 0.92, 0.9, 0.94]
    assert verdict.decide(more, SPEED, POINTS) is None  # 8 rounds: still from the slowest to the fastest
    most = [*more, 0.96, 0.91, 0.9]
    assert verdict.settings_plan(SPEED).rank(11) == 2
    assert verdict.decide(most, SPEED, POINTS).stopped_because == "full"  # the 2nd slowest is 0.88


def test_a_narrow_interval_on_an_edge_settles_the_credit():
    near_full = [0.76, 0.745, 0.78, 0.8, 0.77]  # between 97.5 % and 100 % of the points
    settled = verdict.decide(near_full, SPEED, POINTS)
    assert (settled.stopped_because, settled.credit, settled.close) == ("settled", 1.0, False)
    near_none = [0.552, 0.545, 0.553, 0.554, 0.5]  # between none and 2 % of the points
    settled = verdict.decide(near_none, SPEED, POINTS)
    assert settled.stopped_because == "settled" and settled.credit == pytest.approx(0.01)
    middle = [0.649, 0.651, 0.6505, 0.6495, 0.65]
    settled = verdict.decide(middle, SPEED, POINTS)
    assert settled.stopped_because == "settled" and settled.credit == pytest.approx(0.5)
    # the same spread with a smaller settle_points, or more points at stake, does not settle
    assert verdict.decide(middle, settings(settle_points=0.05), POINTS) is None
    assert verdict.decide(near_full, SPEED, 100 * POINTS) is None


def test_a_wide_interval_in_the_band_runs_to_the_maximum_and_is_close():
    rounds = [0.6, 0.8] * 20
    looks = verdict.settings_plan(SPEED).looks
    assert all(verdict.decide(rounds[:n], SPEED, POINTS) is None for n in looks[:-1])
    close = verdict.decide(rounds[: SPEED.max_rounds], SPEED, POINTS)
    assert (close.stopped_because, close.close, close.rounds) == ("max_rounds", True, SPEED.max_rounds)
    assert close.median == 0.6 and close.credit == pytest.approx(0.25)  # 18 of the 35 rounds at 0.6


def test_the_verdict_is_asked_only_at_the_plans_looks():
    with pytest.raises(ValueError, match="after 6 rounds"):
        verdict.decide([0.9] * 6, SPEED, POINTS)


def test_a_measurement_cut_short_is_scored_on_the_median_and_says_so():
    early = verdict.final([0.9, 0.95, 0.97], SPEED, POINTS)  # before the first look: no rule applies
    assert (early.stopped_because, early.close, early.credit) == ("cut_short", True, 1.0)
    assert (early.low, early.high) == (0.9, 0.97)
    # between looks: the last look's rank, on every round taken
    between = verdict.final([0.93, 0.88, 0.97, 0.91, 0.95, 0.9], SPEED, POINTS)
    assert (between.stopped_because, between.low, between.high) == ("full", 0.88, 0.97)
    unsettled = verdict.final([0.6, 0.8] * 3, SPEED, POINTS)
    assert (unsettled.stopped_because, unsettled.close) == ("cut_short", True)
    assert verdict.final([0.6, 0.8] * 20, SPEED, POINTS).stopped_because == "max_rounds"
    with pytest.raises(ValueError, match="at least one round"):
        verdict.final([], SPEED, POINTS)


def test_the_verdict_in_a_students_words():
    full = verdict.Verdict(0.91, 0.88, 0.95, 5, "full", 1.0, False, 10.0, 0.9)
    assert verdict.describe(full, SPEED) == (
        "your forward is 0.91 of the reference's speedup (0.88 to 0.95 with 90% confidence, 5 rounds): "
        "full points (all of the interval at or above 0.75)"
    )
    none = verdict.Verdict(0.18, 0.17, 0.2, 5, "none", 0.0, False, 10.0, 0.9)
    assert verdict.describe(none, SPEED).endswith(": no points (all of the interval at or below 0.55)")
    settled = verdict.Verdict(0.76, 0.745, 0.8, 5, "settled", 1.0, False, 10.0, 0.9)
    assert ": 10 of 10 points, scored on the median; anywhere in the interval" in verdict.describe(settled, SPEED)
    close = verdict.Verdict(0.7, 0.66, 0.74, 35, "max_rounds", 0.75, True, 10.0, 0.9)
    assert verdict.describe(close, SPEED).endswith(
        "35 rounds): the verdict was close after 35 rounds, scored on the median: 7.5 of 10 points"
    )
    short = dataclasses.replace(close, stopped_because="cut_short", rounds=12)
    assert "the rounds stopped before the verdict was clear" in verdict.describe(short, SPEED)


def test_the_same_rounds_give_the_same_verdict():
    rng = random.Random(7)
    rounds = [0.75 * math.exp(two_piece_t(rng.random(), 0.04)) for _ in range(SPEED.max_rounds)]
    first = [verdict.decide(rounds[:n], SPEED, POINTS) for n in verdict.settings_plan(SPEED).looks]
    verdict.plan.cache_clear()
    again = [verdict.decide(list(rounds[:n]), SPEED, POINTS) for n in verdict.settings_plan(SPEED).looks]
    assert first == again and first[-1] is not None
    assert verdict.final(rounds, SPEED, POINTS) == verdict.final(rounds, SPEED, POINTS)


# -- simulated gradings: heavy-tailed, lopsided noise with a known median ------------------------------------
# Each draws the log of a round's relative speedup from a distribution whose median is exactly 0, so the
# rounds' median is the `true` relative speedup; below 0 it is wider or heavier (a slowed-down submission
# round), as on a busy machine.

NORMAL = statistics.NormalDist()


def two_piece_t(u: float, scale: float) -> float:
    """Student's t with 2 degrees of freedom (infinite variance), 1.6 times wider below its median."""
    t = (2 * u - 1) / math.sqrt(2 * u * (1 - u)) if 0 < u < 1 else 0.0
    return scale * t * (1.6 if t < 0 else 1.0)


def two_piece_exponential(u: float, scale: float) -> float:
    """A Laplace distribution, three times wider below its median."""
    return 3 * scale * math.log(2 * u) if u < 0.5 else -scale * math.log(2 * (1 - u))


def cauchy(u: float, scale: float) -> float:
    return scale * math.tan(math.pi * (u - 0.5)) / 2


def interrupted(u: float, scale: float) -> float:
    """Half-normal on each side, but a fifth of the rounds below the median were interrupted: 35 % slower or
    more (0.3 plus an exponential with mean 1, in the log)."""
    if u >= 0.5:
        return scale * NORMAL.inv_cdf(u)
    if u < 0.1:
        return -(0.3 - math.log(u / 0.1))
    return -scale * NORMAL.inv_cdf(0.5 + (u - 0.1) / 0.8)


NOISES = {"t2": two_piece_t, "laplace": two_piece_exponential, "cauchy": cauchy, "interrupted": interrupted}


def relative(true: float, log_noise: float) -> float:
    return true * math.exp(max(-50.0, min(50.0, log_noise)))  # clipped: a monotone map keeps the median


def grade(rng: random.Random, true: float, noise, scale: float = 0.04, rule=SPEED):
    """One simulated sequential grading, run as the timed loop runs it: measure up to the next look, ask.
    Returns the verdict and the rounds drawn."""
    rounds: list[float] = []
    while True:
        look = verdict.next_look(len(rounds), rule)
        rounds += [relative(true, noise(rng.random(), scale)) for _ in range(look - len(rounds))]
        found = verdict.decide(rounds, rule, POINTS)
        if found is not None:
            return found


def test_the_interval_misses_the_true_median_at_most_at_the_stated_rate():
    """The rate is the plan's promise for the whole sequence of looks; a clear case stops at the first look,
    which may spend two thirds of it, so its rate is about 1/16 (all 5 rounds on one side of the median)."""
    runs = 400
    misses = {}
    for (name, noise), true in itertools.product(NOISES.items(), (0.93, 0.76, 0.75, 0.65, 0.55, 0.18)):
        rng = random.Random(f"{name} {true}")
        misses[name, true] = sum(not v.low <= true <= v.high for v in (grade(rng, true, noise) for _ in range(runs)))
    assert max(misses.values()) <= ERROR * runs, misses  # at most 32 of 400 (t2 at 0.93)
    for name in NOISES:  # 101 to 120 of 2400
        assert sum(count for (noise, _), count in misses.items() if noise == name) <= 0.6 * ERROR * 6 * runs, misses


def simulated(true: float, gradings: int = 300, noise=two_piece_t):
    """`gradings` sequential verdicts, and the credit the old rule (the median of 21 rounds) gave the same
    draws: one seeded stream per grading, its first rounds shared by both."""
    verdicts, old = [], []
    for index in range(gradings):
        found = grade(random.Random(f"{true} {index}"), true, noise)
        rng = random.Random(f"{true} {index}")
        median = statistics.median(relative(true, noise(rng.random(), 0.04)) for _ in range(21))
        verdicts.append(found)
        old.append(verdict.credit(median, SPEED.no_credit_at, SPEED.full_credit_at) * POINTS)
    return verdicts, old


def test_clear_cases_usually_stop_at_the_first_look():
    for true, credit in ((0.93, 1.0), (0.18, 0.0)):
        verdicts, _ = simulated(true)
        at_first = sum(v.rounds == SPEED.min_rounds for v in verdicts)
        assert at_first >= 0.75 * len(verdicts), (true, at_first)  # 0.93: 238 of 300; 0.18: 299
        assert all(v.credit == credit and not v.close for v in verdicts)
        # mostly "full" or "none"; a few "settled" (an interval from 0.745 up is within 0.5 points of full)
        assert sum(v.stopped_because in ("full", "none") for v in verdicts) >= 0.95 * len(verdicts)


@pytest.mark.parametrize("edge", [0.75, 0.55])
def test_a_median_on_an_edge_runs_longer_and_ends_close_or_settled(edge):
    clear, _ = simulated(0.93 if edge == 0.75 else 0.18)
    verdicts, _ = simulated(edge)
    assert statistics.mean(v.rounds for v in verdicts) > 4 * statistics.mean(v.rounds for v in clear)
    ended = [v.stopped_because for v in verdicts]
    # full or none only when the interval missed the edge, which it does at most at the error rate
    assert ended.count("full") + ended.count("none") <= ERROR * len(verdicts), ended
    assert set(ended) <= {"full", "none", "settled", "max_rounds"}
    assert ended.count("max_rounds") >= len(verdicts) / 2


@pytest.mark.parametrize("true", [0.75, 0.65, 0.55])
def test_the_credit_varies_less_between_gradings_than_with_a_fixed_21_round_median(true):
    """Standard deviations of the points, new against old: 0.36 against 0.47 at 0.75, 0.41 against 0.50 at
    0.65, 0.16 against 0.23 at 0.55 (the median of up to 35 rounds, and verdicts settled within 0.5 points)."""
    verdicts, old = simulated(true)
    new = [v.earned for v in verdicts]
    assert statistics.pstdev(new) < 0.9 * statistics.pstdev(old), (statistics.pstdev(new), statistics.pstdev(old))
