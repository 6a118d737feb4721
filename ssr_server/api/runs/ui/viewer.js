// The run viewer: the list of stored runs (#/) and one run turn by turn (#/runs/ID). Plain DOM, no
// framework, no CDN: every text is set with textContent, never parsed as HTML.
"use strict";

const API = "/v1/agent/runs";
const ACTIVE = new Set(["queued", "running"]);
const view = document.getElementById("view");
const statusLine = document.getElementById("status");
const keyForm = document.getElementById("key-form");
let libraries = null;  // name -> candidate ids, from /v1/libraries
let live = null;  // the AbortController of a run page's live updates
const blobUrls = [];

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function headers() {
  const key = sessionStorage.getItem("ssr-api-key");
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function api(path) {
  const resp = await fetch(path, { headers: headers() });
  if (resp.status === 401) {
    keyForm.hidden = false;
    document.getElementById("key").focus();
    throw new Error("this server needs an API key: enter it above");
  }
  if (!resp.ok) {
    let msg = `${resp.status}`;
    try { msg = (await resp.json()).error.message; } catch (_) { /* not JSON */ }
    throw new Error(msg);
  }
  return resp;
}

const fmtS = (s) => (s === null || s === undefined ? "–" : `${Number(s).toFixed(2)} s`);
const fmtTime = (t) => new Date(t * 1000).toLocaleString();
const say = (text) => { statusLine.textContent = text; };

// ---- the list ---------------------------------------------------------------------------------------
async function showList(params) {
  document.title = "ssr-server runs";
  const outcome = el("select", { id: "f-outcome" }, ...["", "answered", "max_turns", "error", "timeout",
    "context_limit", "cancelled"].map((o) => el("option", { value: o, text: o || "any" })));
  const mode = el("select", { id: "f-mode" }, ...["", "ssr", "freeform"].map((m) =>
    el("option", { value: m, text: m || "any" })));
  outcome.value = params.get("outcome") || "";
  mode.value = params.get("mode") || "";
  const apply = () => {
    const q = new URLSearchParams();
    if (outcome.value) q.set("outcome", outcome.value);
    if (mode.value) q.set("mode", mode.value);
    location.hash = `#/?${q}`;
  };
  outcome.addEventListener("change", apply);
  mode.addEventListener("change", apply);
  let rows = [];
  let sortByLatency = false;
  const body = el("tbody");
  const sortBtn = el("button", { type: "button", "aria-pressed": "false", text: "Latency",
    onclick: () => { sortByLatency = !sortByLatency; sortBtn.setAttribute("aria-pressed", String(sortByLatency));
      render(); } });
  const table = el("table", { id: "runs" },
    el("caption", { class: "meta", text: "Stored runs, newest first" }),
    el("thead", {}, el("tr", {}, ...["Started", "Question", "Mode", "Status", "Outcome", "Turns"].map(
      (h) => el("th", { scope: "col", text: h })), el("th", { scope: "col", "aria-sort": "none" }, sortBtn))),
    body);
  const more = el("button", { type: "button", class: "more", text: "Load more", hidden: true });
  view.replaceChildren(el("h1", { text: "Runs" }),
    el("div", { class: "filters" }, el("label", {}, "Outcome", outcome), el("label", {}, "Mode", mode)),
    table, more);

  function render() {
    const shown = sortByLatency ? [...rows].sort((a, b) => (b.total_s ?? -1) - (a.total_s ?? -1)) : rows;
    table.querySelector("th[aria-sort]").setAttribute("aria-sort", sortByLatency ? "descending" : "none");
    body.replaceChildren(...shown.map((r) => el("tr", { "data-run": r.id },
      el("td", { text: fmtTime(r.created_at) }),
      el("td", {}, el("a", { href: `#/runs/${r.id}`, text: r.question.slice(0, 90) })),
      el("td", { text: r.mode }),
      el("td", {}, el("span", { class: `pill ${r.status}`, text: r.status })),
      el("td", { text: r.outcome || "–" }),
      el("td", { text: String(r.turn_count) }),
      el("td", { class: "latency", text: fmtS(r.total_s) }))));
  }

  async function load(after) {
    const q = new URLSearchParams({ limit: "50" });
    for (const k of ["outcome", "mode"]) if (params.get(k)) q.set(k, params.get(k));
    if (after) q.set("after", after);
    const page = await (await api(`${API}?${q}`)).json();
    rows = rows.concat(page.data);
    render();
    more.hidden = !page.has_more;
    more.onclick = () => load(page.next_after).catch((e) => say(e.message));
    say(`${rows.length} runs shown`);
  }
  await load(null);
}

// ---- one run ------------------------------------------------------------------------------------------
async function candidateIds(run) {
  if (run.options && run.options.candidates && run.options.candidates.length) {
    return run.options.candidates.map((_, i) => ({ id: `c${i + 1}`, text: run.options.candidates[i] }));
  }
  if (libraries === null) {
    libraries = {};
    try {
      for (const lib of await (await api("/v1/libraries")).json()) libraries[lib.name] = lib.candidates;
    } catch (_) { /* the ids then come from the turns alone */ }
  }
  return libraries[run.library] || null;
}

async function imageUrl(runId, n) {
  const blob = await (await api(`${API}/${runId}/images/${n}`)).blob();
  const url = URL.createObjectURL(blob);
  blobUrls.push(url);
  return url;
}

function picture(run, n, caption, boxes = []) {
  const img = el("img", { alt: caption, "data-image": n });
  imageUrl(run.id, n).then((u) => { img.src = u; }).catch((e) => { img.alt = `${caption} (${e.message})`; });
  const frame = el("div", { class: "frame" }, img);
  for (const b of boxes) {
    frame.append(el("div", { class: "box", role: "img", "aria-label": `zoom box ${b.join(", ")}`,
      style: `left:${b[0] / 10}%;top:${b[1] / 10}%;width:${(b[2] - b[0]) / 10}%;height:${(b[3] - b[1]) / 10}%` }));
  }
  return el("figure", {}, frame, el("figcaption", { text: caption }));
}

function candidates(turn, ids) {
  if (!turn.scores || !turn.q) return null;
  const leftOut = turn.left_out || {};
  const all = ids ? ids.map((c) => c.id) : [];
  const scored = all.length ? all.filter((id) => !(id in leftOut)) : turn.scores.map((_, i) => `#${i + 1}`);
  const text = Object.fromEntries((ids || []).map((c) => [c.id, c.text]));
  const list = el("ol", { class: "cands", "aria-label": `turn ${turn.index + 1} candidates` });
  scored.forEach((id, i) => {
    const chosen = id === turn.candidate_id;
    const q = turn.q[i] ?? 0;
    list.append(el("li", { class: `cand${chosen ? " chosen" : ""}`, "data-candidate": id,
      "aria-current": chosen ? "true" : null, title: text[id] || "" },
      el("span", { class: "id" }, chosen ? el("span", { class: "mark", text: "✓ ", "aria-label": "chosen:" }) : null, id),
      el("span", { class: "bar", role: "img", "aria-label": `q ${q.toFixed(3)}` },
        el("span", { style: `width:${(100 * q).toFixed(1)}%` })),
      el("span", { class: "s", text: `S ${turn.scores[i] === null ? "–" : turn.scores[i].toFixed(3)}` }),
      el("span", { class: "q", text: `q ${q.toFixed(3)}` })));
  });
  for (const [id, why] of Object.entries(leftOut)) {
    list.append(el("li", { class: "cand left-out", "data-candidate": id },
      el("span", { class: "id", text: id }), el("span", { text: `not scored: ${why}` })));
  }
  return list;
}

function timing(turn) {
  const total = turn.reasoning_s + turn.action_s + turn.tool_s || 1;
  const part = (cls, s) => el("span", { class: cls, style: `width:${(100 * s / total).toFixed(1)}%`,
    title: `${cls} ${fmtS(s)}` });
  return el("div", {},
    el("div", { class: "timing", role: "img", "aria-label":
      `reasoning ${fmtS(turn.reasoning_s)}, action ${fmtS(turn.action_s)}, tool ${fmtS(turn.tool_s)}` },
      part("reasoning", turn.reasoning_s), part("action", turn.action_s), part("tool", turn.tool_s)),
    el("div", { class: "legend meta" }, el("span", { class: "reasoning" }), `reasoning ${fmtS(turn.reasoning_s)}`,
      el("span", { class: "action" }), `action ${fmtS(turn.action_s)}`,
      el("span", { class: "tool" }), `tool ${fmtS(turn.tool_s)}`));
}

function turnCard(run, turn, ids) {
  const card = el("section", { class: "card turn", "data-turn": turn.index,
    "aria-labelledby": `turn-${turn.index}` },
    el("h2", { id: `turn-${turn.index}`, text: `Turn ${turn.index + 1}` }),
    el("p", { class: "meta", text: turn.mode === "ssr" ? `chose ${turn.candidate_id}` : "free-form reasoning" }),
    candidates(turn, ids),
    el("h3", { text: "Reasoning" }), el("pre", { class: "reasoning", text: turn.reasoning }),
    el("h3", { text: "Action" }), el("pre", { class: "action", text: turn.action_text }));
  if (turn.tool_name) {
    card.append(el("p", { class: "tool-call", text: `${turn.tool_name}(${JSON.stringify(turn.arguments)})` }));
  }
  if (turn.observation) {
    card.append(el("h3", { text: "Observation" }), el("pre", { class: "observation", text: turn.observation }));
  }
  const zoom = turn.action_type === "zoom" && turn.observation_ok && turn.tool_data ? turn.tool_data : null;
  if (zoom && run.images.some((i) => i.n === zoom.image)) {
    card.append(el("div", { class: "images" },
      picture(run, zoom.source_image, `image ${zoom.source_image}, zoom box drawn`, [zoom.box]),
      picture(run, zoom.image, `zoomed crop (image ${zoom.image})`)));
  }
  if (turn.error) card.append(el("p", { class: "error", text: `error: ${turn.error}` }));
  card.append(timing(turn));
  return card;
}

function header(run) {
  return el("section", { class: "card", id: "run-head" },
    el("h1", { text: run.question }),
    el("p", {}, el("span", { class: `pill ${run.status}`, id: "run-status", text: run.status }),
      ` ${run.mode} · ${run.library} · ${run.turn_count} turns · ${fmtS(run.total_s)} · started ${fmtTime(run.created_at)}`),
    run.answer !== null ? el("p", { id: "run-answer" }, el("strong", { text: "Answer: " }), run.answer) : null,
    run.error ? el("p", { class: "error", text: run.error }) : null,
    el("div", { class: "images" }, ...run.images.filter((i) => i.source === "input").map((i) =>
      picture(run, i.n, `input image ${i.n} (${i.width}×${i.height})`))));
}

async function showRun(runId) {
  let run = await (await api(`${API}/${runId}`)).json();
  const ids = await candidateIds(run);
  document.title = `run ${run.id.slice(0, 8)} · ssr-server`;
  const turns = el("div", { id: "turns" });
  view.replaceChildren(el("p", {}, el("a", { href: "#/", text: "← all runs" })), header(run), turns);
  for (const t of run.turns) turns.append(turnCard(run, t, ids));
  say(`run ${run.status}, ${run.turns.length} turns`);
  if (ACTIVE.has(run.status)) {
    follow(run, turns, ids).catch((e) => { if (e.name !== "AbortError") say(`live updates stopped: ${e.message}`); });
  }
}

async function follow(run, turns, ids) {
  // live: the events stream (read with fetch, so that an API key can be sent)
  live = new AbortController();
  const resp = await fetch(`${API}/${run.id}/events`, { headers: headers(), signal: live.signal });
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let seen = run.turns.length;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value.replace(/\r\n/g, "\n");
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const name = (block.match(/^event: ?(.*)$/m) || [])[1] || "message";
      const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (!data) continue;
      const payload = JSON.parse(data);
      if (name === "turn" && payload.index >= seen) {
        seen = payload.index + 1;
        turns.append(turnCard(run, payload, ids));
        say(`turn ${seen} arrived`);
      } else if (name === "status") {
        document.getElementById("run-status").textContent = payload.status;
      } else if (name === "run") {
        run = payload;
        document.getElementById("run-head").replaceWith(header(run));
        say(`run ${run.status}`);
      }
    }
  }
}

async function route() {
  if (live) { live.abort(); live = null; }
  while (blobUrls.length) URL.revokeObjectURL(blobUrls.pop());
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  say("loading…");
  try {
    const m = path.match(/^\/runs\/([A-Za-z0-9_-]+)$/);
    if (m) await showRun(m[1]);
    else await showList(new URLSearchParams(query || ""));
  } catch (e) {
    if (e.name !== "AbortError") say(`could not load: ${e.message}`);
  }
  document.getElementById("main").focus({ preventScroll: true });
}

keyForm.addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem("ssr-api-key", document.getElementById("key").value);
  keyForm.hidden = true;
  route();
});
window.addEventListener("hashchange", route);
route();
