"""The live view's page in real headless Firefox: Debian's ``firefox-esr``, driven over its own
WebDriver BiDi agent by ``firefox_bidi`` (no geckodriver: Debian has no package of it, and
nothing is downloaded at run time).

The same run and checks as the Chromium test (``test_view_browser.py``): a paced CartPole run
on 4 lanes runs on a thread while the page is open; progress advances between two
screenshots, every lane's frame is there, decoded, and changes, the task's success rate shows
its interval, the page logs no console error or uncaught exception, and the page still loads
after the run ends. The videos a recording run writes appear on the open page as they
complete and play: Firefox decodes their H.264 through the system's libavcodec, which Debian's
firefox-esr recommends (installed with it by default). Any fetch from outside the machine goes
to a proxy that refuses it.

``.ci/run`` installs firefox-esr. Elsewhere the test skips, saying what is missing, unless
``RLMESH_REQUIRE_BROWSER=1`` (set by ``.ci/run``) makes that a failure.
"""

from __future__ import annotations

import re
import time

import pytest
import rlmesh
from rlmesh.view import LiveView
from test_report_html_browser import _found, _unavailable
from viewing import IMAGE, RunThread, image_policy, make_image_env, paced_policy

FIREFOX = ("/usr/bin/firefox-esr", "firefox-esr", "firefox")
LANES, EPISODES = 4, 24


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


PAGE = (
    "(() => {"
    "  const lanes = [...document.querySelectorAll('figure.lane')];"
    "  return {"
    "    updates: Number(document.body.dataset.updates),"
    "    status: document.getElementById('status').textContent,"
    "    done: Number(document.getElementById('progress').value),"
    "    steps: lanes.map(f => Number(f.dataset.step || 0)),"
    "    frames: lanes.map(f => f.querySelector('img').dataset.v || null),"
    "    decoded: lanes.map(f => f.querySelector('img').naturalWidth),"
    "    tasks: [...document.querySelectorAll('#tasks tbody tr')].map(r =>"
    "      [r.dataset.task, r.querySelector('.success').textContent,"
    "       r.querySelector('.return').textContent])"
    "  };"
    "})()"
)
"""What the page shows now: progress, each lane's frame and caption, the task rows."""


def test_the_page_follows_a_run_in_firefox(firefox, tmp_path):
    # Frames as often as the page can show them (the budget is the bench's business).
    with LiveView("http", announce=False, title="cartpole", frame_budget=0.5) as view:
        lanes = view.lanes("CartPole-v1", num_envs=LANES)

        def evaluate():
            return rlmesh.run(
                paced_policy,
                lanes,
                episodes=EPISODES,
                max_episode_steps=150,
                success=100,
                hooks=[view],
            )

        run = RunThread(evaluate)
        try:
            firefox.navigate(view.url)  # returns once the page's load event fired
            firefox.wait_for(
                f"[...document.querySelectorAll('figure.lane img')]"
                f".filter(i => i.complete && i.naturalWidth > 0).length === {LANES}",
                "every lane's frame did not show",
            )
            first = firefox.evaluate(PAGE)
            (tmp_path / "first.png").write_bytes(firefox.screenshot())
            time.sleep(1.5)  # the run goes on: steps, frames and episodes move
            second = firefox.evaluate(PAGE)
            (tmp_path / "second.png").write_bytes(firefox.screenshot())
            assert run.alive or second["status"] == "finished"
        finally:
            result = run.join()
        assert first["status"] == "running"
        assert second["updates"] > first["updates"]
        assert (second["done"], sum(second["steps"])) != (first["done"], sum(first["steps"]))
        assert all(width > 0 for width in first["decoded"])
        assert first["frames"] != second["frames"]  # new frames came
        shots = [(tmp_path / name).read_bytes() for name in ("first.png", "second.png")]
        assert all(shot.startswith(b"\x89PNG\r\n\x1a\n") for shot in shots)
        assert shots[0] != shots[1] and all(len(shot) > 10_000 for shot in shots)

        # The end: every episode, its task's success rate with its interval.
        firefox.wait_for(
            f"document.getElementById('status').textContent === 'finished' && "
            f"Number(document.getElementById('progress').value) === {EPISODES}",
            "the page did not show the run's end",
        )
        (task,) = firefox.evaluate(PAGE)["tasks"]
        succeeded = sum(bool(episode.success) for episode in result.episodes)
        assert task[0] == "CartPole-v1"
        rate = re.fullmatch(r"([\d.]+)% \[([\d.]+)%, ([\d.]+)%\]", task[1])
        assert rate, task[1]
        low, mid, high = (float(rate.group(k)) for k in (2, 1, 3))
        assert low <= mid <= high and abs(mid - 100 * succeeded / EPISODES) < 0.06
        assert re.fullmatch(r"[\d.,]+ \[[\d.,]+, [\d.,]+\]", task[2]), task[2]

        # After the run, the page still loads, with the final figures.
        firefox.reload()
        firefox.wait_for(
            "document.getElementById('status').textContent === 'finished' && "
            f"Number(document.getElementById('progress').value) === {EPISODES}",
            "the page did not load after the run",
        )
        errors = [(entry.get("type"), entry.get("text")) for entry in firefox.errors()]
        assert errors == []


VIDEOS = (
    "[...document.querySelectorAll('#videos figure')].map(f => {"
    "  const v = f.querySelector('video');"
    "  return {caption: f.querySelector('figcaption').textContent, ready: v.readyState,"
    "          width: v.videoWidth, height: v.videoHeight, duration: v.duration,"
    "          error: v.error && (v.error.code + ': ' + v.error.message)};"
    "})"
)
"""Each recorded video on the page: its caption, how far Firefox got with it, its error."""


def test_recorded_videos_appear_and_play_in_firefox(firefox, tmp_path):
    with LiveView("http", announce=False, videos_from=tmp_path) as view:
        lanes = view.lanes(make_image_env, num_envs=2)
        firefox.navigate(view.url)  # open before the run: the videos come while it runs

        def evaluate():
            return rlmesh.run(
                image_policy,
                lanes,
                episodes=3,
                record_video=2,
                results_path=tmp_path / "r.jsonl",
                hooks=[view],
            )

        run = RunThread(evaluate)
        try:
            # Each video decoded up to its first frame (readyState 2) or failed.
            videos = firefox.wait_for(
                f"(() => {{ const v = {VIDEOS};"
                "  return v.length === 2 && v.every(x => x.ready >= 2 || x.error) && v; })()",
                "two videos did not load",
            )
        finally:
            result = run.join()
        assert [video["error"] for video in videos] == [None, None]
        assert all((video["width"], video["height"]) == IMAGE[1::-1] for video in videos)
        assert all(video["duration"] > 0 for video in videos)
        recorded = {episode.index for episode in result.episodes if episode.video}
        shown = {int(re.search(r"#(\d+)", video["caption"]).group(1)) for video in videos}
        assert shown == recorded and len(shown) == 2
        errors = [(entry.get("type"), entry.get("text")) for entry in firefox.errors()]
        assert errors == []
