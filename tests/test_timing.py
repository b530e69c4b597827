"""The speed part's logic, without timing anything real: statistics, bands, the CPU charge, the round protocol
(with fake workers and a fake clock), the probes, the device lock, the rubric's [speed], partial credit and
the gate on the mha part's values; and the worker's seeded `forward_many`, which is deterministic."""

from __future__ import annotations

import dataclasses
import itertools
import json
import re

import pytest
import torch

from autograder.grading import timing, verdict
from autograder.grading.scoring import Outcome, score
from autograder.grading.verdict import credit
from autograder.grading.workers import REFERENCE, SUBMISSION, WRAPPER, BackgroundWorker, reference_cells
from autograder.rubric import DEFAULT_RUBRIC, RubricError, load_rubric
from autograder.sandbox.client import SubmissionError
from autograder.sandbox.protocol import BuildRequest, DescribeRequest, ForwardManyRequest, TimedShown
from rubric_text import rubric_file

SPEED = load_rubric().speed
pytest_plugins = ["pytester"]


# -- bands, statistics, the CPU charge -------------------------------------------------------------------


@pytest.mark.parametrize("relative,expected", [(0.3, 0.0), (0.55, 0.0), (0.65, 0.5), (0.75, 1.0), (3.0, 1.0)])
def test_credit_is_linear_between_the_bands(relative, expected):
    assert credit(relative, 0.55, 0.75) == pytest.approx(expected)


def test_a_request_is_charged_its_own_time_not_the_machines():
    # one thread, busy all along, on a machine so loaded that it waited for a CPU 3/4 of the time
    assert timing.charge(wall=0.4, cpu=0.1, wait=0.3, threads=1) == pytest.approx(0.1)
    # the same, sleeping 50 ms as well: charged for the sleep
    assert timing.charge(wall=0.45, cpu=0.1, wait=0.3, threads=1) == pytest.approx(0.15)
    # two cores busy for 0.1 s where one was given: charged 0.2 s
    assert timing.charge(wall=0.1, cpu=0.2, wait=0.0, threads=1) == pytest.approx(0.2)
    assert timing.charge(wall=0.1, cpu=0.2, wait=0.0, threads=2) == pytest.approx(0.1)
    # threads made to wait (runnable, so wanting a CPU) cannot bring the charge below the CPU used
    assert timing.charge(wall=0.1, cpu=0.08, wait=5.0, threads=1) == pytest.approx(0.08)


def test_waits_count_only_threads_alive_before_and_after():
    assert timing.waited({1: 100, 2: 50}, {1: 400, 3: 10_000}) == pytest.approx(300e-9)
    assert timing.waited({1: 500}, {1: 100}) == 0  # never below zero


def test_a_charge_is_never_negative_nor_below_the_cpu_time():
    """Where no control group counted the CPU time of ended processes, a round's CPU time could fall (children
    killed in it took theirs away) while its threads' waits together exceeded its wall time: the charge was
    negative, and the statistics of it raised a math domain error (the grading could not grade)."""
    assert timing.charge(wall=0.3, cpu=-1.2, wait=0.7, threads=1) == pytest.approx(timing.MIN_CHARGE)
    assert timing.charge(wall=0.3, cpu=0.2, wait=0.7, threads=1) == pytest.approx(0.2)  # waits count up to the wall
    assert timing.charge(wall=0.3, cpu=-1.0, wait=-5.0, threads=1) == pytest.approx(0.3)  # negative waits: none
    assert timing.charge(wall=0.3, cpu=0.1, wait=0.25, threads=1) == pytest.approx(0.1)


def test_the_geometric_mean_of_figures_never_raises():
    assert timing.geometric_mean([2.0, 8.0]) == pytest.approx(4.0)
    for values in ([], [1.0, -0.5], [0.0], [float("nan"), 1.0], [float("inf")]):
        assert timing.geometric_mean(values) is None


def measurement(wrapper, reference, submission):
    return timing.Measurement({WRAPPER: wrapper, REFERENCE: reference, SUBMISSION: submission})


def test_summary_is_the_median_of_per_round_ratios():
    figures = timing.summarize(measurement([10.0, 12.0, 9.0], [2.0, 2.0, 3.0], [4.0, 2.0, 3.0])).to_json()
    # per round: the submission's speedup 2.5, 6, 3; the reference's 5, 6, 3; their ratio 0.5, 1, 1
    assert figures["speedup"] == pytest.approx(3.0)
    assert figures["reference_speedup"] == pytest.approx(5.0)
    assert figures["relative"] == pytest.approx(1.0)
    assert figures["relative_spread"]["min"] == pytest.approx(0.5)
    assert figures["rounds"] == 3


