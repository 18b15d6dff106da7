"""The HTML report in a real headless browser: Debian's Chromium, driven by its chromedriver.

The report of a three-task suite with recorded videos is opened from its file:// URL, with
the network cut off; the test asserts the browser logged no error, every plot rendered with
each task's histograms and success bar drawn, every video decoded (``readyState`` and
``videoWidth`` after a bounded wait), and takes a screenshot.

``.ci/run`` installs chromium and chromium-driver. Elsewhere the test skips, saying which is
missing, unless ``RLMESH_REQUIRE_BROWSER=1`` (set by ``.ci/run``) makes that a failure.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import time
import zlib

import pytest
from rlmesh.report import write_html
from test_report_html import TASKS, suite_file

CHROMIUM = ("/usr/bin/chromium", "chromium")
CHROMEDRIVER = ("/usr/bin/chromedriver", "chromedriver")
LOAD_TIMEOUT_S = 30.0
VIDEOS_PER_TASK = 1


def _found(candidates: tuple[str, ...]) -> str | None:
    for candidate in candidates:
        path = candidate if os.path.isabs(candidate) else shutil.which(candidate)
        if path and os.access(path, os.X_OK):
            return path
    return None


def _unavailable(reason: str) -> None:
    if os.environ.get("RLMESH_REQUIRE_BROWSER") == "1":
        pytest.fail(f"RLMESH_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture
def browser(tmp_path):
    """A headless Chromium session, quit afterwards (its profile under tmp_path)."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("selenium is not installed (pip install '.[test]')")
    chromium, chromedriver = _found(CHROMIUM), _found(CHROMEDRIVER)
    if chromium is None or chromedriver is None:
        missing = [name for name, path in (("chromium", chromium), ("chromedriver", chromedriver))
                   if path is None]  # fmt: skip
        _unavailable(
            f"{' and '.join(missing)} not found (looked for {CHROMIUM[0]}, {CHROMEDRIVER[0]} "
            "and on PATH); install Debian's chromium and chromium-driver, as .ci/run does"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium  # given, so Selenium Manager downloads nothing
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,2400",
        "--autoplay-policy=no-user-gesture-required",
        f"--user-data-dir={tmp_path / 'profile'}",
        # A page that tried to fetch anything would fail loudly (and log an error).
        "--proxy-server=http://127.0.0.1:9",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    try:
        driver.set_page_load_timeout(LOAD_TIMEOUT_S)
        yield driver
    finally:
        driver.quit()


def _wait(driver, script: str, what: str) -> object:
    """Poll ``script`` until it returns something truthy, at most ``LOAD_TIMEOUT_S``."""
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while True:
        value = driver.execute_script(script)
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {LOAD_TIMEOUT_S} s: {driver.execute_script(script)!r}")
        time.sleep(0.1)


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _distinct_rows(data: bytes) -> int:
    """How many different scanlines a PNG's image holds (a blank page has one)."""
    from PIL import Image  # pillow: in the test extra

    image = Image.open(io.BytesIO(data)).convert("RGB")
    rows = image.tobytes()
    stride = image.width * 3
    return len({zlib.crc32(rows[y * stride : (y + 1) * stride]) for y in range(image.height)})


def test_the_report_renders_in_chromium_with_its_plots_and_videos(browser, tmp_path):
    path = suite_file(tmp_path, videos=VIDEOS_PER_TASK, errors=1)
    out = write_html(path, tmp_path / "report.html")
    browser.get(out.resolve().as_uri())
    _wait(browser, "return document.readyState === 'complete'", "the page did not load")

    plots = _wait(
        browser,
        "const plots = [...document.querySelectorAll('figure.plot > svg')];"
        "return plots.length && plots.every(p => p.getBoundingClientRect().width > 100) && "
        "plots.map(p => p.parentElement.className);",
        "the plots did not render",
    )
    assert sorted(plots) == sorted(
        f"plot plot-{kind}" for kind in ("success", "distributions", "latency")
    )
    for kind in ("returns", "lengths", "success"):  # each task's artist, drawn
        # (A success bar of a rate of 0 is as wide as nothing: its height says it is drawn.)
        drawn = browser.execute_script(
            f"return [...document.querySelectorAll('g[id^=\"{kind}-\"]')]"
            ".map(g => [g.id, (g.getBBox().width > 0 || g.id.startsWith('success')) && "
            "g.getBBox().height > 0])"
        )
        assert drawn == [[f"{kind}-{k}", True] for k in range(len(TASKS))], kind
    per_task = browser.execute_script(
        "return [...document.querySelectorAll('section.task')].map(s => "
        "[s.dataset.task, s.querySelectorAll('video').length])"
    )
    assert per_task == [[task, VIDEOS_PER_TASK] for task in TASKS]

    videos = _wait(
        browser,
        "const videos = [...document.querySelectorAll('video')];"
        "return videos.every(v => v.readyState >= 2 && v.videoWidth > 0) && "
        "videos.map(v => [v.videoWidth, v.videoHeight, v.error && v.error.code]);",
        "the videos did not decode",
    )
    assert videos == [[96, 64, None]] * (VIDEOS_PER_TASK * len(TASKS))

    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []

    shot = tmp_path / "report.png"
    assert browser.save_screenshot(str(shot))
    data = shot.read_bytes()
    width, height = _png_size(data)
    assert width >= 800 and height >= 1000 and len(data) > 20_000
    assert _distinct_rows(data) > 100  # text, tables and plots, not a blank page
