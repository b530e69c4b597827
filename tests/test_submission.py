"""Reading submissions into cells: notebooks and .py files, magics never run, line numbers kept, and
any input file either read or refused with one of the two documented exceptions."""

import json
import os
import re
import time
import tracemalloc

import nbformat
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autograder.grading.submission import (
    MAX_BYTES,
    Cell,
    NotASubmission,
    SubmissionFormatError,
    neutralise_magics,
    python_cells,
    read_cells,
)

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def write(folder, name, content) -> os.PathLike:
    path = folder / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def notebook_json(cells, **top) -> str:
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells, **top})


def code_cell(source, cell_id="c") -> dict:
    return {
        "cell_type": "code",
        "id": cell_id,
        "metadata": {},
        "execution_count": None,
        "outputs": [],
        "source": source,
    }


def file_lines(data: bytes) -> list[str]:
    """The file's lines as Python and editors count them (\\n, \\r\\n or a lone \\r end a line)."""
    return re.split(r"\r\n|\r|\n", data.decode("utf-8-sig"))


def assert_well_formed(cells):
    """What every successful read returns, whatever the input."""
    assert isinstance(cells, list) and cells
    numbers = [cell.number for cell in cells]
    assert numbers == sorted(set(numbers)) and numbers[0] >= 1
    for cell in cells:
        assert isinstance(cell, Cell) and type(cell.source) is str and cell.line >= 1
        assert cell.source.strip() and cell.source.endswith("\n") and "\0" not in cell.source
        assert "\r" not in cell.source
        cell.source.encode("utf-8")  # no lone surrogates: the text can cross a pipe and reach a terminal


# -- .py files --------------------------------------------------------------------------------------


def test_python_file_without_markers_is_one_cell():
    assert python_cells("x = 1\ny = 2\n") == [Cell(1, 1, "x = 1\ny = 2\n")]


def test_percent_cells_keep_file_line_numbers_and_skip_markdown():
    text = "# %%\nimport torch\n# %% [markdown]\n# prose\n# %%\ny = 1\n"
    assert python_cells(text) == [Cell(1, 2, "import torch\n"), Cell(3, 6, "y = 1\n")]
    assert text.splitlines()[6 - 1] == "y = 1"


def test_code_before_the_first_marker_is_cell_one_and_a_comment_header_is_not_a_cell():
    assert python_cells("import torch\n# %%\nx = 1\n") == [Cell(1, 1, "import torch\n"), Cell(2, 3, "x = 1\n")]
    assert python_cells("# a header\n\n# %%\nx = 1\n") == [Cell(1, 4, "x = 1\n")]


def test_raw_and_md_cells_are_not_code():
    text = "# %% [raw]\nnot python\n# %% [md]\n# prose\n# %% Self-check: part mha\nx = 1\n"
    assert python_cells(text) == [Cell(3, 6, "x = 1\n")]


def test_sources_are_not_padded():
    """Memory stays linear in the file: no cell carries blank lines for the cells before it."""
    cells = python_cells("# %%\n1\n" * 1000)
    assert len(cells) == 1000 and all(cell.source == "1\n" for cell in cells)
    assert [cell.line for cell in cells] == list(range(2, 2001, 2))


@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"], ids=["LF", "CRLF", "CR"])
@pytest.mark.parametrize("bom", [b"", b"\xef\xbb\xbf"], ids=["no BOM", "BOM"])
def test_line_endings_and_byte_order_mark(tmp_path, newline, bom):
    text = newline.join(["# %%", "import torch", "", "# %%", "def f():", "    return 1", ""])
    path = write(tmp_path, "mha.py", bom + text.encode())
    assert read_cells(path) == [Cell(1, 2, "import torch\n"), Cell(2, 5, "def f():\n    return 1\n")]


def test_form_feed_and_unicode_separators_do_not_shift_lines(tmp_path):
    """str.splitlines() splits on \\x0c, \\x1c, \\x85 and \\u2028, Python's tokenizer does not."""
    text = "x = 1\x0c\ny = '\x1c\x85\u2028'\n# %%\nz = 3\n"
    assert read_cells(write(tmp_path, "mha.py", text)) == [
        Cell(1, 1, "x = 1\x0c\ny = '\x1c\x85\u2028'\n"),
        Cell(2, 4, "z = 3\n"),
    ]


# -- magics -----------------------------------------------------------------------------------------


