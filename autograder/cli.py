"""Command line: `python -m autograder grade|preview|grade-class|release|student-kit|gradescope|doctor ...`.

`grade` and `preview` run the student's code only in the sandboxed worker. The notebook's self-check,
which runs the student's code on this machine unsandboxed, is another command: `make selfcheck`
(`python -m autograder.authoring.selfcheck`). `doctor` says what this machine allows the grader.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

RENAMED_CHECK = (
    "`check` is now `preview`: the grader's visible checks, the student's code sandboxed. The notebook's "
    "self-check, which runs the student's code on this machine unsandboxed, is `make selfcheck`."
)
DEVICES = ("auto", "cpu", "cuda")
ISOLATIONS = ("auto", "namespace", "process")
ISOLATION_HELP = (
    "how the student's code is kept apart: namespace (a sandbox; needs user namespaces), "
    "process (a separate process only) or auto (namespace where possible; default, or "
    "$AUTOGRADER_ISOLATION)"
)
GRADE_HELP = "grade one submission (mha.py or mha.ipynb) into results.json; the student's code runs sandboxed"
PREVIEW_HELP = (
    "the grader's visible checks on one file, with their feedback and no score: the student's code "
    "runs sandboxed (exit 1 when one fails; needs reference/)"
)

# A command's handler: the parsed arguments and the whole parser (whose usage an error shows) -> exit status.
Handler = Callable[[argparse.Namespace, argparse.ArgumentParser], int]


def add_device(parser: argparse.ArgumentParser) -> None:
    """--device, as every command that grades takes it."""
    parser.add_argument("--device", choices=DEVICES, default="auto")


def add_isolation(parser: argparse.ArgumentParser) -> None:
    """--isolation, as every command that runs a student's code takes it (its default read now: the
    environment of this run)."""
    default = os.environ.get("AUTOGRADER_ISOLATION", "auto")
    parser.add_argument("--isolation", choices=ISOLATIONS, default=default, help=ISOLATION_HELP)


def add_rubric(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    parser.add_argument("--rubric", type=Path, default=None, help=help)


def add_grade(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    grade = sub.add_parser("grade", help=GRADE_HELP, description=GRADE_HELP)
    grade.add_argument("submission", type=Path)
    add_device(grade)
    grade.add_argument("--out", type=Path, default=Path("results.json"))
    add_rubric(grade, help="rubric TOML (default: the packaged one)")
    grade.add_argument("--quiet", action="store_true", help="no summary on the terminal")
    grade.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the hidden seed (recorded in results.json); only to reproduce a grading run",
    )
    add_isolation(grade)
    grade.add_argument(
        "--part",
        action="append",
        default=None,
        dest="parts",
        metavar="PART",
        help="grade only this part (repeatable), e.g. to regrade the speed part; "
        "the others are not run and count for nothing",
    )
    grade.set_defaults(handler=grade_handler)


def add_preview(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    preview = sub.add_parser("preview", help=PREVIEW_HELP, description=PREVIEW_HELP)
    preview.add_argument("submission", type=Path)
    add_device(preview)
    add_rubric(preview)
    add_isolation(preview)
    preview.set_defaults(handler=grade_handler)


def add_release(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    release = sub.add_parser("release", help="regenerate the student release from reference/mha.py")
    release.add_argument("--root", type=Path, default=None, help="project root (default: this checkout)")
    release.set_defaults(handler=release_handler)


def add_grade_class(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    klass = sub.add_parser("grade-class", help="grade every submitted/<student>/mha/ of an nbgrader course")
    klass.add_argument("course", type=Path, nargs="?", default=Path("assignments"))
    add_device(klass)
    add_rubric(klass)
    klass.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="submissions graded at once (default: twice the CPUs, at least 2 and at most 8: "
        "a submission waiting on a deadline leaves its CPU to the others)",
    )
    klass.add_argument("--force", action="store_true", help="regrade even what is up to date")
    klass.add_argument(
        "--shard",
        default=None,
        metavar="K/N",
        help="grade only shard K of N (K from 0 to N-1), recording only those students' runs and "
        "writing no class output; 'auto' or 'auto/N' reads K (and N) from a Slurm array task "
        "or a Kubernetes indexed job",
    )
    klass.add_argument(
        "--merge",
        action="store_true",
        help="grade nothing: write the class's outputs from the runs already recorded; "
        "exits 1, writing nothing, when a student's run is missing or out of date",
    )
    klass.add_argument(
        "--student",
        action="append",
        default=None,
        metavar="NAME",
        help="grade only this student (repeatable); the class outputs still cover everyone",
    )
    klass.add_argument(
        "--released",
        action="store_true",
        help="the due date has passed: feedback shows the checks the rubric shows after_due_date",
    )
    klass.add_argument(
        "--db",
        default=None,
        metavar="URL",
        help="the gradebook's SQLAlchemy URL (default: the course's nbgrader_config.py, "
        "else sqlite:///COURSE/gradebook.db)",
    )
    add_isolation(klass)
    klass.add_argument(
        "--canvas-assignment",
        default=None,
        metavar="'NAME (ID)'",
        help="the Canvas file's column header: the assignment's name and Canvas id as a Canvas gradebook export "
        "heads its column, so Canvas fills that assignment (default: mha, which Canvas matches by exact name "
        "only, else it makes a new assignment)",
    )
    klass.set_defaults(handler=grade_class_handler)


def add_explain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    explain = sub.add_parser(
        "explain",
        help="a disputed grade: a failed check's hidden inputs, expected and actual values, from the recorded seed",
    )
    explain.add_argument("results", type=Path, help="a results.json written by the grader")
    explain.add_argument(
        "--check", action="append", default=None, metavar="KEY", help="mha::test_x or mha::test_x[case] (repeatable)"
    )
    explain.add_argument("--submission", type=Path, default=None, help="the graded file (default: found from RESULTS)")
    # not add_device: it replays a run, on the device it was graded on unless told otherwise
    explain.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: the one it was graded on")
    explain.set_defaults(handler=explain_handler)


def add_student_kit(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kit = sub.add_parser("student-kit", help="build what students receive (release, self-check, README), no solution")
    kit.add_argument("--out", type=Path, default=Path("dist"))
    kit.add_argument("--torch", default=None, help="the grader's TORCH_SPEC (default: the Makefile's)")
    kit.set_defaults(handler=student_kit_handler)


def add_gradescope(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    gradescope = sub.add_parser("gradescope", help="build Gradescope's autograder zip (setup.sh, run_autograder)")
    gradescope.add_argument("--out", type=Path, default=Path("dist"))
    gradescope.set_defaults(handler=gradescope_handler)


def add_doctor(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="what this machine allows (sandbox, control groups, CUDA), what grading will have here, "
        "whether its speed part can be trusted, and the one change that would improve it",
    )
    import autograder.doctor as doctor_module

    doctor_module.add_arguments(doctor)
    doctor.set_defaults(handler=doctor_handler)


# The commands, in the order the help lists them.
COMMANDS = (
    add_grade,
    add_preview,
    add_release,
    add_grade_class,
    add_explain,
    add_student_kit,
    add_gradescope,
    add_doctor,
)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line: each command's parser, with its handler as `handler`."""
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # Before torch is imported: its idle OpenMP threads sleep rather than spin after each of the grader's
    # small tensor operations (spinning cost about 0.7 s of CPU per grading, taken from the workers beside it).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["check"]:
        parser.error(RENAMED_CHECK)
    args = parser.parse_args(argv)
    handler: Handler = args.handler
    return handler(args, parser)


