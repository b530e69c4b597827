"""A request's CPU deadline follows the reference's (`[limits] request_factor`, `request_floor_seconds`): a forward
that never returns is stopped after seconds of CPU, while a slow but honest forward, on every input the grader
gives it, is never stopped. Graded with the packaged rubric, on the CPU, and on CUDA where a device is lent."""

from __future__ import annotations

import pytest
import torch

from helpers import grade, part_scores
from speed_variants import LOOP_OVER_HEADS, LOOP_OVER_TOKENS, with_cell

pytestmark = pytest.mark.slow  # gradings


def stopped(results: dict) -> list[str]:
    """The checks whose message says a request was stopped for its time."""
    return [
        t["name"]
        for t in results["tests"]
        if "did not finish" in t.get("output", "") or "CPU time" in t.get("output", "")
    ]


ON_CUDA = pytest.param(
    "cuda",
    marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")],
)


@pytest.mark.parametrize("device", ["cpu", ON_CUDA])
@pytest.mark.parametrize(
    "variant, forward, over_tokens",
    [("a loop over the tokens", LOOP_OVER_TOKENS, True), ("a loop over the heads", LOOP_OVER_HEADS, False)],
)
def test_a_slow_honest_forward_is_never_stopped(tmp_path, variant, forward, over_tokens, device):
    """The slowest forwards an honest student writes get every request answered: part mha's values are right on
    every input (the loop over heads fails only its one-pass check), and the speed part measures them."""
    path = tmp_path / "mha.py"
    path.write_text(with_cell(forward))
    results, run = grade(path, tmp_path, "--part", "mha", "--part", "speed", "--device", device)
    assert run.returncode == 0, run.stderr
    assert stopped(results) == [], variant
    failed = {t["tags"][1] for t in results["tests"] if t["status"] == "failed" and t["tags"][0] == "mha"}
    passed = {t["tags"][1] for t in results["tests"] if t["status"] == "passed"}
    assert "mha::test_matches_reference" in passed and "mha::test_new_inputs_new_answers" in passed, variant
    # the loop over tokens draws its dropout row by row: not the reference's mask (its own check says so)
    assert failed <= ({"mha::test_dropout"} if over_tokens else {"mha::test_one_pass_for_all_heads"}), variant
    assert part_scores(results)["speed"][1] > 0
    assert (results["extra_data"].get("speed") or {}).get("workloads"), variant  # measured, not stopped


def test_a_forward_that_never_returns_is_stopped_by_its_cpu_time(tmp_path):
    """An endless forward: its first request is stopped at the rubric's CPU floor, which the message says."""
    from autograder.rubric import load_rubric

    path = tmp_path / "mha.py"
    path.write_text(
        with_cell("def _forward(self, x):\n    while True:\n        pass\n\nMultiHeadAttention.forward = _forward\n")
    )
    results, run = grade(path, tmp_path, "--part", "mha", "--device", "cpu")
    assert run.returncode == 0, run.stderr
    floor = load_rubric().limits.request_floor_seconds
    said = [t.get("output", "") for t in results["tests"] if t["status"] == "failed"]
    assert any(f"did not finish within {floor:g} s of CPU time" in s for s in said), said
    assert part_scores(results)["mha"][0] == 0