def test_magics_and_shell_escapes_become_pass():
    source = "%matplotlib inline\n!pip install x\nfiles = !ls\nif True:\n    %time y = 1\nz = 2"
    out = neutralise_magics(source).splitlines()
    assert out[0].startswith("pass") and out[1].startswith("pass") and out[2].startswith("pass")
    assert out[4].startswith("    pass")
    assert out[5] == "z = 2"
    compile("\n".join(out), "<cell>", "exec")  # still valid Python


def test_magics_in_a_py_file_keep_the_lines_after_them_in_place(tmp_path):
    text = "# %%\n%load_ext autoreload\nx = !ls\ny = 1\n# %%\n%%bash\necho hi\n# %%\nz = 2\n"
    cells = read_cells(write(tmp_path, "mha.py", text))
    assert [(cell.number, cell.line) for cell in cells] == [(1, 2), (3, 9)]  # the %% cell is dropped
    assert cells[0].source.splitlines()[2] == "y = 1" == text.splitlines()[cells[0].line + 2 - 1]
    assert cells[0].source.splitlines()[1].startswith("pass")
    assert cells[1].source == "z = 2\n"


def test_cell_magic_cells_are_dropped(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# title"),
        nbformat.v4.new_code_cell("%%bash\necho hi"),
        nbformat.v4.new_code_cell("x = 1"),
    ]
    path = tmp_path / "mha.ipynb"
    nbformat.write(notebook, path)
    assert read_cells(path) == [Cell(3, 1, "x = 1\n")]


# -- notebooks --------------------------------------------------------------------------------------


def test_notebook_cells_are_numbered_among_all_cells(tmp_path):
    cells = [
        {"cell_type": "markdown", "id": "m", "metadata": {}, "source": "# Title"},
        code_cell(["import torch\r\n", "x = 1"], "a"),
        {"cell_type": "raw", "id": "r", "metadata": {}, "source": "raw"},
        code_cell("", "empty"),
        code_cell("!nvidia-smi\ny = 2", "b"),
    ]
    got = read_cells(write(tmp_path, "mha.ipynb", notebook_json(cells)))
    assert got == [
        Cell(2, 1, "import torch\nx = 1\n"),
        Cell(5, 1, "pass  # IPython syntax, not run by the grader\ny = 2\n"),
    ]


def test_old_notebook_format_3_is_converted(tmp_path):
    v3 = {
        "nbformat": 3,
        "nbformat_minor": 0,
        "metadata": {},
        "worksheets": [
            {
                "metadata": {},
                "cells": [{"cell_type": "code", "input": "x = 1", "language": "python", "outputs": [], "metadata": {}}],
            }
        ],
    }
    assert read_cells(write(tmp_path, "mha.ipynb", json.dumps(v3))) == [Cell(1, 1, "x = 1\n")]


def test_notebook_without_cell_ids_is_accepted(tmp_path):
    cell = code_cell("x = 1")
    del cell["id"]
    assert read_cells(write(tmp_path, "mha.ipynb", notebook_json([cell]))) == [Cell(1, 1, "x = 1\n")]


@pytest.mark.parametrize(
    "source",
    [{"code": "x = 1"}, 42, None, ["x = 1\n", 2], ["x = 1\n", None], [["x"]]],
    ids=["dict", "int", "null", "list with an int", "list with null", "nested list"],
)
def test_notebook_cell_source_that_is_not_text(tmp_path, source):
    path = write(tmp_path, "mha.ipynb", notebook_json([code_cell("y = 0", "a"), code_cell(source, "b")]))
    with pytest.raises(SubmissionFormatError, match=r"not a valid Jupyter notebook: cell 2, source"):
        read_cells(path)


@pytest.mark.parametrize(
    "content,message",
    [
        ("{not json", "not a readable Jupyter notebook \\(invalid JSON"),
        ("[1, 2, 3]", "JSON but not a Jupyter notebook"),
        ('"a string"', "JSON but not a Jupyter notebook"),
        ('{"cells": []}', "JSON but not a Jupyter notebook"),
        ('{"nbformat": "4", "cells": []}', "JSON but not a Jupyter notebook"),
        ('{"nbformat": 99, "cells": []}', "notebook format version 99"),
        ('{"nbformat": 4, "cells": []}', "not a valid Jupyter notebook: the notebook: 'metadata' is a required"),
        (
            '{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{"cell_type": "code"}]}',
            "not a valid Jupyter notebook: cell 1",
        ),
        ("[" * 100_000, "nested too deeply"),
    ],
    ids=[
        "invalid JSON",
        "a list",
        "a string",
        "no version",
        "version as text",
        "unknown version",
        "no metadata",
        "a cell without fields",
        "deep nesting",
    ],
)
def test_json_that_is_not_a_notebook(tmp_path, content, message):
    with pytest.raises(SubmissionFormatError, match=message):
        read_cells(write(tmp_path, "mha.ipynb", content))


