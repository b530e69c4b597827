"""docs/vocabulary.md writes the words a student reads down once; every writer uses them, and no other."""

from __future__ import annotations

import re

from autograder.authoring import kit, selfcheck
from autograder.model import (
    NOT_CHARGED,
    NOT_CREDITED,
    NOT_DONE_STUB,
    NOT_DONE_UNANSWERED,
    NOT_DONE_YET,
    ROW_WORDS,
    WAITING,
    CheckResult,
)
from helpers import ROOT

DOC = ROOT / "docs" / "vocabulary.md"


def words() -> list[str]:
    """The states' words, as the document's table lists them."""
    return re.findall(r"^\| `([^`]+)` \|", DOC.read_text(), flags=re.MULTILINE)


def test_the_document_lists_the_five_states():
    assert words() == ["passed", "waiting", "answered", "not done yet", "failed"]


def test_the_self_check_and_the_grader_say_the_documents_words():
    assert [selfcheck.PASSED, selfcheck.WAITING, selfcheck.ANSWERED, selfcheck.NOT_DONE, selfcheck.FAILED] == words()
    assert NOT_DONE_YET in words()
    assert NOT_DONE_STUB.startswith(f"{NOT_DONE_YET}: ") and NOT_DONE_UNANSWERED.startswith(f"{NOT_DONE_YET}: ")


def test_a_grader_row_says_a_documents_word_or_not_credited_as_the_document_defines_it():
    """`waiting` is one word for the self-check and the grader's rows alike; `not credited`, a row's word only,
    is defined in the document too."""
    assert WAITING in words() and set(ROW_WORDS.values()) - set(words()) == {"not credited"}
    assert "`not credited`" in DOC.read_text() and "`waiting` and are *not charged*" in DOC.read_text()
    waits = CheckResult("fuse::test_w", "fuse", "w", NOT_CHARGED, 1.0, 1.0)
    gated = CheckResult("speed::test_s", "speed", "s", NOT_CREDITED, 0.0, 1.0)
    assert waits.word == gated.word == selfcheck.WAITING


def test_the_readmes_list_every_word_and_the_notebook_numbers_its_parts_as_the_document_does():
    readme, kit_readme = (ROOT / "README.md").read_text(), kit.README
    for word in words():
        assert f"`{word}`" in readme and f"`{word}`" in kit_readme, word
    notebook = (ROOT / "reference" / "mha.py").read_text()
    doc = DOC.read_text()
    for number, section in re.findall(r"^# ## (\d)\. (.*)$", notebook, flags=re.MULTILINE):
        if int(number) >= 3 and int(number) <= 7:
            assert f"part {number} " in doc, (number, section)
    # a self-check names a part as the notebook numbers them: the parts that have a self-check
    checked = {int(n) for n in re.findall(r"self-checks? of parts? (\d)", notebook)}
    assert checked and checked <= {3, 4, 5, 6, 7}, checked
