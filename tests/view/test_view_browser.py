"""The live view's page in a real headless browser: Debian's Chromium, driven by its
chromedriver, through the HTML report's browser fixture (``browser``: its skip, its
``RLMESH_REQUIRE_BROWSER=1`` failure, a proxy that fails any fetch from outside the machine).

The checks are ``viewing``'s, shared with Firefox (``test_view_firefox.py``): a paced CartPole
run on 4 lanes while the page is open (progress, every lane's frame, the success rate with its
interval, no error logged, the page loading after the run), and a recording run's videos
appearing on the open page and decoding. This module only adapts chromedriver to ``Page``.
"""

from __future__ import annotations

from typing import Any

from test_report_html_browser import browser  # noqa: F401 - the fixture
from viewing import check_recorded_videos_appear_and_play, check_the_page_follows_a_run, wait_on


class Chromium:
    """A Selenium Chromium session as a ``viewing.Page``."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def navigate(self, url: str) -> None:
        self.driver.get(url)  # returns once loaded (the fixture bounds it), checked below
        wait_on(self, "document.readyState === 'complete'", "the page did not load")

    def reload(self) -> None:
        self.driver.refresh()
        wait_on(self, "document.readyState === 'complete'", "the page did not load again")

    def evaluate(self, expression: str) -> Any:
        return self.driver.execute_script(f"return ({expression});")

    def screenshot(self) -> bytes:
        return self.driver.get_screenshot_as_png()

    def console_errors(self) -> list[str]:
        # Chromium logs a console error and an uncaught exception alike as SEVERE.
        entries = self.driver.get_log("browser")
        return [entry["message"] for entry in entries if entry["level"] == "SEVERE"]


def test_the_page_follows_a_run_in_chromium(browser, tmp_path):  # noqa: F811 - the fixture
    check_the_page_follows_a_run(Chromium(browser), tmp_path)


def test_recorded_videos_appear_and_play_in_chromium(browser, tmp_path):  # noqa: F811
    check_recorded_videos_appear_and_play(Chromium(browser), tmp_path)