def test_the_reference_and_the_submission_take_turns_after_the_wrapper():
    names = [WRAPPER, REFERENCE, SUBMISSION]
    orders = [timing.round_order(names, i) for i in range(4)]
    assert all(order[0] == WRAPPER for order in orders)
    follows = {}
    for order in orders:
        for before, after in zip(order, order[1:]):
            follows[(before, after)] = follows.get((before, after), 0) + 1
    assert follows[(WRAPPER, REFERENCE)] == follows[(WRAPPER, SUBMISSION)]
    assert follows[(REFERENCE, SUBMISSION)] == follows[(SUBMISSION, REFERENCE)]


# -- the protocol, with fake workers and a fake clock --------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeWorker:
    """Records whether it is running; its CPU time grows by `cpu_per_second` per second it runs."""

    def __init__(self, name, clock, cpu_per_second=1.0):
        self.name, self.clock, self.cpu_per_second = name, clock, cpu_per_second
        self.running, self.cpu = True, 0.0
        self.events = []

    def suspend(self):
        self.running = False

    def resume(self):
        self.running = True

    def cpu_seconds(self):
        return self.cpu

    def thread_waits(self):
        return {}


class FakeCalls:
    """One timed request's calls on the fake clock: each takes `per_call` seconds and `cpu_per_second` CPU."""

    def __init__(self, worker, per_call, record):
        self.worker, self.per_call, self.record, self.seeds = worker, per_call, record, []

    def open(self):
        pass

    def call(self, seed):
        self.seeds.append(seed)
        self.worker.clock.now += self.per_call
        self.worker.cpu += self.per_call * self.worker.cpu_per_second
        return torch.zeros(1)

    def finish(self, show):
        self.record(self.seeds)
        return TimedShown([torch.zeros(1) for _ in show])


def fake_targets(clock, seconds_per_call, cpu_per_second=None, seen=None):
    """Targets whose forwards take `seconds_per_call[name]` each (on the fake clock); `seen` gets, per timed
    request, (name, the workers running, its seeds, its timeout)."""
    workers = {name: FakeWorker(name, clock, (cpu_per_second or {}).get(name, 1.0)) for name in seconds_per_call}
    targets = []
    for name, per_call in seconds_per_call.items():
        times = itertools.cycle(per_call if isinstance(per_call, list) else [per_call])  # per request, in turn

        def open_calls(calls, timeout, name=name, times=times):
            running = sorted(w.name for w in workers.values() if w.running)

            def record(seeds):
                if seen is not None:
                    seen.append((name, running, list(seeds), timeout))

            return FakeCalls(workers[name], next(times), record)

        calls = 1 if name == WRAPPER else 4
        targets.append(timing.Target(name, workers[name], open_calls, calls))
    return targets, workers


def test_only_the_timed_worker_runs_and_every_worker_is_resumed_after():
    clock, seen = Clock(), []
    targets, workers = fake_targets(clock, {WRAPPER: 0.05, REFERENCE: 0.01, SUBMISSION: 0.01}, seen=seen)
    result = timing.measure(targets, SPEED, itertools.count(), lambda answers: None, 10.0, clock=clock)
    assert all(running == [name] for name, running, _, _ in seen)
    assert all(w.running for w in workers.values())
    assert len(result.rounds[SUBMISSION]) == SPEED.min_rounds  # one rate every round: the first look settles
    assert result.verdict is not None and result.verdict.stopped_because == "full"
    assert result.rounds[SUBMISSION][0] == pytest.approx(0.01)  # seconds per call
    assert result.walls[WRAPPER][0] == pytest.approx(0.05)


def test_every_round_has_new_seeds_shared_by_the_three():
    clock, seen = Clock(), []
    targets, _ = fake_targets(clock, {WRAPPER: 0.05, REFERENCE: 0.01, SUBMISSION: 0.01}, seen=seen)
    timing.measure(targets, SPEED, itertools.count(), lambda answers: None, 10.0, clock=clock)
    by_round = [seen[i : i + 3] for i in range(0, len(seen), 3)]
    used = set()
    for round_ in by_round:
        seeds = {name: s for name, _, s, _ in round_}
        assert seeds[REFERENCE] == seeds[SUBMISSION]
        assert seeds[WRAPPER] == seeds[REFERENCE][:1]
        assert not used & set(seeds[REFERENCE])
        used |= set(seeds[REFERENCE])


