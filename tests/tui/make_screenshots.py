"""Write screenshots/ from the same replay scenarios the snapshot tests check, so the README's
images are the tested UI: an SVG per scenario (Textual's own screenshot) and a PNG beside it when
`rsvg-convert` is installed.

    python -m tests.tui.make_screenshots [OUT_DIR]     (from the repository root; default screenshots/)
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

from .scenarios import SCENARIOS, SIZE, Scenario, replay_app

ROOT = Path(__file__).resolve().parents[2]


async def svg_of(scenario: Scenario) -> str:
    app = replay_app(scenario)
    async with app.run_test(size=SIZE) as pilot:
        for key in scenario.press:
            await pilot.press(key)
        await pilot.pause()
        return app.export_screenshot(title=f"specdecode-tune · {scenario.about}")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    converter = shutil.which("rsvg-convert")
    for scenario in SCENARIOS:
        svg = out / f"{scenario.name}.svg"
        svg.write_text(asyncio.run(svg_of(scenario)), encoding="utf-8")
        print(svg.relative_to(ROOT) if svg.is_relative_to(ROOT) else svg)
        if converter:
            png = svg.with_suffix(".png")
            subprocess.run([converter, "-w", "1400", str(svg), "-o", str(png)], check=True)
            print(png.relative_to(ROOT) if png.is_relative_to(ROOT) else png)
    if not converter:
        print("rsvg-convert not found (apt-get install librsvg2-bin): SVGs only", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "screenshots")
