"""The command line's parser (`cli.build_parser`) on its own: one handler per command, the options several
commands share defined once, and grade-class handing its options to the class run as one object. The help
texts and error messages themselves are the ones the commands always had (tests/test_cli.py runs them)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from autograder import cli
from autograder.course import grade_class

# A minimal command line for each command.
COMMANDS = {
    "grade": ["grade", "mha.py"],
    "preview": ["preview", "mha.py"],
    "release": ["release"],
    "grade-class": ["grade-class"],
    "explain": ["explain", "results.json"],
    "student-kit": ["student-kit"],
    "gradescope": ["gradescope"],
    "doctor": ["doctor"],
}


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action:
    (action,) = [a for a in parser._actions if flag in a.option_strings]
    return action


def test_every_command_has_its_handler_and_grade_and_preview_share_one():
    parser = cli.build_parser()
    assert list(subparsers(parser)) == list(COMMANDS)  # the order the help lists them in
    handlers = {name: parser.parse_args(argv).handler for name, argv in COMMANDS.items()}
    assert handlers["grade"] is handlers["preview"] is cli.grade_handler
    others = [handler for name, handler in handlers.items() if name not in ("grade", "preview")]
    assert len(set(others)) == len(others) and all(callable(h) for h in others)


def test_the_options_that_run_a_students_code_are_the_same_on_every_command_that_takes_them(monkeypatch):
    monkeypatch.setenv("AUTOGRADER_ISOLATION", "process")  # read when the parser is built
    commands = subparsers(cli.build_parser())
    for name in ("grade", "preview", "grade-class"):
        device, isolation = option(commands[name], "--device"), option(commands[name], "--isolation")
        assert (device.choices, device.default) == (("auto", "cpu", "cuda"), "auto"), name
        assert (isolation.choices, isolation.default, isolation.help) == (
            ("auto", "namespace", "process"),
            "process",
            cli.ISOLATION_HELP,
        ), name
    # explain replays a run: its --device has no auto, and defaults to the device it was graded on
    assert option(commands["explain"], "--device").choices == ("cpu", "cuda")
    assert option(commands["explain"], "--device").default is None


@pytest.fixture
def course(tmp_path: Path) -> Path:
    (tmp_path / "course" / "submitted").mkdir(parents=True)
    return tmp_path / "course"


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """What grade-class hands to the class run (`grade_class` or `merge_class`), which does nothing here."""
    calls: list[tuple[str, Any]] = []
    monkeypatch.setattr(grade_class, "grade_class", lambda options: calls.append(("grade", options)) or 0)
    monkeypatch.setattr(grade_class, "merge_class", lambda options: calls.append(("merge", options)) or 0)
    return calls


def test_grade_class_hands_every_option_to_the_class_run_as_one_object(course, handed):
    argv = ["grade-class", str(course), "--device", "cpu", "--jobs", "3", "--force", "--shard", "1/2"]
    argv += ["--student", "ann", "--student", "bob", "--released", "--db", "sqlite://", "--isolation", "process"]
    assert cli.main([*argv, "--rubric", "r.toml", "--canvas-assignment", "MHA (12)"]) == 0
    ((how, options),) = handed
    assert how == "grade"
    assert options == grade_class.ClassOptions(
        course=course,
        device="cpu",
        rubric=Path("r.toml"),
        jobs=3,
        force=True,
        students=("ann", "bob"),
        released=True,
        db_url="sqlite://",
        isolation="process",
        shard="1/2",
        canvas_assignment="MHA (12)",
    )
    assert options.share is not None and (options.share.index, options.share.count) == (1, 2)


def test_grade_class_merge_hands_its_options_to_the_merge(course, handed):
    assert cli.main(["grade-class", str(course), "--merge", "--jobs", "0"]) == 0  # a merge ignores --jobs
    ((how, options),) = handed
    assert how == "merge" and options.merge and options.canvas_assignment == "mha"


@pytest.mark.parametrize(
    "argv, said",
    [
        (["--merge", "--force"], "--merge grades nothing, so it takes neither --shard, --force nor --student"),
        (["--merge", "--shard", "9/2"], "--merge grades nothing, so it takes neither --shard, --force nor --student"),
        (["--jobs", "0"], "--jobs must be at least 1"),
        (["--shard", "5/2"], "shard 5/2 does not exist"),
    ],
)
def test_a_bad_combination_is_a_usage_error_and_nothing_runs(course, handed, capsys, argv, said):
    with pytest.raises(SystemExit) as exited:
        cli.main(["grade-class", str(course), *argv])
    assert exited.value.code == 2 and handed == []
    error = capsys.readouterr().err
    assert error.startswith("usage: python -m autograder") and f"python -m autograder: error: {said}" in error
