"""Reading submissions into cells: notebooks and .py files, magics never run, line numbers kept."""
import nbformat
import pytest

from autograder.submission import SubmissionFormatError, neutralise_magics, python_cells, read_cells


def test_python_file_without_markers_is_one_cell():
    assert python_cells("x = 1\ny = 2\n") == [(1, "x = 1\ny = 2\n")]


def test_percent_cells_keep_file_line_numbers_and_skip_markdown():
    text = "# %%\nimport torch\n# %% [markdown]\n# prose\n# %%\ny = 1\n"
    cells = python_cells(text)
    assert [number for number, _ in cells] == [1, 3]
    # padded with blank lines so that `y = 1` stays on line 6 of the file
    assert cells[1][1].splitlines()[5] == "y = 1"


def test_magics_and_shell_escapes_become_pass():
    source = "%matplotlib inline\n!pip install x\nfiles = !ls\nif True:\n    %time y = 1\nz = 2"
    out = neutralise_magics(source).splitlines()
    assert out[0].startswith("pass") and out[1].startswith("pass") and out[2].startswith("pass")
    assert out[4].startswith("    pass")
    assert out[5] == "z = 2"
    compile("\n".join(out), "<cell>", "exec")  # still valid Python


def test_cell_magic_cells_are_dropped(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# title"),
        nbformat.v4.new_code_cell("%%bash\necho hi"),
        nbformat.v4.new_code_cell("x = 1"),
    ]
    path = tmp_path / "mha.ipynb"
    nbformat.write(notebook, path)
    assert read_cells(path) == [(3, "x = 1\n")]


@pytest.mark.parametrize("name,content,message", [
    ("mha.txt", "x = 1", "a .py or .ipynb file"),
    ("mha.ipynb", "{not json", "not a readable Jupyter notebook"),
])
def test_unreadable_submissions_say_why(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(SubmissionFormatError, match=message):
        read_cells(path)