def test_notebook_with_no_code_cells(tmp_path):
    notebook = notebook_json(
        [
            {"cell_type": "markdown", "id": "m", "metadata": {}, "source": "x = 1"},
            code_cell("# only a comment\n\n", "c"),
        ]
    )
    with pytest.raises(SubmissionFormatError, match="has no code .* nothing to grade"):
        read_cells(write(tmp_path, "mha.ipynb", notebook))


@pytest.mark.parametrize(
    "source,message",
    [("x = '\0'", "cell 1 contains a NUL"), ("x = '\ud800'", "cell 1 contains an invalid character")],
    ids=["NUL", "lone surrogate"],
)
def test_notebook_characters_that_cannot_be_code(tmp_path, source, message):
    with pytest.raises(SubmissionFormatError, match=message):
        read_cells(write(tmp_path, "mha.ipynb", notebook_json([code_cell(source)])))


# -- the student's file is bad: graded, 0 points, a message -----------------------------------------


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("mha.txt", "x = 1", "a .py or .ipynb file"),
        ("mha", "x = 1", "a .py or .ipynb file"),
        ("mha.py", b"", "mha.py is empty$"),
        ("mha.ipynb", b"", "mha.ipynb is empty$"),
        ("mha.py", " \n\t\r\n  ", r"is empty \(only whitespace\)"),
        ("mha.py", "# just a comment\n\n# %%\n    # another\n# %% [markdown]\n# prose\n", "has no code"),
        ("mha.py", b"x = 1\n# caf\xe9\n", "not UTF-8 text: byte 0xe9 on line 2 .* Save the file as UTF-8"),
        ("mha.py", b"x = 1\r\ny = 2\r\xff", "byte 0xff on line 3"),
        ("mha.ipynb", b'{"nbformat": 4, "x": "\xa0"}', "not UTF-8 text"),
        ("mha.py", "x = 1\ny = '\0'\n", "NUL byte on line 2"),
    ],
    ids=[
        "wrong suffix",
        "no suffix",
        "0 bytes",
        "0 bytes notebook",
        "whitespace",
        "only comments",
        "latin-1",
        "bad byte after CR",
        "latin-1 notebook",
        "NUL",
    ],
)
def test_unreadable_submissions_say_why(tmp_path, name, content, message):
    path = write(tmp_path, name, content)
    with pytest.raises(SubmissionFormatError, match=message):
        read_cells(path)


@pytest.mark.parametrize("name", ["mha.py", "mha.ipynb"])
def test_a_file_over_the_size_limit_is_refused_without_reading_it_all(tmp_path, name):
    path = tmp_path / name
    with open(path, "wb") as handle:  # sparse: 1 GiB on paper, nothing on disk
        handle.truncate(1 << 30)
    with pytest.raises(SubmissionFormatError, match=f"over the size limit of {MAX_BYTES:,} bytes"):
        read_cells(path)
    write(tmp_path, name, "x = 1\n" + "#" * MAX_BYTES)
    with pytest.raises(SubmissionFormatError, match="over the size limit"):
        read_cells(path)


def test_a_symlink_out_of_the_submission_folder_is_refused(tmp_path):
    """A student could otherwise point the grader at the answer key or a classmate's file."""
    answer_key = write(tmp_path, "answer.py", "x = 1\n")
    folder = tmp_path / "student"
    folder.mkdir()
    for name, target in [
        ("mha.py", answer_key),
        ("relative.py", "../answer.py"),
        ("etc.py", "/etc/hostname"),
        ("nowhere.py", "/no/such/file.py"),
    ]:
        os.symlink(target, folder / name)
        with pytest.raises(SubmissionFormatError, match="symbolic link to a file outside its folder"):
            read_cells(folder / name)


def test_a_symlink_within_the_submission_folder_is_followed(tmp_path):
    folder = tmp_path / "student"
    (folder / "work").mkdir(parents=True)
    write(folder / "work", "solution.py", "x = 1\n")
    os.symlink("work/solution.py", folder / "mha.py")
    assert read_cells(folder / "mha.py") == [Cell(1, 1, "x = 1\n")]
    os.symlink("missing.py", folder / "broken.py")
    with pytest.raises(SubmissionFormatError, match="symbolic link to a file that does not exist"):
        read_cells(folder / "broken.py")


