"""Rubric files for tests: the packaged rubric's required sections, with parts and checks of a test's own."""

from __future__ import annotations

import re
from pathlib import Path

from autograder.rubric import DEFAULT_RUBRIC, Rubric, load_rubric


def required_sections() -> str:
    """[tolerances], [limits] and [apis] exactly as the packaged rubric has them."""
    text = DEFAULT_RUBRIC.read_text()
    sections = re.split(r"(?m)^(?=\[)", text)
    return "".join(s for s in sections if s.startswith(("[tolerances]", "[limits]", "[apis]")))


def rubric_file(tmp_path: Path, parts_and_tests: str) -> Rubric:
    path = tmp_path / "rubric.toml"
    path.write_text(parts_and_tests + "\n" + required_sections())
    return load_rubric(path)