@pytest.mark.parametrize(
    "submission,rounds,because",
    [
        (0.01, SPEED.min_rounds, "full"),  # as fast as the reference in every round
        (0.01 / 0.45, SPEED.min_rounds, "none"),  # 0.45 of its speed
        (0.01 / 0.65, SPEED.min_rounds, "settled"),  # 0.65 in every round: the interval is a point
        # from 0.55 to 0.75 of the reference's speed, in turn: no interval settles it
        ([0.01 / r for r in (0.55, 0.6, 0.65, 0.7, 0.75, 0.58, 0.72)], SPEED.max_rounds, "max_rounds"),
    ],
)
def test_the_rounds_stop_as_soon_as_the_verdict_is_settled(submission, rounds, because):
    clock = Clock()
    targets, _ = fake_targets(clock, {WRAPPER: 0.05, REFERENCE: 0.01, SUBMISSION: submission})
    result = timing.measure(targets, SPEED, itertools.count(), lambda answers: None, 10.0, clock=clock, points=10.0)
    assert result.verdict is not None
    assert (len(result.rounds[SUBMISSION]), result.verdict.stopped_because) == (rounds, because)
    assert result.verdict.close == (because == "max_rounds")
    figures = timing.summarize(result).to_json()  # as results.json writes them
    assert figures["rounds"] == rounds and figures["verdict"]["stopped_because"] == because
    assert figures["relative_interval"]["low"] <= figures["relative"] <= figures["relative_interval"]["high"]


def test_a_submission_using_two_cores_is_charged_for_them():
    clock = Clock()
    targets, _ = fake_targets(
        clock,
        {WRAPPER: 0.05, REFERENCE: 0.01, SUBMISSION: 0.006},
        cpu_per_second={SUBMISSION: 2.0},
    )
    result = timing.measure(targets, SPEED, itertools.count(), lambda answers: None, 10.0, clock=clock)
    assert result.cpus[SUBMISSION][0] == pytest.approx(0.012)
    assert result.rounds[SUBMISSION][0] == pytest.approx(0.012)  # charged its CPU time, not its wall time
    assert timing.summarize(result).relative == pytest.approx(0.01 / 0.012, rel=0.05)


def test_far_too_slow_gives_up_after_min_rounds_and_waits_little():
    clock, seen = Clock(), []
    targets, workers = fake_targets(clock, {WRAPPER: 0.05, REFERENCE: 0.001, SUBMISSION: 0.05}, seen=seen)
    with pytest.raises(timing.TooSlow, match="times slower"):
        timing.measure(targets, SPEED, itertools.count(), lambda answers: None, 10.0, clock=clock)
    assert len(seen) == 3 * (SPEED.warmup_rounds + SPEED.min_rounds)  # measured rounds first, no more
    assert all(w.running for w in workers.values())
    waits = [timeout for name, _, _, timeout in seen if name == SUBMISSION]
    assert waits[0] < 2.0  # bounded by the reference's time, not the 10 s request deadline


def test_a_slow_warm_up_alone_never_gives_up_on_a_forward():
    """A forward whose warm-up round was far slower than it is (its caches evicted by a busy machine) gets its
    measured rounds, and is judged by them: a correct notebook once got 90 instead of 100 here."""
    clock = Clock()
    slow_then_fast = [0.01 / (SPEED.give_up_below / 10)] + [0.01] * (SPEED.warmup_rounds + SPEED.max_rounds)
    targets, _ = fake_targets(clock, {WRAPPER: 0.05, REFERENCE: 0.01, SUBMISSION: slow_then_fast})
    result = timing.measure(targets, SPEED, itertools.count(), lambda answers: None, 10.0, clock=clock, points=10.0)
    assert result.warmup[SUBMISSION][0] > result.warmup[REFERENCE][0] / SPEED.give_up_below  # it would have
    assert result.verdict is not None and result.verdict.stopped_because == "full"
    assert result.verdict.credit == 1.0