def grade_handler(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`grade` and `preview` (the visible checks only, no results.json)."""
    visible_only = args.command == "preview"
    out = None if visible_only else args.out
    if out is not None:
        # First of all, before any import beyond the standard library (torch, pytest and the early start take
        # seconds): a grader killed from here on leaves this placeholder or its full results, never an older
        # run's score.
        from autograder.model import write_unfinished

        write_unfinished(out, args.submission.name)
    from autograder.grading.workers import EarlyStart

    parts = tuple(args.parts) if getattr(args, "parts", None) else None
    # The workers' Python and torch load while this process imports torch, pytest and the checks (about a
    # second each, on the cores the imports leave idle); nothing of the submission runs before a check asks.
    early = EarlyStart.begin(
        args.submission, device=args.device, rubric_path=args.rubric, isolation=args.isolation, out=out, parts=parts
    )
    from autograder.grading.grade import Options, grade_command

    options = Options(
        device=args.device,
        out=out,
        rubric_path=args.rubric,
        visible_only=visible_only,
        quiet=getattr(args, "quiet", False),
        isolation=args.isolation,
        seed=getattr(args, "seed", None),
        parts=parts,
        early=early,
        placeholder_written=out is not None,
    )
    return grade_command(args.submission, options)


def release_handler(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from autograder.authoring.release import release_assignment
    from autograder.authoring.samples import write_samples

    release_assignment(args.root)
    written = write_samples(args.root)
    print(f"samples: {', '.join(p.parent.parent.name for p in written)} (the release plus each one's answers)")
    return 0


def explain_handler(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from autograder.grading.explain import explain as explain_run

    return explain_run(args.results, args.check, args.submission, args.device)


def student_kit_handler(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from autograder.authoring.kit import KitError, build_kit

    try:
        build_kit(args.out, torch_spec=args.torch)
    except KitError as exc:
        print(f"cannot build the kit: {exc}", file=sys.stderr)
        return 2
    return 0


def gradescope_handler(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from autograder.platforms.gradescope import build_zip

    build_zip(args.out)
    return 0


def doctor_handler(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import autograder.doctor as doctor_module

    return doctor_module.run(args)


def grade_class_handler(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """`grade-class`: the options checked (a bad combination is a usage error, exit 2), then the class
    graded (or, with --merge, its outputs written from the record)."""
    from autograder.contract import ASSIGNMENT
    from autograder.course.grade_class import ClassOptions, grade_class, merge_class

    if not (args.course / "submitted").is_dir():
        parser.error(f"{args.course} is not a course folder: it has no submitted/ folder")
    try:
        options = ClassOptions(
            course=args.course,
            device=args.device,
            rubric=args.rubric,
            jobs=args.jobs,
            force=args.force,
            students=args.student,
            released=args.released,
            db_url=args.db,
            isolation=args.isolation,
            shard=args.shard,
            canvas_assignment=args.canvas_assignment or ASSIGNMENT,
            merge=args.merge,
        )
    except ValueError as exc:  # OptionsError, or the shard's ShardError: each says what to write instead
        parser.error(str(exc))
    return merge_class(options) if options.merge else grade_class(options)


if __name__ == "__main__":
    sys.exit(main())
