"""Points from the rubric: shares within a part, parametrised cases, visibility, a round total; the model's edge."""

from dataclasses import replace

import pytest
import torch

from autograder.contract import PART_IDS
from autograder.grading.checks.harness import Failure, explained
from autograder.grading.scoring import Outcome, allocate_points, score
from autograder.model import (
    FAILED,
    GRADED,
    NOT_CHARGED,
    NOT_CREDITED,
    PASSED,
    WORKER,
    GradingRun,
    SpeedFigures,
)
from autograder.rubric import load_rubric
from rubric_text import rubric_file


def test_default_rubric_totals_a_round_number_and_uses_known_parts():
    rubric = load_rubric()
    assert rubric.max_score == 100
    assert set(rubric.parts) <= set(PART_IDS)


def test_points_shared_by_weight_then_by_case(tmp_path):
    rubric = rubric_file(
        tmp_path,
        """
[parts.mha]
points = 30
[tests."mha::test_a"]
weight = 2
""",
    )
    outcomes = [
        Outcome("mha::test_a", "mha", "a", "passed"),
        Outcome("mha::test_a", "mha", "a", "failed"),
        Outcome("mha::test_b", "mha", "b", "passed"),
    ]
    assert allocate_points(outcomes, rubric) == pytest.approx([10, 10, 10])
    results = GradingRun(GRADED, "mha.py", checks=score(outcomes, rubric)).to_gradescope()
    assert results["score"] == 20 and results["max_score"] == 30
    assert [t["status"] for t in results["tests"]] == ["passed", "failed", "passed"]
    assert results["tests"][0]["tags"][0] == "mha"


def test_a_check_that_never_ran_counts_as_failed(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.quiz]\npoints = 10\n")
    results = GradingRun(
        GRADED, "mha.py", checks=score([Outcome("quiz::test_x", "quiz", "x", None)], rubric)
    ).to_gradescope()
    assert results["tests"][0]["status"] == "failed" and results["score"] == 0
    assert "not run" in results["tests"][0]["output"]


def test_summary_names_the_first_failure(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.quiz]\npoints = 10\n")
    outcomes = [
        Outcome("quiz::a", "quiz", "a", "passed"),
        Outcome("quiz::b", "quiz", "b", "failed", "wrong: B"),
        Outcome("quiz::c", "quiz", "c", "failed", "wrong: C"),
    ]
    (entry,) = GradingRun(GRADED, "mha.py", checks=score(outcomes, rubric)).parts()
    assert entry.passed == 1 and entry.total == 3
    assert entry.first_failure.message == "wrong: B"


def test_results_json_reads_back_into_the_same_model(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.quiz]\npoints = 10\n[parts.mha]\npoints = 20\n")
    outcomes = [
        Outcome("mha::a", "mha", "a", "passed", evidence="worker"),
        Outcome("quiz::b", "quiz", "b", "failed", "B"),
    ]
    run = GradingRun(
        GRADED,
        "mha.py",
        device="cpu",
        isolation="namespace",
        seed=7,
        checks=score(outcomes, rubric),
        events=["a hang"],
        student_output="hello",
        titles={"quiz": "Questions"},
        speed=SpeedFigures(speedup=2.5),
        flags=["implausible"],
    )
    data = run.to_gradescope()
    again = GradingRun.from_gradescope(data)
    assert again == run
    assert [c.part for c in again.checks] == ["quiz", "mha"]  # part order, whatever order they ran in
    assert data["tests"][1]["tags"] == ["mha", "mha::a", "worker-reported"]
    assert data["leaderboard"][0]["value"] == 2.5


def test_a_run_that_could_not_grade_has_no_score():
    run = GradingRun("cannot_grade", "mha.py", reason="broken rubric")
    data = run.to_gradescope()
    assert data["score"] == 0 and data["max_score"] == 0 and data["tests"] == []
    assert "could not be graded: broken rubric" in data["output"]
    assert GradingRun.from_gradescope(data).status == "cannot_grade"


