"""Hostile submissions, graded end to end: every attack is contained and scored for what the code deserves.

Student code only ever runs in the worker process, never in the grader. Each submission here attacks
the grader in one way: it exits, hangs, crashes, hogs memory, floods its output, patches torch's
comparisons, writes fake results and a conftest.py, steals the reference, caches or mutates, burns the
CPU in the background, returns things that are not tensors, or hides its code between IPython magics.
For every one the grader must exit 0 and write a complete results.json of its own (every check of the
reference's run, none "not run"); the parts the attack touches lose points, with a message that says
why, and every other part keeps the reference's full marks.

Most submissions are the reference's definitions (its code cells without the demos and self-checks, so
that loading runs no forward) with one hostile cell added; the untouched release is graded too (0 points,
no grader error). All are graded once per session, two at a time.

Measured on a shared 2-core machine (torch 2.13 CPU, namespace isolation, other jobs running): graded
alone, the reference solution takes 7 s of wall time (execution_time 4.5 s) and a submission that hangs in
every forward (wrapper, MultiHeadAttention and CausalAttention) 27 s (execution_time 25 s: two request
deadlines of 10 s, since a target that timed out once is not tried again); in this file's pool, two
gradings at a time, 45 s. The product requirement tested here: a submission hanging in every forward is
graded in at most 60 s in all. The whole file took 3.6 min with the machine's load average at 3-4.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import speed_variants
from autograder.rubric import DEFAULT_RUBRIC, load_rubric
from autograder.sandbox.probe import namespace_sandbox_available
from autograder.sandbox.protocol import clean_text
from helpers import REFERENCE, ROOT, checks_run, failures, grade, part_scores
from hostile import (
    BACKGROUND_BURNER,
    BROKEN_MHA_FORWARD,
    CACHED_BY_SHAPE,
    CALLS_FUSED_MHA,
    DIES_AFTER_EACH_ANSWER,
    EXIT_AT_IMPORT,
    EXIT_IN_FORWARD,
    EXPANDED_OUTPUT,
    FAKE_EQUALITY,
    HIDES_ITS_MUTATION,
    HIDES_THE_KERNEL,
    HIDES_THE_LOOP,
    KERNEL_WHEN_TIMED_BY_FRAME,
    KERNEL_WITHOUT_AUTOGRAD,
    LEAVES_A_NOTE,
    LOOP_IN_EVERY_FORWARD,
    LOOP_IN_FORWARD,
    MEMORY_HOG,
    MEMORY_IN_CHILDREN,
    MUTATES_INPUT,
    NON_TENSORS,
    PRINT_FLOOD,
    READS_THE_NOTE,
    SEGFAULT_IN_FORWARD,
    SLOW_EVERY_FORWARD,
    SYS_EXIT_AT_IMPORT,
    definitions,
    escape_attempts,
    hostile_server,
    notebook_with_magics,
    processes_with,
    reference_theft,
    sandbox_probe,
    with_cells,
)

# Every test grades whole submissions; the first waits for the whole table to be graded (several minutes).
pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.timeout(1800)]

RELEASE = ROOT / "assignments" / "release" / "mha" / "mha.py"
# Bounds on every grading here, whatever the submission does (measured on a shared 2-core machine with its
# load average at 4-8: the grader's own peak stays under 500 MiB, a grading under 90 s). One answer costs the
# grader at most its blobs once (the rubric's reply_mib, 512) and a header of at most 1 MiB of JSON; the
# bloated_forward_replies case sends exactly that, to every forward: the grader peaked at 811 MiB (graded
# alone), where it once held the blob twice and copied it again (1.6 GB for one such answer).
GRADER_PEAK_MIB = 1024  # the grader's own peak memory (resident), as it records in results.json
WALL_SECONDS = 240  # one grading, start to end, in a pool of two
HANG_LIMIT_SECONDS = 60  # product requirement: a submission hanging in every forward is graded within this
RESULTS_LIMIT_BYTES = 200 << 10  # a 100 MiB print flood must not make results.json big
REQUEST_SECONDS = load_rubric().limits.request_seconds
REQUEST_FLOOR = load_rubric().limits.request_floor_seconds  # an endless loop is stopped by its CPU time

# -- the cases -----------------------------------------------------------------------------------------------


@dataclass
class Context:
    """Where one submission lives and is graded, and what its attack may mention."""

    submission_dir: Path
    out_dir: Path
    marker: str  # a word unique to this test run
    sandboxed: bool  # namespace isolation is available, so the worker gets it

    stem: str = "mha"  # the submission file's name, before its suffix

    @property
    def out_file(self) -> Path:
        return self.out_dir / f"{self.stem}-results.json"  # what helpers.grade passes as --out


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Context], str]
    lost: dict[str, str]  # part -> "all" (0 points) or "some" (less than full); every other part keeps full marks
    says: tuple[str, ...]  # each appears in a lost part's failure output or in results["output"]
    only: dict[str, tuple[str, ...]] = field(default_factory=dict)  # part -> the only check keys that may fail
    suffix: str = ".py"
    limits: tuple[tuple[str, float], ...] = ()  # rubric limits changed for this case (a copy of the rubric)
    wall_seconds: float = 0  # the grading's wall-time bound (0: WALL_SECONDS)
    stem: str = "mha"  # the file's name, before its suffix


# fuse_heads' module runs the student's forward; no forward, or a wrong one, earns no speed points
# a mistake costs points once: fuse_heads builds the right module whatever MultiHeadAttention.forward does,
# and the speed part counts only when the values are right
MHA_FORWARD_BROKEN = {"mha": "all", "speed": "all"}
EVERY_PART = {part: "all" for part in ("quiz", "combine", "wrapper", "two_dim", "columns", "mha", "fuse", "speed")}

CASES = [
    # slowest first (they wait out request deadlines), the CPU burner last
    Case(
        "dies_after_each_answer",
        lambda c: with_cells(first=DIES_AFTER_EACH_ANSWER.replace("{marker}", c.marker)),
        EVERY_PART,
        ("waiting for the grader's next request", "the worker is not restarted again"),
    ),
    Case(
        "loop_in_every_forward",
        lambda c: with_cells(last=LOOP_IN_EVERY_FORWARD),
        {"wrapper": "all", "mha": "all", "speed": "all"},
        ("MultiHeadAttentionWrapper.forward did not finish within", "MultiHeadAttention.forward did not finish within"),
    ),
    Case(
        "loop_in_mha_forward",
        lambda c: with_cells(last=LOOP_IN_FORWARD),
        MHA_FORWARD_BROKEN,
        (f"MultiHeadAttention.forward did not finish within {REQUEST_FLOOR:g} s of CPU time", "not tried again"),
    ),
    Case(
        "exit_in_mha_forward",
        lambda c: with_cells(last=EXIT_IN_FORWARD),
        MHA_FORWARD_BROKEN,
        ("ended while MultiHeadAttention.forward: it exited with status 3", "not tried again"),
    ),
    Case(
        "segfault_in_mha_forward",
        lambda c: with_cells(last=SEGFAULT_IN_FORWARD),
        MHA_FORWARD_BROKEN,
        ("ended by SIGSEGV (a segmentation fault)",),
    ),
    Case(
        "non_tensors",
        lambda c: with_cells(last=NON_TENSORS.replace("{marker}", str(c.out_dir / c.marker))),
        {"wrapper": "all", "two_dim": "all", "mha": "all", "fuse": "all", "speed": "all"},
        (
            "expected a tensor, got tuple",
            "expected a tensor, got Foreign <_Hostile (unprintable)>",
            # the tensor subclass whose pickle would run a command crosses as plain bytes: nothing to unpickle
            "fuse_heads returned tensor([0., 0.]); it must return a MultiHeadAttention",
        ),
    ),
    Case(
        "print_flood_at_import",
        lambda c: with_cells(first=PRINT_FLOOD),
        {},
        ("flood flood", "more bytes of output not kept"),
    ),
    Case(
        "exit_at_import",
        lambda c: with_cells(last=EXIT_AT_IMPORT),
        EVERY_PART,
        ("Your file could not be loaded", "exited with status 3"),
    ),
    Case(
        "sys_exit_at_import",
        lambda c: with_cells(first=SYS_EXIT_AT_IMPORT),
        {},
        ("cell 1 raised SystemExit: no grading today",),
    ),
    Case(
        "memory_hog_in_mha_forward",
        lambda c: with_cells(last=MEMORY_HOG),
        MHA_FORWARD_BROKEN,
        ("RuntimeError", "can't allocate memory"),
    ),
    # wrong values: and so no points for the properties of a right answer either
    Case(
        "patched_comparisons",
        lambda c: with_cells(last=FAKE_EQUALITY),
        {"mha": "all", "speed": "all"},
        ("values differ from the reference",),
    ),
    Case(
        "cached_by_shape",
        lambda c: with_cells(last=CACHED_BY_SHAPE),
        {"mha": "some", "speed": "all"},
        ("output for new input number 2 of the same shape", "kept from an earlier call"),
        # captured, its cached answer is a constant of the graph: wrong on the new input the structure checks
        # replay it on ("kept from an earlier call")
        {
            "mha": (
                "mha::test_new_inputs_new_answers",
                "mha::test_one_pass_for_all_heads",
                "mha::test_no_ready_made_attention",
            )
        },
    ),
    Case(
        "mutates_input",
        lambda c: with_cells(last=MUTATES_INPUT),
        {"mha": "some"},
        ("the forward modified its input x in place",),
        {"mha": ("mha::test_input_not_modified",)},
    ),
    Case(
        "fake_results_and_conftest",
        lambda c: with_cells(
            first=escape_attempts([c.out_file], [c.submission_dir, c.out_dir], parents=c.sandboxed),
            last=BROKEN_MHA_FORWARD,
        ),
        MHA_FORWARD_BROKEN,
        ("ESCAPE", "MultiHeadAttention.forward is not written yet"),
    ),
    Case(
        "reference_theft",
        lambda c: with_cells(last=reference_theft(ROOT)),
        MHA_FORWARD_BROKEN,
        ("THEFT BLOCKED import", "MultiHeadAttention.forward is not written yet"),
    ),
    Case("notebook_with_magics", lambda c: notebook_with_magics(), {}, (), suffix=".ipynb"),
    # its burners run only in its own requests (stopped outside them and while anything is timed), and what is
    # timed is its forward's graph, replayed where they are not: they change nothing but its own checks' pace
    Case(
        "background_burner",
        lambda c: with_cells(last=BACKGROUND_BURNER.replace("{marker}", c.marker)),
        {},
        ("BURNING in a process and a thread",),
    ),
]


def sandbox_targets(c: Context) -> dict:
    shared = c.submission_dir.parent
    return {
        "root_secret": str(shared / "root-only" / "secret"),
        "classmate": str(shared / "classmate" / "mha.py"),
        "socket": str(shared / "host.sock"),
        "shm_key": shm_key(c.marker),
    }


def shm_key(marker: str) -> int:
    return int(marker.removeprefix("hostile-")[:7], 16)


def notebook_with_source(source) -> str:
    cell = {"cell_type": "code", "source": source, "metadata": {}, "outputs": [], "execution_count": None}
    return json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


# A file name holds no slash: the OSC 8 link's address has none.
HOSTILE_STEM = "\x1b]8;;https:evil.example\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x9b1mmha\u202eyp"
ANY = "any"  # a part that must lose points, some or all
MAY = "may"  # a part whose points depend on more than the attack (speed, for a forward that does extra work)

CASES += [
    # replies that break the protocol: refused before anything is materialised, the worker replaced
    Case(
        "tampered_load_reply",
        lambda c: with_cells(last=hostile_server(load="tampered")),
        EVERY_PART,
        ("could not be read safely", "field 'type'"),
    ),
    Case(
        "hostile_replies",
        lambda c: with_cells(
            last=hostile_server(forward="huge_blob", call="message", get="node_bomb", build_mha="deep")
        ),
        {part: ANY for part in EVERY_PART},
        ("could not be read safely",),
    ),
    # shapes that overflow torch's sizes, announced in 0 bytes: once `cannot_grade` every time (torch.empty raised
    # TypeError in the grader); now the worker's fault, refused before torch sees them
    Case(
        "overflowing_reply_shapes",
        lambda c: with_cells(last=hostile_server(call="overflow", forward="overflow_forward")),
        {part: ANY for part in EVERY_PART if part != "quiz"},
        ("could not be read safely", "larger than any answer may be"),
    ),
    # escapes in the file's own name (an OSC 8 link, an OSC 52 clipboard write, a CSI, a bidi override): graded
    # as the reference is, and the name reaches results.json cleaned (once it was kept raw)
    Case("escapes_in_the_file_name", lambda c: definitions(), {}, (), stem=HOSTILE_STEM),
    # the grader's memory: the largest answer the limits allow, to every forward (see GRADER_PEAK_MIB)
    Case(
        "bloated_forward_replies",
        lambda c: with_cells(last=hostile_server(forward="bloated")),
        {"wrapper": "all", "mha": "all", "speed": "all"},
        ("could not be read safely",),
    ),
    Case(
        "expanded_output",
        lambda c: with_cells(last=EXPANDED_OUTPUT),
        MHA_FORWARD_BROKEN,
        ("bytes of tensors (the limit is",),
    ),
    # the sandbox: every way out tried at import; the definitions that follow earn full marks
    Case(
        "sandbox_probe",
        lambda c: with_cells(first=sandbox_probe(sandbox_targets(c), c.marker)),
        {},
        ("PROBE forks",),
        limits=(("processes", 128), ("cell_seconds", 30)),
    ),
    Case(
        "memory_in_children",
        lambda c: with_cells(first=MEMORY_IN_CHILDREN.format(mib=700)),
        {},
        ("MEMORY CHILDREN still running:",),
        limits=(("memory_gib", 2), ("cell_seconds", 60)),
    ),
    Case(
        "slow_every_forward",
        lambda c: with_cells(last=SLOW_EVERY_FORWARD.format(seconds=REQUEST_SECONDS - 1, marker=c.marker)),
        # alphabetically, columns and combine are checked before the budget runs out, the rest after
        {part: ANY for part in ("fuse", "mha", "quiz", "speed", "two_dim", "wrapper")},
        ("time budget for the whole submission",),
        limits=(("submission_seconds", 40),),
        wall_seconds=150,
    ),
    # the fourth audit: what the worker observed of itself was forged. The structure checks and the speed part
    # judge a graph captured from the forward, replayed where no student code runs: what was hidden from it is a
    # constant there, wrong on a new input; a kernel the capture sees is refused
    Case(
        "hides_the_loop_from_the_capture",
        lambda c: with_cells(last=HIDES_THE_LOOP),
        {"mha": "some", "speed": "all"},
        ("not right on a new input",),
        {"mha": ("mha::test_one_pass_for_all_heads", "mha::test_no_ready_made_attention")},
    ),
    Case(
        "hides_the_kernel_from_the_capture",
        lambda c: with_cells(last=HIDES_THE_KERNEL),
        {"mha": "some", "speed": "all"},
        ("not right on a new input",),
        {"mha": ("mha::test_one_pass_for_all_heads", "mha::test_no_ready_made_attention", "mha::test_dropout")},
    ),
    Case(
        "kernel_without_autograd",
        lambda c: with_cells(last=KERNEL_WITHOUT_AUTOGRAD),
        {"mha": "some", "speed": "all"},  # captured without autograd: the kernel, refused
        ("scaled_dot_product_attention",),
        {"mha": ("mha::test_one_pass_for_all_heads", "mha::test_no_ready_made_attention")},
    ),
    Case(
        "kernel_when_timed_by_frame",
        lambda c: with_cells(last=KERNEL_WHEN_TIMED_BY_FRAME),
        {"mha": "some", "speed": "all"},  # captured in its own request: the loop, which is what is timed
        ("Compute every head in one batched pass",),
        {"mha": ("mha::test_one_pass_for_all_heads",)},
    ),
    Case(
        "calls_fused_multi_head_attention",
        lambda c: with_cells(last=CALLS_FUSED_MHA),
        {"mha": "some", "speed": MAY},
        ("scaled_dot_product_attention",),  # its slow path, as the capture sees it: the kernel, by its ATen name
        {"mha": ("mha::test_no_ready_made_attention",)},
    ),
    Case("hides_its_input_mutation", lambda c: with_cells(last=HIDES_ITS_MUTATION), {}, ()),
    # the speed part: a loop over heads that batches the timed calls it can see coming, from its callers'
    # frames or by patching the worker's timed request, earned full speed points while a request carried
    # every call's seed; one seed per call, timed by the grader, leaves it the loop it is
    Case(
        "batches_the_timed_calls",
        lambda c: with_cells(last=speed_variants.LOOKS_UP_SEEDS),
        {"mha": ANY, "speed": "all"},  # a loop over heads underneath: its structure check costs it too
        ("Compute every head in one batched pass",),
    ),
    Case(
        "patches_the_timed_request",
        lambda c: with_cells(last=speed_variants.PATCHES_THE_SERVER),
        {"mha": ANY, "speed": "all"},  # a loop over heads underneath: its structure check costs it too
        ("Compute every head in one batched pass",),
    ),
    # files that once took the grader's memory or crashed it while reading them
    Case("py_of_40000_cells", lambda c: "# %%\n1\n" * 40_000, EVERY_PART, ()),
    Case("notebook_dict_source", lambda c: notebook_with_source({"not": "code"}), EVERY_PART, (), suffix=".ipynb"),
    Case("notebook_int_source", lambda c: notebook_with_source(12), EVERY_PART, (), suffix=".ipynb"),
]
if RELEASE.exists():  # generated by `make release`; graded here as it is, stubs and all
    CASES.append(
        Case(
            "untouched_release",
            lambda c: RELEASE.read_text(),
            EVERY_PART,
            ("not done yet: this still raises NotImplementedError",),
        )
    )
CASES_BY_ID = {case.id: case for case in CASES}


def rubric_with(path: Path, limits) -> Path:
    """A copy of the packaged rubric with some limits changed."""
    text = DEFAULT_RUBRIC.read_text()
    for name, value in limits:
        text, count = re.subn(rf"(?m)^{name} = \S+", f"{name} = {value:g}", text)
        assert count == 1, name
    path.write_text(text)
    return path


@dataclass
class Graded:
    context: Context
    results: dict
    returncode: int
    stderr: str
    wall_seconds: float
    results_bytes: int
    before: dict[str, bool]  # host paths the submission might write -> whether they existed before grading


class Gradings(dict):
    """The cases graded so far, by id; a case not graded yet is graded when it is first asked for."""

    def __init__(self, grade_case: Callable[[Case], Graded]):
        super().__init__()
        self.grade_case = grade_case

    def __missing__(self, key: str) -> Graded:
        self[key] = self.grade_case(CASES_BY_ID[key])
        return self[key]


def selected_cases(session: pytest.Session) -> list[Case]:
    """The cases the selected tests are parametrised with (all of them when the whole file runs)."""
    wanted = set()
    for item in session.items:
        if getattr(item, "module", None) is not sys.modules[__name__]:
            continue  # another file's parameters (a wrong submission's `Mistake`) name no case of this table
        for value in getattr(getattr(item, "callspec", None), "params", {}).values():
            if isinstance(value, (Case, str)):
                wanted.add(value.id if isinstance(value, Case) else value)
    return [case for case in CASES if case.id in wanted]


@pytest.fixture(scope="session")
def graded(tmp_path_factory, request) -> Iterator[dict[str, Graded]]:
    """Every case the selected tests ask for graded once, two at a time (the whole table when the whole file
    runs); any other case a test asks for is graded then."""
    marker = f"hostile-{uuid.uuid4().hex[:12]}"
    # what the grader will use: namespace isolation where available, unless told otherwise
    sandboxed = namespace_sandbox_available() and os.environ.get("AUTOGRADER_ISOLATION", "auto") != "process"
    root = tmp_path_factory.mktemp("hostile")

    # what the sandbox probe reaches for: a root-only file, a classmate's submission, a listening host socket
    (root / "root-only").mkdir(mode=0o700)
    (root / "root-only" / "secret").write_text("the grader's secret\n")
    (root / "root-only" / "secret").chmod(0o600)
    (root / "classmate").mkdir()
    (root / "classmate" / "mha.py").write_text(REFERENCE.read_text())
    host_socket = socket.socket(socket.AF_UNIX)
    host_socket.bind(str(root / "host.sock"))
    host_socket.listen(8)

    def run(case: Case) -> Graded:
        context = Context(root / case.id, root / f"{case.id}-out", marker, sandboxed, case.stem)
        context.submission_dir.mkdir()
        context.out_dir.mkdir()
        path = context.submission_dir / f"{case.stem}{case.suffix}"
        path.write_text(case.build(context))
        watched = [
            p / name
            for p in (Path(tempfile.gettempdir()), Path("/"), Path.home(), *root.parents)
            for name in ("results.json", "conftest.py")
        ]
        before = {str(p): p.exists() for p in watched}
        extra = ["--rubric", str(rubric_with(root / f"{case.id}-rubric.toml", case.limits))] if case.limits else []
        started = time.monotonic()
        results, run = grade(path, context.out_dir, *extra)
        wall = time.monotonic() - started
        return Graded(context, results, run.returncode, run.stderr, wall, context.out_file.stat().st_size, before)

    gradings = Gradings(run)
    try:
        cases = selected_cases(request.session)
        with ThreadPoolExecutor(max_workers=2) as pool:
            gradings.update(zip([case.id for case in cases], pool.map(run, cases), strict=True))
        yield gradings
    finally:
        host_socket.close()


def check_names(results: dict) -> dict[tuple[str, str], str]:
    """{(check key, case): status}: every case of every check (a row counts its cases, and names those that
    did not pass)."""
    names = {}
    for test in results["tests"]:
        extra = test.get("extra_data") or {}
        for case in extra.get("cases") or [""]:
            failed = test["status"] != "passed" and (not case or case in extra.get("failed_cases", [case]))
            names[(test["tags"][1], case)] = "failed" if failed else "passed"
    return names


def lost_part_messages(results: dict, parts) -> str:
    return "\n".join(t["output"] for part in parts for t in failures(results, part))


# -- what every case must satisfy ----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_contained_and_scored_for_what_it_deserves(graded, reference_results, case):
    got = graded[case.id]
    results = got.results
    assert got.returncode == 0, f"the grader exited {got.returncode}: it must exit 0 whenever it graded\n{got.stderr}"
    peak = results["extra_data"]["resources"]["grader_peak_mib"]
    assert peak < GRADER_PEAK_MIB, f"the grader's own memory peaked at {peak:,.0f} MiB"
    wall = case.wall_seconds or WALL_SECONDS
    assert got.wall_seconds < wall, f"grading took {got.wall_seconds:.0f} s (the bound is {wall:g} s)"
    assert "Traceback" not in got.stderr and "INTERNALERROR" not in got.stderr, got.stderr
    # The grader's own, complete results: every check of the reference's run, each one run.
    assert results["extra_data"]["isolation"] in ("namespace", "process")
    assert set(check_names(results)) == set(check_names(reference_results))
    assert not [t["name"] for t in results["tests"] if "the grading run ended before this check" in t["output"]]
    assert results["max_score"] == reference_results["max_score"]

    scores, full = part_scores(results), part_scores(reference_results)
    for part, (score, max_score) in scores.items():
        assert full[part] == (max_score, max_score), f"the reference must get full marks in {part}"
        if part not in case.lost:
            assert score == max_score, f"{part} must keep full marks, got {score}/{max_score}:\n" + lost_part_messages(
                results, [part]
            )
        elif case.lost[part] == "all":
            assert score == 0, f"{part} must lose every point, got {score}/{max_score}"
        elif case.lost[part] == ANY:
            assert score < max_score, f"{part} must lose points, got {score}/{max_score}"
        elif case.lost[part] == MAY:
            pass
        else:
            assert 0 < score < max_score, f"{part} must lose some points, got {score}/{max_score}"
    for part, keys in case.only.items():
        failed = {t["tags"][1] for t in failures(results, part)}
        assert failed and failed <= set(keys), f"{part}: only {keys} may fail, these did: {sorted(failed)}"

    said = lost_part_messages(results, case.lost) + "\n" + results["output"]
    for words in case.says:
        assert words in said, f"{words!r} is not in the failure messages or the output:\n{said[-3000:]}"


# -- what particular cases must also satisfy -----------------------------------------------------------------


@pytest.mark.slow
def test_a_submission_hanging_in_every_forward_is_graded_within_a_minute(graded):
    got = graded["loop_in_every_forward"]
    assert got.results["extra_data"]["worker_starts"] >= 3  # killed at each of two hung targets, restarted
    assert got.wall_seconds < HANG_LIMIT_SECONDS, (
        f"grading took {got.wall_seconds:.1f} s (execution_time {got.results['execution_time']} s) for a "
        f"submission that hangs in every forward; the limit is {HANG_LIMIT_SECONDS} s"
    )


@pytest.mark.slow
@pytest.mark.parametrize("case", ["exit_in_mha_forward", "segfault_in_mha_forward", "loop_in_mha_forward"])
def test_a_killed_worker_is_replaced_for_the_checks_after_it(graded, case):
    results = graded[case].results
    assert results["extra_data"]["worker_starts"] >= 2
    # the checks run after the crash (alphabetically, mha comes before quiz, two_dim and wrapper) pass
    assert all(t["status"] == "passed" for t in results["tests"] if t["tags"][0] in ("quiz", "two_dim", "wrapper"))


@pytest.mark.slow
def test_a_print_flood_is_truncated_and_results_stay_small(graded):
    got = graded["print_flood_at_import"]
    assert got.results_bytes < RESULTS_LIMIT_BYTES, f"results.json is {got.results_bytes:,} bytes"
    assert len(got.results["output"]) < 32 << 10


@pytest.mark.slow
def test_patched_comparisons_stay_in_the_worker(graded):
    """torch.allclose / torch.equal / Tensor.__eq__ patched in the worker change nothing in the grader."""
    results = graded["patched_comparisons"].results
    assert results["score"] < 100
    assert "largest difference" in lost_part_messages(results, ["mha"])


@pytest.mark.slow
def test_background_processes_do_not_outlive_the_grading(graded):
    alive = processes_with(graded["background_burner"].context.marker)
    assert not alive, f"the submission's burner processes {alive} survived the grading"


@pytest.mark.slow
def test_a_worker_that_keeps_dying_between_requests_is_graded_not_cannot_grade(graded):
    """Restarted once (its restart bounded by the check's budget), then given up on: graded 0 in every part
    with the reason (the table's test), never "cannot grade", and nothing of it left running."""
    got = graded["dies_after_each_answer"]
    assert got.results["extra_data"]["status"] == "graded" and got.returncode == 0
    assert got.results["extra_data"]["worker_starts"] == 2
    marker = got.context.marker
    left = [
        cmdline.parent.name
        for cmdline in Path("/proc").glob("[0-9]*/cmdline")
        if cmdline.parent.name != str(os.getpid()) and marker.encode() in _read_or_empty(cmdline)
    ]
    assert not left, f"the submission's processes {left} survived the grading"


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


@pytest.mark.slow
def test_a_pickle_that_runs_a_command_is_never_unpickled_by_the_grader(graded):
    got = graded["non_tensors"]
    assert not (got.context.out_dir / got.context.marker).exists(), "the grader unpickled the submission's object"
    # nothing from the worker is unpickled: the subclass crossed as a dtype, a shape and its bytes
    fuse = [t["output"] for t in got.results["tests"] if t["tags"][0] == "fuse"]
    assert fuse and all("fuse_heads returned tensor([0., 0.])" in text for text in fuse)


@pytest.mark.slow
def test_fake_results_and_conftest_files_change_nothing(graded, reference_results):
    got = graded["fake_results_and_conftest"]
    context, results = got.context, got.results
    # The final results.json is the grader's, written after the worker was killed.
    on_disk = json.loads(context.out_file.read_text())
    assert on_disk["score"] == results["score"] != 1000 and on_disk["output"] != "hacked"
    assert checks_run(on_disk) == checks_run(reference_results)
    wrote = [line.split(" ", 2)[2] for line in results["output"].splitlines() if line.startswith("ESCAPE WROTE ")]
    blocked = [line for line in results["output"].splitlines() if line.startswith("ESCAPE BLOCKED ")]
    assert blocked or wrote, "the escape attempts were not reported: the worker's output was lost"
    if not context.sandboxed:
        pytest.skip(
            "process isolation: the worker can write where the grader's user can; only the final "
            "results.json is checked"
        )
    assert str(context.out_file) not in wrote and not any(w.startswith(str(context.submission_dir)) for w in wrote)
    assert sorted(p.name for p in context.out_dir.iterdir()) == [context.out_file.name]
    assert sorted(p.name for p in context.submission_dir.iterdir()) == ["mha.py"]
    appeared = [path for path, existed in got.before.items() if not existed and Path(path).exists()]
    assert not appeared, f"files written by the sandboxed submission appeared outside it: {appeared}"
    for path in wrote:  # what the sandbox let it write (its own scratch tmpfs) vanished with it
        assert got.before.get(path, False) or not Path(path).exists(), f"{path} leaked out of the sandbox"


@pytest.mark.slow
def test_the_reference_cannot_be_imported_or_read(graded):
    got = graded["reference_theft"]
    output = got.results["output"]
    assert "THEFT BLOCKED import" in output and "THEFT BLOCKED path" in output
    assert "THEFT SUCCEEDED by" not in output
    if not got.context.sandboxed:
        pytest.skip("process isolation: the grader's files stay readable by path (results.json says so)")
    assert "THEFT SUCCEEDED" not in output
    assert output.count("THEFT BLOCKED reading") == 2


@pytest.mark.slow
def test_a_notebook_with_magics_is_graded_like_its_py_twin(graded, reference_results):
    results = graded["notebook_with_magics"].results
    assert check_names(results) == check_names(reference_results)
    assert results["score"] == reference_results["score"] == reference_results["max_score"]
    assert "raised" not in results["output"], results["output"]  # no cell failed to load


# -- the untouched release and the reference -----------------------------------------------------------------


@pytest.mark.slow
def test_the_untouched_release_gets_zero_and_the_reference_full_marks(graded, reference_results):
    assert reference_results["score"] == reference_results["max_score"] == 100
    if "untouched_release" not in graded:
        pytest.skip(f"{RELEASE.relative_to(ROOT)} is not generated yet (make release)")
    results = graded["untouched_release"].results  # exit code 0 and no grader error: checked with every case
    assert results["score"] == 0
    for test in results["tests"]:
        assert test["status"] == "failed" and test["output"], test
        assert "Traceback (most recent call last)" not in test["output"], test


# -- replies, files and limits: what particular cases must also satisfy ---------------------------------------

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


@pytest.mark.slow
def test_replies_that_break_the_protocol_leave_small_clean_results(graded):
    """Nested 200,000 deep, a 2 GiB tensor announced, 300,000 values, 270,000-character error messages full of
    escape sequences and lone surrogates: each is refused or truncated and cleaned at the protocol's edge."""
    got = graded["hostile_replies"]
    assert got.results_bytes < RESULTS_LIMIT_BYTES, f"results.json is {got.results_bytes:,} bytes"
    dirty = [text[:80] for text in strings(got.results) if CONTROL.search(text)]
    assert not dirty, dirty
    said = "\n".join(t["output"] for t in got.results["tests"])
    for reason in ("not JSON", "bytes of tensors", "too many values", "more characters]"):
        assert reason in said + got.results["output"], reason
    assert "\x1b" not in got.stderr


@pytest.mark.slow
def test_the_sandbox_probe_finds_every_way_out_closed(graded):
    got = graded["sandbox_probe"]
    probes = dict(line.split(" ", 2)[1:] for line in got.results["output"].splitlines() if line.startswith("PROBE "))
    assert len(probes) == 9, got.results["output"]
    if cgroups_available():
        assert int(probes.pop("forks")) < 128  # the process limit held (the rubric's, for this case)
    else:
        probes.pop("forks")
    if not got.context.sandboxed:
        pytest.skip("process isolation: the worker reaches what its user may (results.json says so)")
    opened = {
        name: result
        for name, result in probes.items()
        if not (result.startswith("blocked") or name in ("sysv_shm", "posix_mq"))
    }
    assert not opened, opened
    # made inside its own IPC namespace, gone with it: the host never saw them
    host_keys = [line.split()[0] for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
    assert str(shm_key(got.context.marker)) not in host_keys
    assert not Path("/dev/mqueue", got.context.marker).exists()


@pytest.mark.slow
def test_memory_is_limited_for_all_the_submissions_processes_together(graded):
    got = graded["memory_in_children"]
    guarantee = got.results["extra_data"]["machine"]["guarantee_memory"]
    if "together" not in guarantee or "swap not limited" in guarantee:
        # then the grading says so, and three children of 700 MiB each may all live
        pytest.skip(f"the memory limit here is not for all processes together: {guarantee}")
    assert "MEMORY CHILDREN still running:" in got.results["output"]
    assert "MEMORY CHILDREN still running: 3" not in got.results["output"]
    assert got.results["extra_data"]["resources"]["worker_peak_mib"] <= 2048 + 64


@pytest.mark.slow
def test_a_submission_slow_in_every_answer_stops_at_its_time_budget(graded):
    got = graded["slow_every_forward"]
    assert got.results["execution_time"] < 40 + 60  # the budget, plus starting and scoring


@pytest.mark.slow
def test_a_file_name_with_escapes_reaches_results_json_cleaned(graded, reference_results):
    """The file's own name is the student's choice: once results.json kept its ESC and OSC sequences raw."""
    got = graded["escapes_in_the_file_name"]
    text = got.context.out_file.read_text()
    assert not CONTROL.search(text) and "\u202e" not in text, text[:1000]
    assert got.results["extra_data"]["submission"] == clean_text(HOSTILE_STEM + ".py", 1000)
    assert got.results["score"] == reference_results["score"] == 100
    assert "\x1b" not in got.stderr


# -- process isolation: the fallback cannot forge results or survive -----------------------------------------

KILL_THE_GRADER = """
import os, signal
os.kill(os.getppid(), signal.SIGKILL)
"""

# A setsid child that waits for the grader to exit, then writes a perfect results.json ({marker}: to find it).
REWRITE_RESULTS_LATER = '''
import os, subprocess, sys
subprocess.Popen([sys.executable, "-c", """
import os, sys, time
while os.path.exists("/proc/" + sys.argv[1]):
    time.sleep(0.05)
with open(sys.argv[2], "w") as handle:
    handle.write('{{"score": 100, "max_score": 100, "output": "hacked", "tests": []}}')
# {marker}
""", str(os.getppid()), {out!r}], start_new_session=True)
'''


@pytest.fixture(scope="module")
def process_isolated(tmp_path_factory) -> dict[str, Graded]:
    marker = f"hostile-{uuid.uuid4().hex[:12]}"
    root = tmp_path_factory.mktemp("process-isolation")
    sources = {
        "kill_the_grader": lambda c: with_cells(first=KILL_THE_GRADER),
        "rewrite_results_later": lambda c: with_cells(
            first=REWRITE_RESULTS_LATER.format(marker=marker, out=str(c.out_file)), last=BROKEN_MHA_FORWARD
        ),
    }

    def run(name: str) -> Graded:
        context = Context(root / name, root / f"{name}-out", marker, sandboxed=False)
        context.submission_dir.mkdir()
        context.out_dir.mkdir()
        path = context.submission_dir / "mha.py"
        path.write_text(sources[name](context))
        started = time.monotonic()
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "autograder",
                "grade",
                str(path),
                "--out",
                str(context.out_file),
                "--quiet",
                "--isolation",
                "process",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=context.out_dir,
        )
        wall = time.monotonic() - started
        time.sleep(2)  # time for anything left behind to act
        results = json.loads(context.out_file.read_text())
        return Graded(context, results, run.returncode, run.stderr, wall, context.out_file.stat().st_size, {})

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(sources, pool.map(run, sources)))


@pytest.mark.slow
def test_a_killed_grader_leaves_results_saying_so(process_isolated):
    got = process_isolated["kill_the_grader"]
    if got.returncode == 0:
        assert got.results["extra_data"]["status"] == "graded"
        if got.results["score"] < 100:
            # as the grader's own user, a worker forked from a fork server: its parent is the fork server, which
            # it killed, and itself with it (it dies with its parent); the grader went on, and says so
            assert "ended by SIGKILL" in got.results["output"], got.results["output"][:2000]
        return  # else a fresh uid: it may not signal the grader, and its file loads whole
    assert got.returncode == -9
    assert got.results["extra_data"]["status"] == "cannot_grade"
    assert "did not finish" in got.results["extra_data"]["reason"]


@pytest.mark.slow
def test_no_process_of_the_submission_rewrites_results_after_grading(process_isolated, reference_results):
    got = process_isolated["rewrite_results_later"]
    assert got.returncode == 0, got.stderr
    assert got.results["output"] != "hacked" and got.results["score"] < 100
    assert checks_run(got.results) == checks_run(reference_results)
    assert not processes_with(got.context.marker)


# -- process isolation: what a worker leaves in the machine's world-writable folders reaches no classmate ------

WORLD_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock")  # where they exist
BIG_MIB = 320  # more than a worker's largest file (the namespace sandbox's whole /tmp, 256 MiB)


@pytest.fixture(scope="module")
def left_for_a_classmate(tmp_path_factory) -> Iterator[tuple[dict[str, Graded], list[str]]]:
    """Round 4: a submission that leaves a note (and a big file) in every world-writable folder, then a later
    student's that looks for them, graded one after the other as Gradescope grades (process isolation, each
    worker a fresh uid: root's grader, from the copy of the project every user may read,
    `environments.system_project`); and what is left of the first once both are graded."""
    if os.geteuid() != 0:
        pytest.skip("a fresh uid per worker needs a root grader")
    import environments

    python = environments.system_project() / ".venv" / "bin" / "python"
    marker = f"hostile-{uuid.uuid4().hex[:12]}"
    root = tmp_path_factory.mktemp("left-for-a-classmate")
    shared = Path("/tmp") / f"shared-{marker}"  # a folder open to all below /tmp, as /tmp/.X11-unix
    shared.mkdir()
    shared.chmod(0o1777)
    places = [p for p in WORLD_WRITABLE if os.path.isdir(p)]
    fill = {"places": places, "shared": str(shared), "marker": marker, "big_mib": BIG_MIB}
    sources = {"leaves_a_note": LEAVES_A_NOTE.format(**fill), "reads_the_note": READS_THE_NOTE.format(**fill)}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOGRADER_", "PYTEST"))}

    def left() -> list[str]:
        return sorted(str(p) for folder in [*places, shared] for p in Path(folder).glob(f"{marker}-*"))

    graded = {}
    try:
        for name, source in sources.items():  # in turn: the second is the later student
            context = Context(root / name, root / f"{name}-out", marker, sandboxed=False)
            context.submission_dir.mkdir()
            context.out_dir.mkdir()
            path = context.submission_dir / "mha.py"
            path.write_text(with_cells(first=source))
            command = [str(python), "-m", "autograder", "grade", str(path), "--out", str(context.out_file), "--quiet"]
            started = time.monotonic()
            run = subprocess.run(
                [*command, "--isolation", "process"], capture_output=True, text=True, timeout=600, cwd=root, env=env
            )
            wall = time.monotonic() - started
            results = json.loads(context.out_file.read_text())
            graded[name] = Graded(context, results, run.returncode, run.stderr, wall, 0, {})
        yield graded, left()
    finally:
        for path in left():
            Path(path).unlink()
        shared.rmdir()


@pytest.mark.slow
def test_what_a_worker_leaves_in_world_writable_folders_never_reaches_a_later_one(left_for_a_classmate):
    graded, left = left_for_a_classmate
    writer, reader = graded["leaves_a_note"], graded["reads_the_note"]
    for got in (writer, reader):
        assert got.returncode == 0, got.stderr
        assert got.results["extra_data"]["isolation"] == "process"
        assert "fresh unprivileged uid" in got.results["extra_data"]["sandbox"]["user"]
        assert got.results["extra_data"]["status"] == "graded"
    wrote, read = writer.results["output"], reader.results["output"]
    held = {
        "a note left in /run/lock": "LEFT a note in /run/lock" in wrote,
        "its big file cut at 256 MiB": "BIG stopped at 256 MiB: File too large" in wrote,
        "the later worker found nothing": "NOTHING LEFT by an earlier worker" in read,
        "nothing of it left after both": left == [],
    }
    assert all(held.values()), (held, wrote[-1500:], read[-1500:], left)


def cgroups_available() -> bool:
    from test_sandbox import cgroups_available as available

    return available()


# -- a class graded together ---------------------------------------------------------------------------------

# 64 busy setsid processes and a non-daemon thread, started at import ({marker}: to find them afterwards).
CPU_HOG = """
import subprocess, sys, threading, time
threading.Thread(target=time.sleep, args=(3600,)).start()
_hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass  # {marker}"], start_new_session=True)
         for _ in range(64)]
"""


@pytest.mark.slow
def test_classmates_graded_alongside_a_cpu_hog_keep_full_marks(tmp_path):
    """grade-class, three at a time: the hog's 64 busy processes share one CPU quota and one weight, so
    its classmates' requests meet their deadlines; nothing of the hog is left when grade-class returns."""
    if not cgroups_available():
        pytest.skip("no control groups here: a CPU hog can slow others graded at the same time")
    marker = f"hostile-{uuid.uuid4().hex[:12]}"
    course = tmp_path / "course"
    sources = {"alice": definitions(), "bob": definitions(), "hog": with_cells(first=CPU_HOG.format(marker=marker))}
    for student, source in sources.items():
        folder = course / "submitted" / student / "mha"
        folder.mkdir(parents=True)
        (folder / "mha.py").write_text(source)
    rubric = rubric_with(tmp_path / "rubric.toml", (("submission_seconds", 90),))
    started = time.monotonic()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade-class",
            str(course),
            "--jobs",
            "3",
            "--device",
            "cpu",
            "--rubric",
            str(rubric),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    wall = time.monotonic() - started
    assert run.returncode == 0, run.stderr[-3000:]
    assert not processes_with(marker), "the hog's processes outlived grade-class"
    results = {s: json.loads((course / "autograded" / s / "mha" / "results.json").read_text()) for s in sources}
    for student in ("alice", "bob"):
        assert results[student]["score"] == results[student]["max_score"] == 100, [
            (t["name"], t["output"][:200]) for t in failures(results[student])
        ]
    assert results["hog"]["extra_data"]["status"] == "graded"
    assert wall < 600, f"the class took {wall:.0f} s"


@pytest.mark.slow
def test_checks_resting_on_the_workers_word_are_tagged_so(graded):
    """The mutation it hides passes the input check: that check's evidence is the worker's report, and
    results.json says so. Values are never the worker's word, and neither are the structure checks now: they judge
    a graph the grader checked and replayed where no student code ran."""
    results = graded["hides_its_input_mutation"].results
    tags = {t["tags"][1]: t["tags"] for t in results["tests"]}
    for key in ("mha::test_input_not_modified", "wrapper::test_heads_run_once_in_order_on_same_input"):
        assert "worker-reported" in tags[key], key
    for key in (
        "mha::test_matches_reference",
        "mha::test_one_pass_for_all_heads",
        "mha::test_no_ready_made_attention",
    ):
        assert "worker-reported" not in tags[key], key