def test_the_grading_cap_on_timing_holds_stops_the_rounds_in_the_students_favour():
    """A forward on an edge of the band would take every round up to max_rounds; past the rubric's cap on a
    grading's holds the rounds stop (never before min_rounds), and the unsettled verdict gets the credit of
    the top of its interval."""
    clock = Clock()
    noisy = [0.01 / r for r in (0.55, 0.6, 0.65, 0.7, 0.75, 0.58, 0.72)]
    targets, _ = fake_targets(clock, {WRAPPER: 0.05, REFERENCE: 0.01, SUBMISSION: noisy})
    per_round = 0.05 + 4 * 0.01 + 4 * 0.01 / 0.55  # at most, on the fake clock
    cap = (SPEED.warmup_rounds + SPEED.min_rounds + 4) * per_round
    result = timing.measure(
        targets, SPEED, itertools.count(), lambda answers: None, 10.0, clock=clock, points=10.0, hold_seconds=cap
    )
    said = result.verdict
    assert said is not None and said.stopped_because == "capped" and said.close
    assert SPEED.min_rounds < said.rounds < SPEED.max_rounds
    assert (
        said.credit
        == credit(said.high, SPEED.no_credit_at, SPEED.full_credit_at)
        > credit(said.median, SPEED.no_credit_at, SPEED.full_credit_at)
    )
    assert "benefit of the doubt" in verdict.describe(said, SPEED)
    # a cap already spent (by an earlier workload) still leaves min_rounds, for a verdict on a first look
    clock = Clock()
    targets, _ = fake_targets(clock, {WRAPPER: 0.05, REFERENCE: 0.01, SUBMISSION: noisy})
    result = timing.measure(
        targets, SPEED, itertools.count(), lambda answers: None, 10.0, clock=clock, points=10.0, hold_seconds=-1.0
    )
    assert result.verdict is not None and result.verdict.rounds == SPEED.min_rounds


def test_a_wrong_answer_stops_the_measurement():
    clock = Clock()
    targets, workers = fake_targets(clock, {WRAPPER: 0.05, REFERENCE: 0.01, SUBMISSION: 0.01})

    def verify(round):
        assert set(round.answers) == {WRAPPER, REFERENCE, SUBMISSION}
        raise timing.TimingFailed("wrong")

    with pytest.raises(timing.TimingFailed, match="wrong"):
        timing.measure(targets, SPEED, itertools.count(), verify, 10.0, clock=clock)
    assert all(w.running for w in workers.values())


# -- probes ----------------------------------------------------------------------------------------------


def probes(y, seed=0):
    generator = torch.Generator().manual_seed(seed)
    probe = torch.randn(y.shape, generator=generator, dtype=torch.float64)
    y = y.double()
    return torch.stack([(y * probe).sum(-1), y.abs().sum(-1), (y * y).sum(-1)], -1)


def test_probes_accept_an_output_within_tolerance_and_refuse_a_wrong_one():
    rtol, atol = load_rubric().tolerance("float32")
    y = torch.randn(2, 16, 256, dtype=torch.float64)
    expected = probes(y)
    close = y + (atol + rtol * y.abs()) * torch.sign(torch.randn_like(y))  # every element at the tolerance
    timing.check_probes(probes(close), expected, rtol, atol, SPEED.probe_sigmas, 256)
    for wrong in (torch.randn_like(y), y[torch.randperm(2)].flip(1), y * 1.01):
        with pytest.raises(timing.TimingFailed, match="standard deviations"):
            timing.check_probes(probes(wrong), expected, rtol, atol, SPEED.probe_sigmas, 256)
    with pytest.raises(timing.TimingFailed, match="malformed"):
        timing.check_probes(probes(y)[:, :8], expected, rtol, atol, SPEED.probe_sigmas, 256)
    with pytest.raises(timing.TimingFailed, match="malformed"):
        timing.check_probes(probes(y) * float("nan"), expected, rtol, atol, SPEED.probe_sigmas, 256)


def test_every_column_of_a_probe_is_compared():
    """An answer whose first column is right and whose sums of |y| or y*y are not is refused: the first column
    alone was all that was compared once, so an answer could carry anything in the other two."""
    rtol, atol = load_rubric().tolerance("float32")
    y = torch.randn(2, 16, 256, dtype=torch.float64)
    expected = probes(y)
    for column in (1, 2):
        forged = expected.clone()
        forged[..., column] *= 1.001
        with pytest.raises(timing.TimingFailed, match="absolute values or of its squares"):
            timing.check_probes(forged, expected, rtol, atol, SPEED.probe_sigmas, 256)


def test_timing_seeds_come_from_the_operating_system_not_from_torch():
    """Knowing torch's generators (the one that made the hidden weights, or the global one) predicts nothing:
    the same torch state gives other timing seeds every time."""
    firsts = set()
    for _ in range(3):
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(0)
        torch.randn(4, generator=generator)
        firsts.add(next(timing.fresh_seeds()))
    assert len(firsts) == 3 and all(0 <= seed < 2**63 for seed in firsts)
    picked = timing.pick(2, 32)
    assert len(set(picked)) == 2 and all(0 <= i < 32 for i in picked) and picked == sorted(picked)


# -- the rubric's [speed] --------------------------------------------------------------------------------

PACKAGED = DEFAULT_RUBRIC.read_text()


