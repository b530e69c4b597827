"""The rubric: one TOML file an instructor edits (points, visibility, tolerances, limits, allowed APIs)."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_RUBRIC = Path(__file__).with_name("rubric.toml")
PART_IDS = ("quiz", "combine", "wrapper", "two_dim", "columns", "mha", "fuse", "speed")
VISIBILITIES = ("visible", "after_due_date", "after_published", "hidden")


class RubricError(ValueError):
    """The rubric file is malformed; the message names the key to fix."""


@dataclass(frozen=True)
class Rubric:
    parts: dict[str, dict]
    tests: dict[str, dict] = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    limits: dict = field(default_factory=dict)
    apis: dict[str, bool] = field(default_factory=dict)
    path: Path | None = None

    def part_points(self, part: str) -> float:
        return float(self.parts[part]["points"]) if part in self.parts else 0.0

    def test_settings(self, key: str) -> dict:
        return self.tests.get(key, {})

    def weight(self, key: str) -> float:
        return float(self.test_settings(key).get("weight", 1.0))

    def visibility(self, key: str) -> str:
        return self.test_settings(key).get("visibility", self.defaults.get("visibility", "visible"))

    def tolerance(self, dtype_name: str) -> tuple[float, float]:
        rtol, atol = self.tolerances[dtype_name]
        return float(rtol), float(atol)

    def limit(self, name: str) -> float:
        return float(self.limits[name])

    @property
    def max_score(self) -> float:
        return sum(self.part_points(p) for p in self.parts)


def load_rubric(path: str | Path | None = None) -> Rubric:
    path = Path(path) if path else DEFAULT_RUBRIC
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RubricError(f"cannot read rubric {path}: {exc}") from exc
    parts = data.get("parts", {})
    for part, settings in parts.items():
        if part not in PART_IDS:
            raise RubricError(f"{path}: unknown part [parts.{part}]; part ids are {', '.join(PART_IDS)}")
        if not isinstance(settings.get("points"), (int, float)) or settings["points"] < 0:
            raise RubricError(f"{path}: [parts.{part}] needs points = a number >= 0")
    for key, settings in data.get("tests", {}).items():
        vis = settings.get("visibility")
        if vis is not None and vis not in VISIBILITIES:
            raise RubricError(f"{path}: [tests.\"{key}\"] visibility must be one of {VISIBILITIES}")
    return Rubric(
        parts=parts,
        tests=data.get("tests", {}),
        defaults=data.get("defaults", {}),
        tolerances={k: tuple(v) for k, v in data.get("tolerances", {}).items()},
        limits=data.get("limits", {}),
        apis=data.get("apis", {}),
        path=path,
    )
