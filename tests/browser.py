"""Pages in a real browser: Debian's headless Chromium (the `chromium` fixture, conftest.py, installs it when it
is missing), its DOM and screenshots, and whether a page's plots were drawn."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import apt_packages  # noqa: E402  (tools/ is not a package)


def find_or_install_chromium() -> str:
    """The chromium command; installed with apt-get when missing (as root), else the test is skipped with why."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    why = apt_packages.install(["chromium"])
    if why:
        pytest.skip(f"Chromium is not installed, and could not be installed: {why}")
    found = shutil.which("chromium")
    if not found:
        pytest.skip("apt-get installed chromium, but there is no chromium command")
    return found


def headless(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--force-device-scale-factor=1",
            f"--user-data-dir={profile}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )


# Added to a copy of the page under test: once everything is loaded, where each plot is (page coordinates)
# and how large the page is, written into the DOM for --dump-dom. It adds a line at the very end of the
# page, so nothing above moves.
PROBE = """<script>
addEventListener("load", () => {
  const plots = [...document.querySelectorAll("img[data-plot]")].map((img) => {
    const box = img.getBoundingClientRect();
    return {plot: img.dataset.plot, x: box.x, y: box.y + scrollY, width: box.width, height: box.height,
            natural: img.naturalWidth};
  });
  const probe = document.createElement("pre");
  probe.id = "probe";
  probe.textContent = JSON.stringify({plots, height: document.documentElement.scrollHeight});
  document.body.appendChild(probe);
});
</script>"""
WIDTH = 1100
INK = 0.85  # a pixel darker than this in some channel (0..1) is not the plot's white background


@dataclass
class Plot:
    """A plot as Chromium drew it: its box on the page, its decoded width, and the pixels of the screenshot
    inside the box that are not the background."""

    name: str
    width: float
    height: float
    natural: int
    ink: float  # the fraction of the box's pixels that are not background
    colours: set[tuple[int, ...]]  # the distinct colours in the box (`quantised`)

    def drawn(self, min_width: int = 300, min_height: int = 150) -> bool:
        """A decoded image of a plot's size, with marks and several colours in its box on the screenshot."""
        return (
            self.natural > 0
            and self.width >= min_width
            and self.height >= min_height
            and self.ink > 0.01
            and len(self.colours) >= 4
        )


def plots_in(chromium: str, page: str, folder: Path) -> dict[str, Plot]:
    """Load `page` (HTML text) in headless Chromium, find its plots (`<img data-plot=...>`), take a screenshot
    of the whole page, and measure each plot's box on it."""
    import matplotlib.image

    folder.mkdir(parents=True, exist_ok=True)
    probed = folder / "probed.html"
    probed.write_text(page.replace("</body>", PROBE + "</body>"))
    dom = headless(
        chromium,
        folder / "profile-dom",
        "--dump-dom",
        "--virtual-time-budget=10000",
        f"--window-size={WIDTH},900",
        probed.as_uri(),
    )
    start = dom.stdout.find('<pre id="probe">')
    assert start >= 0, f"the page did not finish loading in Chromium:\n{dom.stderr[-2000:]}"
    text = dom.stdout[start + len('<pre id="probe">') : dom.stdout.index("</pre>", start)]
    found = json.loads(text.replace("&quot;", '"').replace("&amp;", "&"))
    height = int(found["height"]) + 40
    shot = folder / "screenshot.png"
    done = headless(
        chromium,
        folder / "profile-shot",
        f"--screenshot={shot}",
        "--hide-scrollbars",
        "--virtual-time-budget=10000",
        f"--window-size={WIDTH},{height}",
        probed.as_uri(),
    )
    assert shot.is_file(), done.stderr[-2000:]
    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.shape[:2] == (height, WIDTH), pixels.shape
    plots = {}
    for box in found["plots"]:
        x, y = int(box["x"]) + 2, int(box["y"]) + 2  # inside the border
        region = pixels[y : y + max(0, int(box["height"]) - 4), x : x + max(0, int(box["width"]) - 4)]
        ink = float((region.min(axis=-1) < INK).mean()) if region.size else 0.0
        colours = {tuple(int(c * 32) for c in pixel) for pixel in region.reshape(-1, 3)}
        plots[box["plot"]] = Plot(box["plot"], box["width"], box["height"], int(box["natural"]), ink, colours)
    return plots


def quantised(colour: str) -> tuple[int, ...]:
    """A colour written "#rrggbb", as `Plot.colours` holds it (each channel to 1/32)."""
    return tuple(int(int(colour[i : i + 2], 16) / 255 * 32) for i in (1, 3, 5))