@pytest.mark.parametrize(
    "old,new,message",
    [
        ("max_rounds = 35 ", "# max_rounds = 35 ", "[speed] max_rounds is missing"),
        ("min_rounds = 5 ", "min_rounds = 0 ", "[speed] min_rounds must be at least 1"),
        ("max_rounds = 35 ", "max_rounds = 35\nrounds = 21 ", "[speed] rounds is no longer used"),
        ("min_rounds = 5 ", "min_rounds = 4 ", "[speed] min_rounds = 4 can never settle a verdict at confidence 0.9"),
        ("confidence = 0.9 ", "confidence = 0.99 ", "use min_rounds >= 9 or a lower confidence"),
        ("confidence = 0.9 ", "confidence = 1 ", "[speed] confidence must lie strictly between 0 and 1"),
        ("batch_rounds = 3 ", "batch_rounds = 0 ", "[speed] batch_rounds must be at least 1"),
        ("max_rounds = 35 ", "max_rounds = 4 ", "[speed] max_rounds = 4 is below min_rounds = 5"),
        ("max_rounds = 35 ", "max_rounds = 1000 ", "[speed] max_rounds = 1000 is more than the 200"),
        ("settle_points = 0.5 ", "settle_points = -1 ", "[speed] settle_points must be at least 0"),
        ("no_credit_at = 0.55 ", "no_credit_at = 0.9 ", "no_credit_at = 0.9 is not below full_credit_at"),
        ("threads = 1 ", "threads = 1.5 ", "[speed] threads must be an integer"),
        ("requires = [", "requires = 3 #", "requires must be a list of check keys"),
        ('[[speed.workloads]]\ndevice = "cuda"', '[[speed.workloads]]\ndevice = "tpu"', "device must be one of"),
        ("heads = 64\ncalls = 32", "heads = 60\ncalls = 32", "does not split into 60 heads"),
        ("calls = 32 ", "calls = 32\ncolour = 1 ", "unknown key in [[speed.workloads]] number 1: 'colour'"),
        ("lock_seconds = 90 ", "lock_seconds = 90\nspeed = 1 ", "unknown key in [speed]: 'speed'"),
    ],
)
def test_speed_settings_are_validated_in_full(tmp_path, old, new, message):
    assert old in PACKAGED, old
    path = tmp_path / "rubric.toml"
    path.write_text(PACKAGED.replace(old, new, 1))
    with pytest.raises(RubricError) as info:
        load_rubric(path)
    assert message in str(info.value) and str(path) in str(info.value)


def test_every_device_needs_a_workload(tmp_path):
    text = PACKAGED.split("[[speed.workloads]]")
    path = tmp_path / "rubric.toml"
    path.write_text(text[0] + "[[speed.workloads]]" + text[1])  # the CPU's only
    with pytest.raises(RubricError, match="no \\[\\[speed.workloads\\]\\] for device 'cuda'"):
        load_rubric(path)


def test_a_misspelt_required_check_is_an_error():
    rubric = load_rubric()
    rubric = dataclasses.replace(
        rubric, speed=dataclasses.replace(rubric.speed, requires=("mha::test_matches_referense",))
    )
    with pytest.raises(RubricError, match='\\[speed\\] requires "mha::test_matches_referense" \\(did you mean'):
        rubric.check_test_keys({"mha::test_matches_reference", "speed::test_faster_than_the_wrapper"})


def test_the_packaged_workloads_are_where_the_weight_split_matters():
    for workload in SPEED.workloads:
        assert workload.heads >= 32 and workload.d_out // workload.heads <= 16, workload
    assert {w.dtype for w in SPEED.workloads_for("cuda")} == {"float32", "bfloat16"}
    assert SPEED.workloads_for("cuda:1") == SPEED.workloads_for("cuda")


# -- scoring: partial credit and the gate ----------------------------------------------------------------


def speed_rubric(tmp_path):
    speed = PACKAGED[PACKAGED.index("[speed]") :]
    return rubric_file(tmp_path, "[parts.mha]\npoints = 20\n[parts.speed]\npoints = 10\n" + speed)


