"""Class outputs are written atomically: a reader or a crash sees the old file or the new one."""

import stat

import pytest

from autograder.atomic import open_atomically, write_text_atomically


def test_the_new_contents_replace_the_old_in_one_step(tmp_path):
    path = tmp_path / "grades.csv"
    path.write_text("old\n")
    with open_atomically(path) as handle:
        handle.write("student,score\r\n")
        assert path.read_text() == "old\n"  # not yet: the new contents are still in a temporary file
    assert path.read_bytes() == b"student,score\r\n"  # newlines as written (csv writes \r\n)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["grades.csv"]


def test_a_write_that_fails_leaves_the_old_file_and_no_litter(tmp_path):
    path = tmp_path / "grades.csv"
    write_text_atomically(path, "old\n")
    with pytest.raises(RuntimeError), open_atomically(path) as handle:
        handle.write("half of the ")
        raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["grades.csv"]