def test_a_checks_inputs_depend_only_on_the_run_seed_and_its_own_id():
    from autograder.grading.checks.harness import Inputs, check_seed

    first = Inputs(check_seed(123, "test_mha.py::test_gradients")).randn(3, 4)
    # whatever other checks ran before, in whatever order: the same id and run seed give the same inputs
    for other in ("test_quiz.py::test_answer[HEADS_RUN]", "test_combine.py::test_book_example"):
        Inputs(check_seed(123, other)).randn(100)
    assert torch.equal(Inputs(check_seed(123, "test_mha.py::test_gradients")).randn(3, 4), first)
    assert not torch.equal(Inputs(check_seed(124, "test_mha.py::test_gradients")).randn(3, 4), first)
    assert not torch.equal(Inputs(check_seed(123, "test_mha.py::test_dropout")).randn(3, 4), first)


def test_the_checks_seed_draws_as_torch_manual_seed_does():
    """`seed_torch` (torch.manual_seed without queueing seeds for accelerators not in use): the same weights,
    the same dropout masks."""
    from autograder.grading.checks.harness import seed_torch
    from reference import mha as ref

    def draws() -> list[torch.Tensor]:
        module = ref.MultiHeadAttention(8, 8, 4, 0.5, 2)
        return [*module.state_dict().values(), torch.nn.functional.dropout(torch.ones(50), 0.5), torch.rand(3)]

    for seed in (0, 123, 2**40):
        torch.manual_seed(seed)
        expected = draws()
        torch.manual_seed(seed + 1)  # a different state, which seed_torch must replace
        draws()
        seed_torch(seed)
        assert all(torch.equal(a, b) for a, b in zip(draws(), expected, strict=True))