def test_partial_credit_and_the_gate_on_the_values(tmp_path):
    rubric = speed_rubric(tmp_path)
    values = Outcome("mha::test_matches_reference", "mha", "values [12 heads]", "passed")
    partial = Outcome(
        "speed::test_faster_than_the_wrapper", "speed", "fast", "failed", "0.6 of the reference's", credit=0.25
    )
    checks = score([values, partial], rubric)
    assert [c.score for c in checks] == [20, 2.5]
    assert checks[1].status == "failed" and checks[1].message == "0.6 of the reference's"

    full = dataclasses.replace(partial, status="passed", message="", credit=1.0)
    wrong = dataclasses.replace(values, status="failed", message="values differ")
    gated = score([wrong, full], rubric)[1]
    assert gated.score == 0 and gated.status == "not_credited"  # it accuses the forward's speed of nothing
    # it names the part to fix, never the check (which may be hidden from the student)
    assert "counts only once the values of" in gated.message and "(mha)" in gated.message
    assert "values [12 heads]" not in gated.message
    # a required check that did not run (a hidden one under `check`) does not gate
    assert score([full], rubric)[0].score == 10
    # the values right, but the forward uses a ready-made attention: gated, and told why, not "the values"
    ready_made = Outcome("mha::test_no_ready_made_attention", "mha", "no ready-made attention", "failed", "sdpa")
    gated = score([values, ready_made, full], rubric)[2]
    assert gated.score == 0 and "not your own computation" in gated.message
    assert "values of" not in gated.message
    # the values right, but the forward's graph could not be captured (or replayed): gated, accusing it of nothing
    from autograder.grading import graphs

    for trouble in graphs.CANNOT_JUDGE:
        uncaptured = dataclasses.replace(ready_made, message="could not be captured", diagnosis=trouble)
        gated = score([values, uncaptured, full], rubric)[2]
        assert gated.score == 0 and "can capture and check" in gated.message
        assert "not your own computation" not in gated.message


def test_a_check_reports_its_credit_to_the_plugin(pytester, tmp_path):
    from autograder.grading.plugin import ResultsPlugin

    pytester.makepyfile(
        test_speed='''
import pytest

@pytest.mark.part("speed")
def test_partly(request):
    """earns a quarter"""
    request.node.user_properties.append(("credit", 0.25))
    pytest.fail("0.6 of the reference's", pytrace=False)

''',
        test_mha='''
import pytest

@pytest.mark.part("mha")
def test_matches_reference():
    """another part"""

@pytest.mark.part("mha")
def test_no_ready_made_attention():
    """also required by the speed part"""
''',
    )
    plugin = ResultsPlugin(speed_rubric(tmp_path), visible_only=False)
    pytester.inline_run("-p", "no:cacheprovider", plugins=[plugin])
    (outcome, *others) = sorted(plugin.outcomes.values(), key=lambda o: o.part != "speed")
    assert outcome.credit == 0.25 and outcome.status == "failed"
    assert [other.credit for other in others] == [None, None]

    only = ResultsPlugin(speed_rubric(tmp_path), visible_only=False, parts=("speed",))
    pytester.inline_run("-p", "no:cacheprovider", plugins=[only])
    assert [o.part for o in only.outcomes.values()] == ["speed"]


# -- the reference's worker and the seeded forward_many ----------------------------------------------------


def test_the_reference_worker_loads_only_definitions():
    sources = "\n".join(source for _, _, source in reference_cells())
    assert "class MultiHeadAttention(" in sources and "class MultiHeadAttentionWrapper(" in sources
    assert "_check_" not in sources and "gpt2_attention" not in sources


@pytest.fixture(scope="module")
def reference_worker():
    from autograder.sandbox.settings import WorkerConfig

    started = BackgroundWorker(reference_cells(), "reference.py", WorkerConfig(threads=1, request_seconds=30))
    yield started.get()
    started.close()


def built_in(worker):
    """A reference MultiHeadAttention(16, 8, 6, 0.0, 4) here, and the same built in `worker`: (module, its info)."""
    from reference import mha as ref

    module = ref.MultiHeadAttention(16, 8, 6, 0.0, 4).eval()
    args = [16, 8, 6, 0.0, 4]
    info = worker.request(
        BuildRequest(cls="MultiHeadAttention", args=args, kwargs={}, state_dict=module.state_dict(), dtype="float32")
    )
    return module, info


def test_a_module_captured_and_replayed_in_its_worker_computes_what_it_computes(reference_worker):
    """What the speed part times of the reference (`timing.replay_in`): its forward captured as a graph in its
    trusted worker and rebuilt there, which gives the module's own answers on new inputs; the module itself is
    dropped."""
    from autograder.rubric import load_rubric

    torch.manual_seed(0)
    module, info = built_in(reference_worker)
    (cpu,) = [w for w in load_rubric().speed.workloads if w.device == "cpu"]
    workload = dataclasses.replace(cpu, batch=2, tokens=6, d_in=16, d_out=8, heads=4)
    replayed, graph = timing.replay_in(reference_worker, info.handle, workload, module.state_dict(), "cpu")
    assert graph.inputs[-1] == "mask" and "aten.bmm.default" in graph.targets()
    request = ForwardManyRequest(replayed, 0, [2, 6, 16], "float32", 8, threads=1)
    answers, shown = reference_worker.forward_many(request, [21, 22], show=[0, 1])
    for seed, y in zip((21, 22), shown.outputs):
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            expected = module(torch.randn(2, 6, 16, generator=generator)).double()
        assert torch.allclose(y, expected, atol=1e-6)
    with pytest.raises(SubmissionError):  # the module it was captured from is gone
        reference_worker.request(DescribeRequest(info.handle))


