"""The live view's page: one self-contained HTML document (inline CSS and script, nothing
fetched from outside the machine) that follows the server's event stream.

It shows the progress (episodes done of requested, lane-steps per second, the ETA), per task
the success rate with its Wilson interval and the mean return with its interval, the
failures with their errors, each lane's latest frame with its episode, step and return, the
recorded videos as they complete, and the latency percentiles. Text from the run (task
names, errors) is set as text, never as markup. A frame is asked for only once the one
before it has loaded, so a slow page shows fewer frames rather than queueing them.

Example:
    >>> PAGE.startswith(b"<!DOCTYPE html>"), b"EventSource" in PAGE, b"http" in PAGE
    (True, True, False)
"""

from __future__ import annotations

_HTML = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>rlmesh live view</title>
<style>
:root { color-scheme: light dark; --fg: #1d2330; --muted: #6b7280; --line: #d9dde5;
        --ok: #15803d; --bad: #b91c1c; --bar: #2563eb; --card: #f6f7f9; }
@media (prefers-color-scheme: dark) {
  :root { --fg: #e5e7eb; --muted: #9ca3af; --line: #374151; --card: #1f2430; }
}
body { font: 14px/1.45 system-ui, sans-serif; color: var(--fg); margin: 0 auto;
       max-width: 1200px; padding: 16px 20px 40px; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 15px; margin: 24px 0 8px; border-bottom: 1px solid var(--line); }
.muted { color: var(--muted); }
#status { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px;
          background: var(--card); border: 1px solid var(--line); margin-left: 8px; }
#status.running { color: var(--bar); } #status.finished { color: var(--ok); }
#status.failed, #status.stalled { color: var(--bad); }
progress { width: 100%; height: 14px; margin: 8px 0 4px; }
.figures span { margin-right: 20px; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 3px 8px; border-bottom: 1px solid var(--line); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
#lanes { display: grid; grid-template-columns: repeat(auto-fill, minmax(200px, 1fr));
         gap: 10px; }
figure.lane { margin: 0; background: var(--card); border: 1px solid var(--line);
              border-radius: 6px; padding: 6px; }
figure.lane img { width: 100%; image-rendering: pixelated; display: block; min-height: 40px; }
figure.lane figcaption { font-size: 12px; margin-top: 4px; font-variant-numeric: tabular-nums; }
#failures li { font-family: ui-monospace, monospace; font-size: 12px; }
#videos { display: grid; grid-template-columns: repeat(auto-fill, minmax(220px, 1fr));
          gap: 10px; }
#videos figure { margin: 0; } #videos video { width: 100%; }
.ok { color: var(--ok); } .bad { color: var(--bad); }
</style>
</head>
<body data-updates="0">
<h1><span id="title">rlmesh</span><span id="status">connecting</span></h1>
<div id="note" class="muted"></div>
<progress id="progress" value="0" max="1"></progress>
<div class="figures">
  <span>episodes <b id="done">0</b></span>
  <span>lane-steps/s <b id="rate">-</b></span>
  <span>ETA <b id="eta">-</b></span>
  <span>elapsed <b id="elapsed">-</b></span>
  <span class="muted">failed <b id="failed">0</b></span>
