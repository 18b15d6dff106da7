"""The live view's page in a real headless browser: Debian's Chromium, driven by its
chromedriver, through the HTML report's browser fixture (``browser``: its skip, its
``RLMESH_REQUIRE_BROWSER=1`` failure, a proxy that fails any fetch from outside the machine).

A paced CartPole run on 4 lanes runs on a thread while the page is open: progress advances
between two screenshots, every lane's frame is there and changes, each task's success rate
shows its interval, the browser logs no error, and the page still loads after the run ends.
"""

from __future__ import annotations

import re
import time

import rlmesh
from rlmesh.view import LiveView
from test_report_html_browser import _wait, browser  # noqa: F401 - the fixture
from viewing import RunThread, paced_policy

LANES, EPISODES = 4, 24


def _page(driver) -> dict:
    """What the page shows now: progress, each lane's frame and caption, the task rows."""
    return driver.execute_script(
        "const lanes = [...document.querySelectorAll('figure.lane')];"
        "return {"
        "  updates: Number(document.body.dataset.updates),"
        "  status: document.getElementById('status').textContent,"
        "  done: Number(document.getElementById('progress').value),"
        "  steps: lanes.map(f => Number(f.dataset.step || 0)),"
        "  frames: lanes.map(f => f.querySelector('img').dataset.v || null),"
        "  decoded: lanes.map(f => f.querySelector('img').naturalWidth),"
        "  tasks: [...document.querySelectorAll('#tasks tbody tr')].map(r =>"
        "    [r.dataset.task, r.querySelector('.success').textContent,"
        "     r.querySelector('.return').textContent])"
        "};"
    )


def test_the_page_follows_a_run_in_chromium(browser, tmp_path):  # noqa: F811 - the fixture
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
            browser.get(view.url)
            _wait(browser, "return document.readyState === 'complete'", "the page did not load")
            _wait(
                browser,
                f"return [...document.querySelectorAll('figure.lane img')]"
                f".filter(i => i.naturalWidth > 0).length === {LANES}",
                "every lane's frame did not show",
            )
            first = _page(browser)
            browser.save_screenshot(str(tmp_path / "first.png"))
            time.sleep(1.5)  # the run goes on: steps, frames and episodes move
            second = _page(browser)
            browser.save_screenshot(str(tmp_path / "second.png"))
            assert run.alive or second["status"] == "finished"
        finally:
            result = run.join()
        assert first["status"] == "running"
        assert second["updates"] > first["updates"]
        assert (second["done"], sum(second["steps"])) != (first["done"], sum(first["steps"]))
        assert all(width > 0 for width in first["decoded"])
        assert first["frames"] != second["frames"]  # new frames came
        shots = [(tmp_path / name).read_bytes() for name in ("first.png", "second.png")]
        assert shots[0] != shots[1] and all(len(shot) > 10_000 for shot in shots)

        # The end: every episode, its task's success rate with its interval.
        _wait(
            browser,
            f"return document.getElementById('status').textContent === 'finished' && "
            f"Number(document.getElementById('progress').value) === {EPISODES}",
            "the page did not show the run's end",
        )
        (task,) = _page(browser)["tasks"]
        succeeded = sum(bool(episode.success) for episode in result.episodes)
        assert task[0] == "CartPole-v1"
        rate = re.fullmatch(r"([\d.]+)% \[([\d.]+)%, ([\d.]+)%\]", task[1])
        assert rate, task[1]
        low, mid, high = (float(rate.group(k)) for k in (2, 1, 3))
        assert low <= mid <= high and abs(mid - 100 * succeeded / EPISODES) < 0.06
        assert re.fullmatch(r"[\d.,]+ \[[\d.,]+, [\d.,]+\]", task[2]), task[2]

        # After the run, the page still loads, with the final figures.
        browser.refresh()
        _wait(
            browser,
            "return document.getElementById('status').textContent === 'finished'",
            "the page did not load after the run",
        )
        errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        assert errors == []