def test_the_checks_backward_gives_the_gradients_of_backward_with_a_gradient_and_imports_nothing():
    """`backward(y, g)` (the grader's and the worker's): bit for bit the gradients of `y.backward(g)`, without
    importing sympy, which `y.backward(g)` does on its first call (a quarter of a second)."""
    import subprocess
    import sys

    from autograder.grading.checks.harness import backward
    from reference import mha as ref

    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        module = ref.MultiHeadAttention(6, 4, 8, 0.0, 2).to(dtype)
        x, g = torch.randn(2, 8, 6, dtype=dtype), torch.randn(2, 8, 4, dtype=dtype)
        found = []
        for run in (torch.Tensor.backward, backward):
            module.zero_grad(set_to_none=True)
            leaf = x.clone().requires_grad_(True)
            run(module(leaf), g)
            found.append([leaf.grad, *(p.grad for p in module.parameters())])
        assert all(torch.equal(a, b) for a, b in zip(*found, strict=True)), dtype
    script = (
        "import sys, torch\n"
        "from autograder.grading.checks.harness import backward\n"
        "x = torch.randn(2, 3, requires_grad=True)\n"
        "backward(torch.softmax(x, -1), torch.randn(2, 3))\n"
        "assert x.grad is not None and 'sympy' not in sys.modules, sorted(sys.modules)[:5]\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True)


def test_a_check_resting_on_a_wrong_answer_is_not_credited_and_reads_back(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.mha]\npoints = 20\n")
    outcomes = [
        Outcome("mha::test_values", "mha", "values", "failed", "values differ"),
        Outcome("mha::test_loop", "mha", "no loop over heads", NOT_CREDITED, "not credited: the output is wrong"),
    ]
    run = GradingRun(GRADED, "mha.py", checks=score(outcomes, rubric))
    assert [c.status for c in run.checks] == [FAILED, NOT_CREDITED] and run.score == 0
    data = run.to_gradescope()
    # Gradescope knows passed and failed only: a check not credited is failed, tagged, and reads back as it was
    assert data["tests"][1]["status"] == "failed" and "not-credited" in data["tests"][1]["tags"]
    assert GradingRun.from_gradescope(data) == run
    assert run.parts()[0].first_failure.name == "values"  # the summary shows the failure, not what rests on it


def test_a_check_is_one_row_that_counts_and_names_its_cases(tmp_path):
    """Seven hidden cases with one diagnosis, one that fails otherwise and a passing one are one row: its points
    are those of its cases, it counts and names the cases that failed, and says each diagnosis once."""
    rubric = rubric_file(tmp_path, "[parts.columns]\npoints = 10\n")
    inclusive = "inclusive ranges: stop is one past the last column"
    wrong = "head_column_ranges({}, 2) returned {}.\nLikely mistake: " + inclusive
    outcomes = [  # each names its mistake, as the check does (`harness.fail(message, mistake=...)`)
        Outcome("columns::test_r", "columns", "ranges", FAILED, wrong.format(n, [(0, n // 2 - 1)]), case=f"{n}-2")
        for n in (4, 6, 8, 10, 12, 14, 16)
    ]
    outcomes = [replace(outcome, mistake=inclusive) for outcome in outcomes]
    outcomes += [
        Outcome("columns::test_r", "columns", "ranges", PASSED, case="2-2"),
        Outcome("columns::test_r", "columns", "ranges", FAILED, "raised ValueError: no", case="3-1"),
    ]
    (row,) = score(outcomes, rubric)
    assert (row.name, row.status, row.max_score, row.score) == ("ranges", FAILED, 10, 1.11)  # 10 / 9, in hundredths
    assert row.cases == ["4-2", "6-2", "8-2", "10-2", "12-2", "14-2", "16-2", "2-2", "3-1"]
    assert row.failed_cases == ["4-2", "6-2", "8-2", "10-2", "12-2", "14-2", "16-2", "3-1"]
    assert row.message.splitlines() == [
        "failed in 8 of 9 cases: [4-2], [6-2], [8-2], [10-2], [12-2], [14-2], [16-2] and [3-1]",
        "[4-2], [6-2], [8-2], [10-2], [12-2], [14-2] and [16-2]: head_column_ranges(4, 2) returned [(0, 1)].",
        "Likely mistake: inclusive ranges: stop is one past the last column",
        "[3-1]: raised ValueError: no",
    ]
    assert row.mistake == "inclusive ranges: stop is one past the last column"
    data = GradingRun(GRADED, "mha.py", checks=[row]).to_gradescope()
    assert len(data["tests"]) == 1 and data["tests"][0]["extra_data"]["failed_cases"] == row.failed_cases
    assert GradingRun.from_gradescope(data).checks == [row]
    (part,) = GradingRun(GRADED, "mha.py", checks=[row]).parts()
    assert (part.passed, part.total) == (1, 9)


def test_one_diagnosis_in_some_cases_is_said_once_with_its_cases(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.fuse]\npoints = 15\n")
    wrong = "the fused weights ({}): values differ.\nLikely mistake: the bias is not copied"
    bias = "the bias is not copied"  # the mistake each failure names, as the check does (`harness.fail`)
    outcomes = [
        Outcome("fuse::test_w", "fuse", "weights", PASSED, case="2 heads"),
        Outcome("fuse::test_w", "fuse", "weights", FAILED, wrong.format("3 heads, bias"), case="3 heads, bias"),
        Outcome("fuse::test_w", "fuse", "weights", PASSED, case="1 head"),
        Outcome("fuse::test_w", "fuse", "weights", FAILED, wrong.format("6 heads, bias"), case="6 heads, bias"),
    ]
    outcomes = [replace(o, mistake=bias) if o.status == FAILED else o for o in outcomes]
    (row,) = score(outcomes, rubric)
    assert row.message == (
        "failed in 2 of 4 cases: [3 heads, bias] and [6 heads, bias]\n" + wrong.format("3 heads, bias")
    )
    assert (row.score, row.max_score) == (7.5, 15)


def test_a_problem_many_checks_share_is_said_once_by_the_first_visible_one(tmp_path):
    rubric = rubric_file(
        tmp_path, '[parts.mha]\npoints = 20\n[parts.fuse]\npoints = 10\n[tests."mha::test_a"]\nvisibility = "hidden"\n'
    )
    cause = "your MultiHeadAttention does not keep the given constructor's attributes"
    outcomes = [
        Outcome("mha::test_a", "mha", "a hidden check", FAILED, "the whole story", cause=cause),
        Outcome("mha::test_b", "mha", "the book's example", FAILED, "the whole story", cause=cause),
        Outcome("fuse::test_c", "fuse", "fused weights", FAILED, "the whole story", cause=cause),
    ]
    rows = score(outcomes, rubric)
    assert [r.status for r in rows] == [NOT_CREDITED, FAILED, NOT_CREDITED]
    assert rows[1].message == "the whole story"
    assert (
        rows[0].message == rows[2].message == f'not credited: {cause} (said in full under "mha: the book\'s example")'
    )


def test_another_parts_mistake_is_not_charged_and_its_own_part_loses_once(tmp_path):
    """One mistake, one part: the MultiHeadAttention constructor (the mha part's) that fuse_heads builds is
    said in full once, in mha; mha's other checks meeting it are not credited (its own part loses them); fuse's
    checks are not charged: they earn their points, and their rows say that they wait for mha."""
    rubric = rubric_file(tmp_path, "[parts.mha]\npoints = 20\n[parts.fuse]\npoints = 15\n")
    cause = "your MultiHeadAttention does not keep the given constructor"
    outcomes = [
        Outcome("fuse::test_w", "fuse", "fused weights", FAILED, "the whole story", cause=cause, owner="mha"),
        Outcome("mha::test_b", "mha", "the book's example", FAILED, "the whole story", cause=cause, owner="mha"),
        Outcome("mha::test_c", "mha", "gradients", FAILED, "the whole story", cause=cause, owner="mha"),
        Outcome("fuse::test_d", "fuse", "dtype", FAILED, "the whole story", cause=cause, owner="mha"),
    ]
    rows = score(outcomes, rubric)
    assert [(r.part, r.status) for r in rows] == [
        ("mha", FAILED),
        ("mha", NOT_CREDITED),
        ("fuse", NOT_CHARGED),
        ("fuse", NOT_CHARGED),
    ]
    run = GradingRun(GRADED, "mha.py", checks=rows)
    assert [(p.part, p.score, p.max_score) for p in run.parts()] == [("mha", 0, 20), ("fuse", 15, 15)]
    assert rows[0].message == "the whole story" and rows[0].mistake == cause
    assert rows[2].message.startswith(f'waiting: {cause} (said in full under "mha: the book\'s example")')
    assert "waits for part mha and costs nothing here" in rows[2].message and rows[2].mistake == ""
    assert [r.word for r in rows] == ["failed", "not credited", "waiting", "waiting"]
    assert run.parts()[1].first_failure is None  # the mistake is shown once, in mha
    assert run.headline() == "mha: " + cause
    # Gradescope: earned, so passed, tagged not-charged; it reads back as it was
    data = run.to_gradescope()
    assert [(t["status"], "not-charged" in t["tags"]) for t in data["tests"][2:]] == [("passed", True)] * 2
    assert data["score"] == 15
    assert GradingRun.from_gradescope(data) == run


def test_another_parts_mistake_is_said_in_full_where_that_part_did_not_run(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.fuse]\npoints = 15\n")
    cause = "your MultiHeadAttention does not keep the given constructor"
    outcomes = [Outcome("fuse::test_w", "fuse", "fused weights", FAILED, "the whole story", cause=cause, owner="mha")]
    (row,) = score(outcomes, rubric)
    assert (row.status, row.score) == (NOT_CHARGED, 15)
    assert row.message.startswith(f"waiting: {cause}. This check waits") and row.message.endswith("\nthe whole story")


def test_the_speed_part_is_never_not_charged():
    """The declared rule: no speed points while what the speed part rests on is wrong, whatever says so."""
    rubric = load_rubric()  # (the values [speed] requires pass here: the speed part is not gated by them)
    cause = "your MultiHeadAttention does not keep the given constructor"
    outcomes = [
        Outcome("mha::test_matches_reference", "mha", "hidden values", PASSED),
        Outcome("mha::test_book_example", "mha", "the book's example", FAILED, "story", cause=cause, owner="mha"),
        Outcome("speed::test_faster_than_the_wrapper", "speed", "faster", FAILED, "story", cause=cause, owner="mha"),
        Outcome("speed::test_faster_than_the_wrapper", "speed", "faster", NOT_CHARGED, "waiting: a stand-in"),
    ]
    rows = score(outcomes, rubric)
    assert [(r.part, r.status, r.score) for r in rows[1:]] == [
        ("mha", FAILED, 0),
        ("speed", NOT_CREDITED, 0),
        ("speed", NOT_CREDITED, 0),
    ]
    assert [r.word for r in rows[2:]] == ["waiting", "waiting"]  # it waits for mha, and earns nothing meanwhile


def test_a_row_of_cases_that_wait_counts_them_and_earns_their_points(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.fuse]\npoints = 16\n")
    waiting = "waiting: the wrapper's forward stood in"
    outcomes = [
        Outcome("fuse::test_w", "fuse", "weights", PASSED, case="2 heads"),
        Outcome("fuse::test_w", "fuse", "weights", NOT_CHARGED, waiting, case="3 heads"),
        Outcome("fuse::test_w", "fuse", "weights", PASSED, case="1 head"),
        Outcome("fuse::test_w", "fuse", "weights", NOT_CHARGED, waiting, case="6 heads"),
    ]
    (row,) = score(outcomes, rubric)
    assert (row.status, row.score, row.word) == (NOT_CHARGED, 16, "waiting")
    assert row.message == "waiting in 2 of 4 cases: [3 heads] and [6 heads]: the wrapper's forward stood in"
    # a case that fails beside them is charged, and the row is failed
    (row,) = score([*outcomes, Outcome("fuse::test_w", "fuse", "weights", FAILED, "wrong", case="8 heads")], rubric)
    assert (row.status, row.score) == (FAILED, 12.8)
    assert row.message.splitlines()[0] == (
        "failed in 1 of 5 cases: [8 heads]; waiting in 2 of 5 cases: [3 heads] and [6 heads]"
    )


def test_a_wrong_answer_earns_nothing_for_its_side_properties_even_beside_a_check_that_waits(tmp_path):
    """A property of the part's own wrong output is not credited (a loss), never not charged."""
    rubric = rubric_file(tmp_path, "[parts.wrapper]\npoints = 30\n")
    outcomes = [
        Outcome("wrapper::test_values", "wrapper", "values", FAILED, "values differ"),
        Outcome("wrapper::test_input", "wrapper", "input", NOT_CREDITED, "not credited: the output is wrong"),
        Outcome("wrapper::test_gradients", "wrapper", "gradients", NOT_CHARGED, "waiting: combine stood in"),
    ]
    rows = score(outcomes, rubric)
    assert [(r.status, r.score, r.word) for r in rows] == [
        (FAILED, 0, "failed"),
        (NOT_CREDITED, 0, "not credited"),
        (NOT_CHARGED, 10, "waiting"),
    ]


def failed_with(key: str, name: str, failure: Failure, case: str = "") -> Outcome:
    """A check's outcome that failed with `failure`, as the plugin records it (`harness.fail`)."""
    return Outcome(
        key,
        key.split("::")[0],
        name,
        FAILED,
        failure.message,
        case=case,
        mistake=failure.mistake,
        diagnosis=failure.diagnosis,
        detail=failure.detail,
    )


def test_a_diagnosis_is_said_in_full_once_and_pointed_to_after(tmp_path):
    rubric = rubric_file(tmp_path, "[parts.mha]\npoints = 20\n")
    transpose = "missing transpose before merging the heads"
    outcomes = [  # as the check explains the mistake it names (`harness.explained`)
        failed_with(
            "mha::test_book", "the book's example", explained("output: values differ by 0.4.", transpose, transpose)
        ),
        failed_with(
            "mha::test_short", "short sequences", explained("3 tokens: values differ by 7.", transpose, transpose)
        ),
    ]
    rows = score(outcomes, rubric)
    assert rows[0].message.endswith(f"Likely mistake: {transpose}")
    assert rows[1].message == (
        '3 tokens: values differ by 7.\nLikely mistake: the same as under "mha: the book\'s example".'
    )


def test_where_a_message_explains_its_mistake_is_data_never_read_from_its_words(tmp_path):
    """A row that says a diagnosis said before keeps what it said before its explanation of the likely mistake
    (`harness.Failure.detail`) and points to where that explanation is said in full, however the explanation is
    worded; a row of several cases keeps the line that counts them. A message whose words only look like an
    explanation but that explains none (no detail) keeps its first line and points, its words unread."""
    rubric = rubric_file(tmp_path, "[parts.mha]\npoints = 20\n")
    transpose = "missing transpose before merging the heads"

    def probably(said: str) -> Failure:  # an explanation worded otherwise than "Likely mistake: "
        return explained(said, transpose, transpose, label="Probably, ")

    looks_explained = Failure(f"input 2: values differ by 3.\nLikely mistake: {transpose}", transpose)
    outcomes = [
        failed_with("mha::test_book", "the book's example", probably("output: values differ by 0.4.")),
        failed_with("mha::test_short", "short sequences", probably("3 tokens: values differ by 7.")),
        failed_with("mha::test_new", "new inputs", looks_explained),
        *(failed_with("mha::test_cases", "cases", probably(f"{c}: values differ."), case=c) for c in "ab"),
        Outcome("mha::test_cases", "mha", "cases", PASSED, case="c"),
    ]
    rows = score(outcomes, rubric)
    pointer = 'the same as under "mha: the book\'s example"'
    assert rows[0].message == f"output: values differ by 0.4.\nProbably, {transpose}"
    assert rows[1].message == f"3 tokens: values differ by 7.\nProbably, {pointer}."
    assert rows[2].message == f"input 2: values differ by 3. ({pointer})"
    assert rows[3].message == f"failed in 2 of 3 cases: [a] and [b]\na: values differ.\nProbably, {pointer}."
    assert [row.mistake for row in rows] == [transpose] * 4


def test_speed_waits_for_right_values_without_naming_a_hidden_check():
    rubric = load_rubric()  # [speed] requires mha::test_matches_reference, a check shown after the due date
    assert rubric.visibility("mha::test_matches_reference") != "visible"
    outcomes = [
        Outcome("mha::test_matches_reference", "mha", "hidden values", FAILED, "wrong", case="float64-1 head"),
        Outcome("speed::test_faster_than_the_wrapper", "speed", "faster", FAILED, "1.2 ms per call", credit=0.5),
    ]
    speed = score(outcomes, rubric)[-1]
    assert speed.status == NOT_CREDITED and speed.score == 0
    assert "hidden values" not in speed.message and "1 head" not in speed.message
    assert f'"{rubric.part_title("mha")}" (mha)' in speed.message and "(measured: 1.2 ms per call)" in speed.message


def test_in_a_preview_speed_waits_for_the_visible_checks_of_the_part_it_requires():
    """`preview` runs only visible checks, so the hidden check `[speed] requires` does not run: the visible
    checks of its part that compare values stand in for it (the visible one it requires runs itself), as the
    self-check's speed waits for part 6. A structure check (what the worker reports) does not: a loop over
    heads is timed, as in the grader."""
    rubric = load_rubric()
    ready_made = Outcome("mha::test_no_ready_made_attention", "mha", "no ready-made", PASSED, evidence=WORKER)
    outcomes = [
        Outcome("mha::test_book_example", "mha", "the book's example", FAILED, "not done yet"),
        ready_made,
        Outcome("speed::test_faster_than_the_wrapper", "speed", "faster", FAILED, "not done yet"),
    ]
    speed = score(outcomes, rubric)[-1]
    assert speed.status == NOT_CREDITED and "speed counts only once the values of" in speed.message
    looped = [
        Outcome("mha::test_book_example", "mha", "the book's example", PASSED),
        Outcome("mha::test_one_pass_for_all_heads", "mha", "one pass", FAILED, "a loop", evidence=WORKER),
        ready_made,
        Outcome("speed::test_faster_than_the_wrapper", "speed", "faster", FAILED, "slow", credit=0.0),
    ]
    assert score(looped, rubric)[-1].status == FAILED  # timed and judged slow, not waiting
    alone = score([Outcome("speed::test_faster_than_the_wrapper", "speed", "faster", PASSED)], rubric)
    assert alone[0].status == PASSED  # `--part speed` alone: nothing of mha ran, nothing to wait for