# -- not a submission at all: the run could not grade ----------------------------------------------


def test_a_missing_path_is_not_a_submission(tmp_path):
    with pytest.raises(NotASubmission, match="no such submission file"):
        read_cells(tmp_path / "mha.py")


def test_a_directory_is_not_a_submission(tmp_path):
    (tmp_path / "mha.py").mkdir()
    with pytest.raises(NotASubmission, match="is a directory"):
        read_cells(tmp_path / "mha.py")


def test_a_fifo_is_not_a_submission_and_reading_it_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "mha.py")  # nobody writes to it: opening it for reading would wait forever
    with pytest.raises(NotASubmission, match="not a regular file"):
        read_cells(tmp_path / "mha.py")


def test_a_device_is_not_a_submission():
    with pytest.raises(NotASubmission, match="not a regular file"):
        read_cells("/dev/zero")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_a_file_the_grader_cannot_read_is_not_the_students_fault(tmp_path):
    path = write(tmp_path, "mha.py", "x = 1\n")
    path.chmod(0)
    with pytest.raises(NotASubmission, match="cannot read"):
        read_cells(path)


def test_the_two_kinds_of_problem_are_distinct():
    assert not issubclass(NotASubmission, SubmissionFormatError)
    assert not issubclass(SubmissionFormatError, NotASubmission)


# -- linear time and memory -------------------------------------------------------------------------


def peak_memory(path) -> int:
    tracemalloc.start()
    try:
        read_cells(path)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("cell", ["# %%\n1\n", "# %%\n%time 1\n", "# %%\nx = !ls\n"])
def test_memory_grows_linearly_with_the_number_of_cells(tmp_path, cell):
    """Counted by tracemalloc, not timed: padding each cell to its line would be quadratic (a 280 KB
    file of 40,000 cells took 6.7 GB), 16 times the memory for 4 times the cells."""
    small, large = write(tmp_path, "small.py", cell * 2000), write(tmp_path, "large.py", cell * 8000)
    peak_memory(small)  # first-use allocations (the regex cache) out of the way
    small_peak, large_peak = peak_memory(small), peak_memory(large)
    assert large_peak < 8 * small_peak, (small_peak, large_peak)
    assert large_peak < 200 * large.stat().st_size, (large_peak, large.stat().st_size)


def test_the_many_cells_attack_reads_quickly(tmp_path):
    path = write(tmp_path, "mha.py", "# %%\n1\n" * 40000)
    started = time.monotonic()
    cells = read_cells(path)
    assert len(cells) == 40000 and cells[-1] == Cell(40000, 80000, "1\n")
    assert time.monotonic() - started < 60  # about 0.5 s; the bound only catches a blow-up


# -- property-based: any input is read or refused with a documented exception -----------------------


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("generated")


def read_or_refuse(path):
    """read_cells' result, or None when it refused the file as the student's problem."""
    try:
        cells = read_cells(path)
    except SubmissionFormatError as exc:
        assert str(exc) and len(str(exc)) < 1000
        return None
    assert_well_formed(cells)
    return cells


@PROPERTY
@given(data=st.binary(max_size=3000), suffix=st.sampled_from([".py", ".ipynb", ".txt"]))
def test_any_bytes_are_read_or_refused(scratch, data, suffix):
    path = write(scratch, "mha" + suffix, data)
    cells = read_or_refuse(path)
    if cells and suffix == ".py":
        assert_lines_match_the_file(cells, data)


LINE_TEXT = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\r\n"), max_size=40)
PY_LINE = st.one_of(
    LINE_TEXT,
    st.sampled_from(
        [
            "# %%",
            "# %% [markdown]",
            "# %% [raw]",
            "#%%",
            "%time x = 1",
            "  !ls",
            "x = !ls",
            "%%bash",
            "%% not at the start",
            "def f():",
            "    return 1",
            "",
            "   ",
            "# comment",
            "x = (1,",
            "\x0c",
        ]
    ),
)


def assert_lines_match_the_file(cells, data: bytes):
    """Line k of a cell's source is line `cell.line + k - 1` of the file, or that line neutralised."""
    lines = file_lines(data)
    for cell in cells:
        for k, line in enumerate(cell.source.split("\n")[:-1]):
            original = lines[cell.line - 1 + k]
            indent = line[: len(line) - len(line.lstrip())]
            assert line == original or (line.lstrip().startswith("pass  # IPython") and original.startswith(indent))
        assert cell.line == 1 or lines[cell.line - 2].startswith("# %%")


