"""Screenshots of the TUI attached to a live server, built exactly as `specdecode-tune attach URL
--load N` builds it (the same backend, session, NVML sampler and app), run headless by Textual: the
main screen after --seconds of load, then after each --press sequence (e.g. a placement change),
written as SVG (Textual's own screenshot). For the README's GPU images: run it next to the server.

    python benchmarks/tui_live_screenshot.py http://127.0.0.1:30000 OUT_DIR --load 4 --seconds 25 \\
        --press p:20

Not a test: it prints where the files went and what the session saw.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import common  # noqa: E402, F401  (puts this checkout on sys.path)


async def shoot(url: str, out: Path, load: int, seconds: float, presses: list[tuple[str, float]],
                size: tuple[int, int]) -> list[Path]:
    from tuner.app import make_app
    from tuner.backends import connect
    from tuner.commands.options import builtin_prompts, gpu_labels, start_nvml
    from tuner.core.session import Session

    backend = connect(url)
    session = Session(backend)
    sampler = start_nvml(session)
    files = []
    try:
        app = make_app(session, load=load, prompts=builtin_prompts(), max_new_tokens=256,
                       gpu_labels=gpu_labels(sampler))
        app.animation_level = "none"
        async with app.run_test(size=size) as pilot:
            await asyncio.sleep(seconds)
            await pilot.pause()
            files.append(_save(app, out / "live_main.svg", f"attached to {url}"))
            for i, (keys, wait) in enumerate(presses):
                for k in keys.split(","):
                    await pilot.press(k)
                await asyncio.sleep(wait)
                await pilot.pause()
                files.append(_save(app, out / f"live_after_{i + 1}.svg", f"after pressing {keys}"))
    finally:
        if sampler is not None:
            sampler.stop()
        session.close()
    return files


def _save(app, path: Path, about: str) -> Path:
    path.write_text(app.export_screenshot(title=f"specdecode-tune · {about}"), encoding="utf-8")
    print(path)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("out", type=Path)
    ap.add_argument("--load", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=25.0, help="load time before the first screenshot")
    ap.add_argument("--press", action="append", default=[], metavar="KEYS:SECONDS",
                    help="press KEYS (comma-separated), wait SECONDS, screenshot (repeatable)")
    ap.add_argument("--size", default="160x50", help="terminal COLUMNSxROWS")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    presses = []
    for p in a.press:
        keys, _, wait = p.rpartition(":")
        presses.append((keys, float(wait)))
    cols, rows = (int(x) for x in a.size.split("x"))
    asyncio.run(shoot(a.url, a.out, a.load, a.seconds, presses, (cols, rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