def test_forward_many_makes_its_inputs_from_the_seeds(reference_worker):
    torch.manual_seed(0)
    module, info = built_in(reference_worker)
    request = ForwardManyRequest(info.handle, 0, [2, 6, 16], "float32", 8, threads=1)
    first, shown = reference_worker.forward_many(request, [11, 12], show=[1])
    again, _ = reference_worker.forward_many(request, [12])
    assert [tuple(a.shape) for a in first] == [(2, 6, 3)] * 2 and first[0].dtype == torch.float64
    assert torch.equal(first[1], again[0])  # the same seed, the same input and probe
    assert not torch.equal(first[0], first[1])
    # what the worker computed is what the grader computes for the same seed
    generator = torch.Generator().manual_seed(12)
    x = torch.randn(2, 6, 16, generator=generator)
    probe = torch.randn(2, 6, 8, generator=generator).double()
    with torch.no_grad():
        y = module(x).double()
    assert torch.allclose(again[0], torch.stack([(y * probe).sum(-1), y.abs().sum(-1), (y * y).sum(-1)], -1))
    # after the calls: the whole output of the call asked for
    assert len(shown.outputs) == 1 and torch.allclose(shown.outputs[0], y)

    with pytest.raises(SubmissionError, match="expected a tensor of shape"):
        reference_worker.forward_many(dataclasses.replace(request, out_features=9), [1])


def test_timed_calls_do_no_grader_work_but_the_exchange(reference_worker, monkeypatch):
    """Inside the clock, every timed worker pays the same: one seed out, one answer in. The CPU budget (a walk
    of the worker's processes, /proc without control groups) is charged after the last call, not per read."""
    module, info = built_in(reference_worker)
    charged = []
    monkeypatch.setattr(reference_worker.budgets, "cpu_left", lambda: charged.append("budget") or True)
    calls = reference_worker.timed_calls(ForwardManyRequest(info.handle, 3, [2, 6, 16], "float32", 8), 30.0)
    charged.clear()  # making the request (untimed, nothing sent yet) may charge the budget
    calls.open()
    answers = [calls.call(seed) for seed in (1, 2, 3)]
    assert charged == [] and len(answers) == 3
    calls.finish([])
    assert charged == ["budget"]
    with pytest.raises(ValueError, match="outside an open request"):
        calls.call(4)


def test_the_notebook_times_the_graders_cpu_workload():
    """The notebook's speed self-check says it times what the grader times: it must be so."""
    import ast

    from helpers import REFERENCE

    tree = ast.parse(REFERENCE.read_text())
    (call,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["_SPEED_WORKLOAD"]
    ]
    stated = {keyword.arg: ast.literal_eval(keyword.value) for keyword in call.keywords}  # dict(batch=2, ...)
    (cpu,) = SPEED.workloads_for("cpu")
    assert cpu.d_in == cpu.d_out
    assert stated == dict(batch=cpu.batch, num_tokens=cpu.tokens, d_model=cpu.d_in, num_heads=cpu.heads)


# -- end to end: the flag and the guard --------------------------------------------------------------------


def speed_rubric_with(tmp_path, **settings):
    text = PACKAGED
    for key, value in settings.items():
        text, count = re.subn(rf"(?m)^{key} = [0-9.]+", f"{key} = {value}", text, count=1)
        assert count == 1, key
    path = tmp_path / "rubric.toml"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_a_speedup_far_above_the_references_is_flagged_for_the_instructor(tmp_path):
    from helpers import REFERENCE, autograder

    # bands moved so that the reference itself counts as implausibly fast (it runs at about 1.0)
    rubric = speed_rubric_with(tmp_path, give_up_below=0.1, no_credit_at=0.4, full_credit_at=0.5, flag_above=0.6)
    out = tmp_path / "r.json"
    run = autograder("grade", REFERENCE, "--part", "speed", "--rubric", rubric, "--out", out, cwd=tmp_path, timeout=600)
    assert run.returncode == 0, run.stderr
    results = json.loads(out.read_text())
    (flag,) = results["extra_data"]["flags"]
    assert "implausibly fast" in flag and "times the reference's" in flag
    assert "Flagged for the instructor" in run.stdout
    assert results["score"] == 10  # a flag is for a person to look at; it changes no score