@PROPERTY
@given(lines=st.lists(PY_LINE, max_size=40), newline=st.sampled_from(["\n", "\r\n", "\r"]), bom=st.booleans())
def test_any_text_is_read_or_refused_and_lines_point_into_the_file(scratch, lines, newline, bom):
    data = ("\ufeff" if bom else "").encode() + newline.join(lines).encode("utf-8")
    cells = read_or_refuse(write(scratch, "mha.py", data))
    if cells:
        assert_lines_match_the_file(cells, data)


CODE_LINE = st.text(st.sampled_from("abxyz_019 ()[]:=+-*/.,'\"\t\x0c\x1c\x85\u2028éλ中#"), max_size=20).filter(
    lambda line: not line.startswith("# %%")
)


@PROPERTY
@given(
    preamble=st.lists(CODE_LINE, max_size=3),
    cells=st.lists(
        st.tuples(st.sampled_from(["", " [markdown]", " title"]), st.lists(CODE_LINE, max_size=5)), max_size=8
    ),
    newline=st.sampled_from(["\n", "\r\n", "\r"]),
)
def test_well_formed_percent_files_round_trip(scratch, preamble, cells, newline):
    def has_code(lines):
        return any(line.strip() and not line.lstrip().startswith("#") for line in lines)

    text_lines, expected, number = list(preamble), [], 0
    if has_code(preamble):
        number = 1
        expected.append(Cell(1, 1, "\n".join(preamble).rstrip("\n") + "\n"))
    for header, body in cells:
        number += 1
        text_lines.append("# %%" + header)
        if header != " [markdown]" and "\n".join(body).strip():
            expected.append(Cell(number, len(text_lines) + 1, "\n".join(body).rstrip("\n") + "\n"))
        text_lines += body
    data = newline.join(text_lines).encode()
    if not any(has_code(cell.source.split("\n")) for cell in expected):
        with pytest.raises(SubmissionFormatError):
            read_cells(write(scratch, "mha.py", data))
    else:
        assert read_cells(write(scratch, "mha.py", data)) == expected


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | LINE_TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(LINE_TEXT, children, max_size=3),
    max_leaves=12,
)
SOURCE = st.one_of(LINE_TEXT, st.lists(LINE_TEXT.map(lambda s: s + "\n"), max_size=4), JSON)
CELL = st.fixed_dictionaries(
    {"cell_type": st.sampled_from(["code", "code", "markdown", "raw", "other"]), "source": SOURCE},
    optional={
        "id": st.sampled_from(["a", "b", ""]),
        "metadata": st.sampled_from([{}, {"tags": []}, None]),
        "outputs": st.sampled_from([[], None]),
        "execution_count": st.sampled_from([None, 1, "x"]),
    },
)
VALID_CELL = st.one_of(
    st.builds(
        lambda source: {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source": source},
        st.one_of(LINE_TEXT, st.lists(LINE_TEXT, max_size=4)),
    ),
    st.builds(lambda source: {"cell_type": "markdown", "metadata": {}, "source": source}, LINE_TEXT),
)
NOTEBOOK = st.fixed_dictionaries(
    {
        "nbformat": st.sampled_from([4, 3, 5, "4"]),
        "nbformat_minor": st.sampled_from([4, 5, 0, -1]),
        "metadata": st.sampled_from([{}, {"kernelspec": {}}, []]),
        "cells": st.lists(st.one_of(CELL, VALID_CELL, JSON), max_size=5),
    }
)
VALID_NOTEBOOK = st.fixed_dictionaries(  # so that many examples get as far as their cells
    {
        "nbformat": st.just(4),
        "nbformat_minor": st.just(4),
        "metadata": st.just({}),
        "cells": st.lists(VALID_CELL, min_size=1, max_size=5),
    }
)


@PROPERTY
@given(notebook=st.one_of(VALID_NOTEBOOK, NOTEBOOK, JSON))
def test_any_notebook_like_json_is_read_or_refused(scratch, notebook):
    cells = read_or_refuse(write(scratch, "mha.ipynb", json.dumps(notebook)))
    if cells:
        assert all(cell.line == 1 for cell in cells)
        for cell in cells:  # each number names a code cell of the notebook as Jupyter lists them
            assert notebook["cells"][cell.number - 1]["cell_type"] == "code"
