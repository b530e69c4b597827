"""The speed part's verdicts, each graded many times on a busy machine: they must never flake.

Every submission below is graded `GRADINGS` times (the speed part alone, one at a time, in a long-lived grading
process as `grade-class` grades: its start, its fork server and the reference's timing workers are paid once
for all the gradings, not once per grading) while another process burns a core. The reference's own definitions must earn the speed points in every grading, and so must the reference with a
50 ms sleep in its forward or with CPU burners started at import: what is timed is the graph captured from the
forward, replayed in a trusted worker while the submission's own worker is stopped, so neither counts. A loop
over heads with the right values (two of them: the sample class's, and the tightest one, which loops over
nothing but the two attention matmuls), caching by shape (captured, its cached answer is a constant, wrong on a
new input), and a loop that batches the timed calls it can see coming (from its callers' frames, or by patching
the worker's timed request) must earn none in any. Caching by input identity earns nothing in any
grading where its cache answers a call (a wrong answer, caught); where the allocator never gives a new input an
old one's place, every answer was computed, and it is graded as the reference it then is. Near the bands' edges,
the reference slowed to about 0.55, 0.65 and 0.75 of its speed must get a credit within wide bounds in
every grading; the spread of their credit is reported.

Long (about half a minute per grading on a loaded 2-core machine): marked `verdicts`, which only
`make test-speed` selects. Each test prints the measured figures: per grading, the submission's speedup as a
fraction of the reference's (`relative`), its median over the gradings, the middle half of the per-round
ratios, the worst case (the lowest for the reference, the highest for the others), the credit's spread, and
the rounds each grading took and why they stopped.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest

from helpers import GradingPool
from speed_variants import NEAR_EDGES, VARIANTS, slowed

GRADINGS = int(os.environ.get("SPEED_VERDICT_GRADINGS", "10"))
# What is timed is the graph captured from the forward: a sleep in it, or threads and processes it started
# (stopped while anything is timed), are not part of that graph and change nothing
EARNS_ALL = {"reference", "sleeps_50ms", "burners_at_import"}
# caches answers by the input's identity: wrong, and caught, whenever a new input takes an old one's place
HONEST_WHEN_NOT_CAUGHT = {"cached_by_identity"}
EARNS_NOTHING = set(VARIANTS) - EARNS_ALL - HONEST_WHEN_NOT_CAUGHT

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.verdicts]


@pytest.fixture(scope="module")
def neighbour():
    """Another process burning one core for as long as the verdicts are graded."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield burner
    burner.kill()
    burner.wait()


@pytest.fixture(scope="module")
def graders():
    """One long-lived grading process for every grading of the module (replaced every 25, as in a class)."""
    pool = GradingPool()
    yield pool
    pool.close()


def speed_figures(results: dict) -> dict:
    """The workload's figures; none when the check stopped before timing (e.g. a timed forward that
    overran its deadline)."""
    workloads = (results["extra_data"].get("speed") or {}).get("workloads") or {}
    return next(iter(workloads.values()), {})


def grade_many(source: str, variant: str, tmp_path, graders: GradingPool) -> list[dict]:
    """`source` graded GRADINGS times (the speed part alone); per grading, the check's score and figures."""
    path = tmp_path / variant / "mha.py"
    path.parent.mkdir()
    path.write_text(source)
    rows = []
    for number in range(GRADINGS):
        out_dir = tmp_path / f"grading-{number}"
        out_dir.mkdir()
        results, outcome = graders.grade(path, out_dir, parts=["speed"])
        assert outcome.ok and results["extra_data"]["status"] == "graded", (outcome.problem, results.get("output"))
        (check,) = results["tests"]
        figures = speed_figures(results)
        said = figures.get("verdict") or {}
        rows.append(
            {
                "score": check["score"],
                "max_score": check["max_score"],
                "status": check["status"],
                "relative": figures.get("relative"),
                "interval": figures.get("relative_interval"),
                "rounds": figures.get("rounds"),
                "stopped_because": said.get("stopped_because"),
                "credit": figures.get("credit"),
                "seconds": figures.get("seconds"),
                "spread": figures.get("relative_spread"),
                "speedup": figures.get("speedup"),
                "reference_speedup": figures.get("reference_speedup"),
                "failed": figures.get("failed"),
                "output": check["output"],
            }
        )
    return rows


