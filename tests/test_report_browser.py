"""The HTML report in a real browser (issue 16): headless Chromium renders the file; the
screenshot is not blank and the DOM it built holds one chart per group. Chromium is Debian's
``chromium`` package (``make test`` installs it when it can); without it this test skips
and says why."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from conftest import skip_unless_installed
from test_report_html import HOSTILE, hostile_report, why_report

from redrive.render.html import report_html

CHROMIUM = next(
    (found for name in ("chromium", "chromium-browser") if (found := shutil.which(name))), None
)
pytestmark = [
    pytest.mark.e2e,  # it starts a browser
    skip_unless_installed(
        CHROMIUM is not None,
        "no chromium on PATH (as root, `make test` installs Debian's chromium package)",
    ),
]


def chromium(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None, "no chromium on PATH (CI=true: a missing component fails)"
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # root in CI containers
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={home / 'profile'}",
            # Nothing may be fetched: a page that tried would show no difference, so the
            # check that it does not is the HTML test's; here any name resolves nowhere.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Width, height and rows of an 8-bit RGB or RGBA PNG (what Chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, chunk = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6), (depth, color)
    channels = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    previous = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for x in range(stride):
            left = line[x - channels] if x >= channels else 0
            up = previous[x]
            corner = previous[x - channels] if x >= channels else 0
            if kind == 1:
                line[x] = (line[x] + left) & 0xFF
            elif kind == 2:
                line[x] = (line[x] + up) & 0xFF
            elif kind == 3:
                line[x] = (line[x] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                best = left if pa <= pb and pa <= pc else (up if pb <= pc else corner)
                line[x] = (line[x] + best) & 0xFF
        rows.append(b"".join(bytes(line[i : i + 3]) for i in range(0, stride, channels)))
        previous = line
    return width, height, rows


def test_chromium_renders_the_report_with_a_chart_per_group_light_and_dark(tmp_path: Path) -> None:
    report = hostile_report()
    page = tmp_path / "report.html"
    page.write_text(report_html(report), encoding="utf-8")
    groups = sum(len(q.result.groups) for q in report.queues if q.result)

    dom = chromium("--dump-dom", page.as_uri(), home=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('<svg class="timeline"') == groups
    assert "<script" not in dom.stdout, "a task name became a script"
    assert "alert(1)" in dom.stdout  # shown as text, escaped again by the serialiser
    assert HOSTILE.split("<")[0] in dom.stdout

    shot = tmp_path / "shot.png"
    done = chromium("--window-size=420,900", f"--screenshot={shot}", page.as_uri(), home=tmp_path)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    width, height, rows = png_pixels(shot.read_bytes())
    assert (width, height) == (420, 900)
    background = rows[0][:3]
    pixels = [row[i : i + 3] for row in rows for i in range(0, len(row), 3)]
    painted = sum(1 for p in pixels if p != background)
    assert painted > len(pixels) // 50, f"only {painted} of {len(pixels)} pixels painted"
    assert len(set(pixels)) > 8, "text, cards and bars make many colours"
    assert sum(background) > 600, "light by default"

    dark = tmp_path / "dark.png"
    done = chromium(
        "--force-dark-mode",
        "--window-size=420,900",
        f"--screenshot={dark}",
        page.as_uri(),
        home=tmp_path,
    )
    assert done.returncode == 0 and dark.exists(), done.stderr[-2000:]
    assert sum(png_pixels(dark.read_bytes())[2][0][:3]) < 150, "dark where the reader's is"


def _near(pixel: bytes, colour: tuple[int, int, int], slack: int = 24) -> bool:
    return all(abs(a - b) <= slack for a, b in zip(pixel, colour, strict=True))


def test_chromium_shows_why_states_exceptions_and_a_worker_that_died(tmp_path: Path) -> None:
    page = tmp_path / "why.html"
    page.write_text(report_html(why_report()), encoding="utf-8")
    dom = chromium("--dump-dom", page.as_uri(), home=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<script" not in dom.stdout, "an exception's name became a script"
    assert "alert(3)" in dom.stdout
    assert '<span class="died">3: worker died while running it</span>' in dom.stdout
    assert dom.stdout.count('<dl class="why">') == 2  # both checkout groups; progress has none

    # "worker died" is the page's one text in its warning colour above the fold (the DLQ
    # that could not be scanned comes further down), light and dark, on a phone's width.
    for name, extra, bad in (
        ("light", (), (0xC0, 0x39, 0x2B)),
        ("dark", ("--force-dark-mode",), (0xFF, 0x7B, 0x72)),
    ):
        shot = tmp_path / f"why-{name}.png"
        done = chromium(
            *extra, "--window-size=420,1000", f"--screenshot={shot}", page.as_uri(), home=tmp_path
        )
        assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
        _, _, rows = png_pixels(shot.read_bytes())
        warned = sum(1 for row in rows for i in range(0, len(row), 3) if _near(row[i : i + 3], bad))
        assert warned > 50, f"{name}: {warned} pixels in the warning colour"
