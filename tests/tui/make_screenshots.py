"""Write screenshots/ from the same replay scenarios the snapshot tests check, so the README's
images are the tested UI: an SVG per scenario (Textual's own screenshot) and a PNG beside it when
`rsvg-convert` is installed; then the README's alt text of each image becomes its scenario's
caption (what it shows, and what its A/B claims, checked by tests/tui/test_screenshot_claims.py).

    python -m tests.tui.make_screenshots [OUT_DIR]     (from the repository root; default screenshots/)
"""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
from pathlib import Path

from .scenarios import SCENARIOS, Scenario, replay_app

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


async def svg_of(scenario: Scenario) -> str:
    app = replay_app(scenario)
    async with app.run_test(size=scenario.size) as pilot:
        for key in scenario.press:
            await pilot.press(key)
        await pilot.pause()
        return app.export_screenshot(title=f"specdecode-tune · {scenario.about}")


def alt_text(scenario: Scenario) -> str:
    return f"specdecode-tune, {scenario.caption}"


def with_captions(readme: str, scenarios=SCENARIOS) -> str:
    """`readme` with each `![...](screenshots/NAME.png)` image's alt text set to its scenario's caption."""
    for s in scenarios:
        readme = re.sub(rf"!\[[^\]]*\]\((screenshots/{re.escape(s.name)}\.png)\)",
                        lambda m, s=s: f"![{alt_text(s)}]({m.group(1)})", readme)
    return readme


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    converter = shutil.which("rsvg-convert")
    for scenario in SCENARIOS:
        svg = out / f"{scenario.name}.svg"
        svg.write_text(asyncio.run(svg_of(scenario)), encoding="utf-8")
        print(svg.relative_to(ROOT) if svg.is_relative_to(ROOT) else svg)
        if converter:
            png = svg.with_suffix(".png")
            subprocess.run([converter, "-w", str(scenario.size[0] * 1400 // 120), str(svg), "-o", str(png)],
                           check=True)
            print(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png)
    if not converter:
        print("rsvg-convert not found (apt-get install librsvg2-bin): SVGs only", file=sys.stderr)
    text = README.read_text(encoding="utf-8")
    captioned = with_captions(text)
    if captioned != text:
        README.write_text(captioned, encoding="utf-8")
        print(README.relative_to(ROOT), "(alt text)")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "screenshots")