</div>
<h2>Tasks</h2>
<table id="tasks"><thead><tr><th>task</th><th class="num">episodes</th>
<th class="num">success [95% interval]</th><th class="num">mean return [95% interval]</th>
<th class="num">failed</th></tr></thead><tbody></tbody></table>
<h2>Lanes</h2>
<div id="frames-note" class="muted"></div>
<div id="lanes"></div>
<h2>Failures</h2>
<ul id="failures"></ul>
<h2>Videos</h2>
<div id="videos"></div>
<h2>Latency (ms)</h2>
<table id="latency"><thead><tr><th>op</th><th class="num">count</th><th class="num">p50</th>
<th class="num">p95</th><th class="num">p99</th><th class="num">max</th></tr></thead>
<tbody></tbody></table>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
function num(x, digits) {
  return x === null || x === undefined ? "-" : x.toLocaleString(undefined,
    {minimumFractionDigits: digits, maximumFractionDigits: digits});
}
function pct(x) { return x === null || x === undefined ? "-" : (100 * x).toFixed(1) + "%"; }
function span(x) {
  if (x === null || x === undefined || !isFinite(x)) return "-";
  const s = Math.round(x), h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60;
  const pad = (v) => String(v).padStart(2, "0");
  return (h ? h + ":" + pad(m) : m) + ":" + pad(s % 60);
}
function cell(row, text, cls) {
  const td = document.createElement("td");
  td.textContent = text;
  if (cls) td.className = cls;
  row.appendChild(td);
  return td;
}
function keyed(parent, tag, key, value, make) {
  const selector = tag + "[data-" + key + "=\\"" + CSS.escape(String(value)) + "\\"]";
  let node = parent.querySelector(selector);
  if (!node) {
    node = document.createElement(tag);
    node.dataset[key] = value;
    if (make) make(node);
    parent.appendChild(node);
  }
  return node;
}
function renderTasks(tasks) {
  const body = $("tasks").tBodies[0];
  const names = new Set(tasks.map((t) => t.name));
  for (const row of [...body.rows]) if (!names.has(row.dataset.task)) row.remove();
  for (const t of tasks) {
    const row = keyed(body, "tr", "task", t.name);
    row.replaceChildren();
    cell(row, t.name);
    cell(row, t.done + (t.requested === null ? "" : " / " + t.requested), "num done");
    const si = t.success_interval;
    const success = t.success_rate === null ? "n/a"
      : pct(t.success_rate) + " [" + pct(si[0]) + ", " + pct(si[1]) + "]";
    const s = cell(row, success, "num success");
    if (si) { s.dataset.lo = si[0]; s.dataset.hi = si[1]; }
    const ri = t.return_interval;
    cell(row, t.mean_return === null ? "-" : num(t.mean_return, 2) +
      (ri ? " [" + num(ri[0], 2) + ", " + num(ri[1], 2) + "]" : ""), "num return");
    cell(row, String(t.failed), "num failed" + (t.failed ? " bad" : ""));
  }
}
function renderLanes(lanes, note) {
  $("frames-note").textContent = note || "";
  const grid = $("lanes");
  while (grid.children.length > lanes.length) grid.lastChild.remove();
  for (const lane of lanes) {
    const fig = keyed(grid, "figure", "lane", lane.lane, (f) => {
      f.className = "lane";
      const img = document.createElement("img");
      img.alt = "lane " + lane.lane;
      img.onload = img.onerror = () => { delete img.dataset.loading; };
      f.append(img, document.createElement("figcaption"));
    });
    const img = fig.querySelector("img");
    if (lane.frame !== null && img.dataset.v !== String(lane.frame) && !img.dataset.loading) {
      img.dataset.loading = "1";
      img.dataset.v = lane.frame;
      img.src = "frame/" + lane.lane + "?v=" + lane.frame;
    }
    let text = "lane " + lane.lane;
    if (lane.episode !== null) text += " \\u00b7 episode " + lane.episode;
    if (lane.step !== null) text += " \\u00b7 step " + lane.step;
    if (lane["return"] !== null) text += " \\u00b7 return " + num(lane["return"], 1);
    if (lane.last) {
      const mark = lane.last.error ? " failed" : lane.last.success === true ? " \\u2713"
        : lane.last.success === false ? " \\u2717" : "";
      text += " (last: #" + lane.last.index + " " + num(lane.last.reward, 1) + mark + ")";
    }
    fig.querySelector("figcaption").textContent = text;
    fig.dataset.episode = lane.episode === null ? "" : lane.episode;
    fig.dataset.step = lane.step === null ? "" : lane.step;
  }
}
function renderFailures(failures) {
  const list = $("failures");
  list.replaceChildren();
  for (const f of failures.slice().reverse()) {
    const item = document.createElement("li");
    item.dataset.index = f.index;
    item.textContent = (f.task ? f.task + " " : "") + "#" + f.index + ": " + f.error;
    list.appendChild(item);
  }
}
function renderVideos(videos) {
  const grid = $("videos");
  const ids = new Set(videos.map((v) => String(v.id)));
  for (const fig of [...grid.children]) if (!ids.has(fig.dataset.id)) fig.remove();
  for (const v of videos) {
    keyed(grid, "figure", "id", v.id, (fig) => {
      const video = document.createElement("video");
      video.controls = true;
      video.muted = true;
      video.preload = "metadata";
      video.src = "video/" + v.id;
      const caption = document.createElement("figcaption");
      const mark = v.success === true ? " \\u2713" : v.success === false ? " \\u2717" : "";
      caption.textContent = (v.task ? v.task + " " : "") + "#" + v.index + " return " +
        num(v.reward, 1) + mark;
      fig.append(video, caption);
    });
  }
}
function renderLatency(rows) {
  const body = $("latency").tBodies[0];
  body.replaceChildren();
  for (const r of rows) {
    const row = document.createElement("tr");
    row.dataset.op = r.op;
    cell(row, r.op);
    cell(row, String(r.count), "num");
    for (const q of ["p50", "p95", "p99", "max"]) cell(row, num(r[q], 3), "num");
    body.appendChild(row);
  }
}
function render(s) {
  document.body.dataset.updates = Number(document.body.dataset.updates) + 1;
  document.body.dataset.version = s.version;
  $("title").textContent = s.title;
  document.title = s.title + " \\u00b7 rlmesh live view";
  const status = $("status");
  status.textContent = s.status;
  status.className = s.status;
  $("note").textContent = s.note || "";
  const progress = $("progress");
  progress.max = Math.max(1, s.requested === null ? s.done : s.requested);
  progress.value = s.done;
  $("done").textContent = s.done + (s.requested === null ? "" : " / " + s.requested);
  $("rate").textContent = num(s.lane_steps_per_s, 0);
  $("eta").textContent = s.status === "running" ? span(s.eta_s) : "-";
  $("elapsed").textContent = span(s.elapsed_s);
  $("failed").textContent = s.failed_total;
  renderTasks(s.tasks);
  renderLanes(s.lanes, s.frames_note);
  renderFailures(s.failures);
  renderVideos(s.videos);
  renderLatency(s.latency);
}
const events = new EventSource("events");
events.onmessage = (event) => render(JSON.parse(event.data));
events.onopen = () => { $("status").textContent = "connected"; };
events.onerror = () => {
  if (events.readyState !== EventSource.OPEN) $("status").textContent = "reconnecting";
};
</script>
</body>
</html>
"""

PAGE = _HTML.encode()
"""The page's bytes, as served."""