@pytest.mark.timeout(GRADINGS * 300 + 60)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_verdict_holds_in_every_grading(tmp_path, neighbour, graders, variant):
    rows = grade_many(VARIANTS[variant](), variant, tmp_path, graders)
    assert neighbour.poll() is None, "the neighbour stopped burning"
    report(variant, rows, tmp_path)
    if variant in EARNS_ALL:
        assert all(r["status"] == "passed" and r["score"] == r["max_score"] > 0 for r in rows), rows
    elif variant in HONEST_WHEN_NOT_CAUGHT:
        # whether its cache ever answers a new input depends on where the allocator puts it; when it does, the
        # answer is wrong and caught; when it never does, every answer was computed, and it is the reference
        assert all(
            (r["status"] == "failed" and r["score"] == 0 and "differ" in r["output"])
            or (r["status"] == "passed" and r["relative"] is not None and r["relative"] < 1.5)
            for r in rows
        ), rows
    else:
        assert all(r["status"] == "failed" and r["score"] == 0 for r in rows), rows


# Near the bands' edges (no_credit_at 0.55, full_credit_at 0.75): the reference slowed by a fixed fraction
# (`speed_variants.slowed`), its speed near 0.55, 0.65 and 0.75 of the reference's. Measured beside the
# burner they sit a little higher, about 0.60, 0.70 and 0.80 (each call's exchange costs all three the same
# fraction of a millisecond, which pulls a slower forward's ratio towards 1). The credit they may get, with
# margins of at least 0.1 in relative speed either side of where they were measured: what is tested is that
# the verdict is steady, and the spread of their credit is reported.
NEAR_EDGE_CREDIT = {"slowed_to_0.55": (0.0, 0.85), "slowed_to_0.65": (0.1, 1.0), "slowed_to_0.75": (0.65, 1.0)}


@pytest.mark.timeout(GRADINGS * 300 + 60)
@pytest.mark.parametrize("variant", sorted(NEAR_EDGES))
def test_near_an_edge_the_credit_is_steady(tmp_path, neighbour, graders, variant):
    rows = grade_many(slowed(NEAR_EDGES[variant]), variant, tmp_path, graders)
    assert neighbour.poll() is None, "the neighbour stopped burning"
    report(variant, rows, tmp_path)
    low, high = NEAR_EDGE_CREDIT[variant]
    credits = [r["credit"] for r in rows]
    assert all(c is not None and low <= c <= high for c in credits), rows


def report(variant: str, rows: list[dict], tmp_path):
    measured = [r["relative"] for r in rows if r["relative"] is not None]
    line = f"\n{variant}: {len(rows)} gradings, scores {sorted({r['score'] for r in rows})}"
    if measured:
        worst = min(measured) if variant in EARNS_ALL else max(measured)
        q1 = min(r["spread"]["q1"] for r in rows if r["spread"])
        q3 = max(r["spread"]["q3"] for r in rows if r["spread"])
        credits = [r["credit"] for r in rows if r["credit"] is not None]
        line += (
            f"; relative per grading {[round(v, 3) for v in measured]}, median {statistics.median(measured):.3f}, "
            f"worst {worst:.3f}; per-round middle half within {q1:.2f}-{q3:.2f}; reference speedup "
            f"{statistics.median(r['reference_speedup'] for r in rows if r['reference_speedup']):.2f}x; "
            f"credit {min(credits):.2f} to {max(credits):.2f} (spread {max(credits) - min(credits):.2f}); rounds "
            f"{[r['rounds'] for r in rows]}, stopped because {[r['stopped_because'] for r in rows]}; speed check "
            f"seconds, median {statistics.median(r['seconds'] for r in rows if r['seconds'] is not None):.2f}"
        )
    unmeasured = [r["failed"] or r["output"] for r in rows if r["relative"] is None]
    if unmeasured:
        line += f"; not measured in {len(unmeasured)} (first: {unmeasured[0][:160]!r})"
    print(line)
    (tmp_path / "verdicts.json").write_text(json.dumps(rows, indent=1))