@pytest.mark.slow
def test_a_run_where_the_reference_is_not_ahead_cannot_grade(tmp_path):
    from helpers import REFERENCE, autograder

    rubric = speed_rubric_with(tmp_path, min_reference_speedup=1000)
    out = tmp_path / "r.json"
    run = autograder(
        "grade", REFERENCE, "--part", "speed", "--rubric", rubric, "--out", out, "--quiet", cwd=tmp_path, timeout=600
    )
    assert run.returncode == 2
    results = json.loads(out.read_text())
    assert results["extra_data"]["status"] == "cannot_grade" and results["tests"] == []
    assert "tell a parallel forward from a sequential one" in results["extra_data"]["grader_errors"][0]


# -- what a long-lived grading process keeps ----------------------------------------------------------------


def test_a_grading_process_keeps_the_reference_workers_and_replaces_any_that_fail():
    from autograder.sandbox.settings import WorkerConfig

    config = WorkerConfig(threads=1, request_seconds=30)
    kept_workers = timing.KeptWorkers()
    try:
        first = kept_workers.get(config)
        pids = {name: kept.get().process.pid for name, kept in first.items()}
        assert set(pids) == {WRAPPER, REFERENCE} and len(set(pids.values())) == 2
        assert all(kept.kept for kept in first.values())
        # the next submission's settings differ only in what it hides and its budgets: the same workers
        again = kept_workers.get(dataclasses.replace(config, hide=["/elsewhere"], submission_seconds=5))
        assert {name: kept.get().process.pid for name, kept in again.items()} == pids
        # a worker left stopped by a measurement that ended badly is woken and kept
        again[REFERENCE].get().suspend()
        assert {name: kept.get().process.pid for name, kept in kept_workers.get(config).items()} == pids
        # one that died, or timed out once, is replaced, and so is its partner
        again[REFERENCE].get().kill()
        renewed = kept_workers.get(config)
        assert not {kept.get().process.pid for kept in renewed.values()} & set(pids.values())
        renewed[WRAPPER].get().hung["x"] = "did not finish"
        assert kept_workers.get(config)[WRAPPER] is not renewed[WRAPPER]
        # another kind of worker (here: other limits) gets workers of its own
        other = kept_workers.get(dataclasses.replace(config, memory_bytes=3 << 30))
        assert other[WRAPPER].worker.config.memory_bytes == 3 << 30
    finally:
        kept_workers.close()
    assert kept_workers.workers == {}


def test_kept_reference_workers_serve_the_next_grading_and_forget_what_each_built(tmp_path):
    """Two gradings in one process (as `make grade` runs them): the second times against the same reference
    workers, both earn the speed part, and the modules the first built are gone from the kept workers."""
    from autograder.grading.grade import Options, grade_submission
    from helpers import REFERENCE

    kept_workers = timing.KeptWorkers()
    options = Options(
        device="cpu", out=tmp_path / "results.json", quiet=True, parts=("mha", "speed"), kept_workers=kept_workers
    )
    try:
        runs, pids = [], []
        for _ in range(2):
            runs.append(grade_submission(REFERENCE, options))
            pids.append({name: kept.get().process.pid for name, kept in kept_workers.workers.items()})
        assert pids[0] == pids[1] and len(pids[0]) == 2
        for run in runs:
            assert run.graded and run.speed.relative > 0, run.reason
            speed = [c for c in run.checks if c.part == "speed"]
            assert speed and all(c.status == "passed" for c in speed), [c.message for c in speed]
        for kept in kept_workers.workers.values():  # the modules built, and the graphs replayed, are gone
            for handle in ("h0", "h1", "h2"):
                with pytest.raises(SubmissionError, match="KeyError"):
                    kept.get().request(DescribeRequest(handle=handle))
    finally:
        kept_workers.close()


def test_the_speed_part_runs_first():
    """So that the graphs are timed in workers that have run nothing else of this grading."""
    from autograder.grading.checks.fixtures import GradingFixtures

    class Item:
        def __init__(self, part):
            self.part = part

        def get_closest_marker(self, name):
            return type("Marker", (), {"args": (self.part,)})()

    items = [Item(part) for part in ("columns", "mha", "speed", "wrapper")]
    GradingFixtures.pytest_collection_modifyitems(None, items)
    assert [item.part for item in items] == ["speed", "columns", "mha", "wrapper"]
