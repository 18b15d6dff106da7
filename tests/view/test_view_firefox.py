"""The live view's page in real headless Firefox: Debian's ``firefox-esr``, driven over its own
WebDriver BiDi agent by ``firefox_bidi`` (no geckodriver: Debian has no package of it, and
nothing is downloaded at run time).

The checks are ``viewing``'s, shared with Chromium (``test_view_browser.py``): a paced
CartPole run on 4 lanes while the page is open (progress, every lane's frame, the success rate
with its interval, no console error or uncaught exception, the page loading after the run),
and a recording run's videos appearing on the open page as they complete and playing: Firefox
decodes their H.264 through the system's libavcodec, which Debian's firefox-esr recommends
(installed with it by default). Any fetch from outside the machine goes to a proxy that
refuses it. This module only starts Firefox; ``firefox_bidi.Firefox`` is a ``viewing.Page``.

``.ci/run`` installs firefox-esr. Elsewhere the test skips, saying what is missing, unless
``RLMESH_REQUIRE_BROWSER=1`` (set by ``.ci/run``) makes that a failure.
"""

from __future__ import annotations

import pytest
from test_report_html_browser import _found, _unavailable
from viewing import check_recorded_videos_appear_and_play, check_the_page_follows_a_run

FIREFOX = ("/usr/bin/firefox-esr", "firefox-esr", "firefox")


@pytest.fixture(scope="module")
def firefox_session():
    """A headless Firefox session on a fresh profile for the module's tests (starting one
    takes a few seconds), closed and removed afterwards."""
    try:
        import websockets.sync.client  # noqa: F401 - the BiDi client's transport
    except ImportError:
        _unavailable("websockets is not installed (pip install '.[test]')")
    binary = _found(FIREFOX)
    if binary is None:
        _unavailable(
            f"Firefox not found (looked for {', '.join(FIREFOX)}: paths, and names on PATH); "
            "install Debian's firefox-esr, as .ci/run does"
        )
    from firefox_bidi import launch

    with launch(binary) as browser:
        yield browser


@pytest.fixture
def firefox(firefox_session):
    """The module's Firefox, its log emptied of what earlier tests' pages logged."""
    firefox_session.log.clear()
    return firefox_session


def test_the_page_follows_a_run_in_firefox(firefox, tmp_path):
    check_the_page_follows_a_run(firefox, tmp_path)


def test_recorded_videos_appear_and_play_in_firefox(firefox, tmp_path):
    check_recorded_videos_appear_and_play(firefox, tmp_path)
