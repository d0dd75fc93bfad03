// makespan dashboard: draws the snapshot of /api/state, then every server-sent "state"
// event of /api/stream. No library, nothing fetched from elsewhere; URLs are relative
// so the page works behind a path prefix.
"use strict";

// same order and colours as makespan.gantt.ENDPOINT_PALETTE (sorted endpoint names)
const PALETTE = ["#1f77b4", "#ff7f0e", "#9467bd", "#d62728", "#8c564b", "#e377c2", "#17becf", "#bcbd22",
                 "#7f7f7f", "#393b79"];
const PRIORITY_COLOURS = {CRITICAL: "#b2182b", HIGH: "#e66101", NORMAL: "#2166ac", LOW: "#404040"};
const TRANSITIONS = new Set(["evict", "start_endpoint", "clear", "restore"]);
const SVG = "http://www.w3.org/2000/svg";

function el(tag, attrs, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) node.append(c);
  return node;
}

function clock(t) {
  if (t === null || t === undefined) return "";
  const d = new Date(t * 1000);
  return d.toLocaleTimeString([], {hour12: false}) + "." + String(d.getMilliseconds()).padStart(3, "0").slice(0, 1);
}

// an ETA (unix s) seen at `now`: "+12.0 s", or "passed 40 s ago" when the plan it came from
// has passed it (the job did not start then: as `makespan why` says it), "unknown" without one
function etaText(eta, now) {
  if (eta === null || eta === undefined || eta === "") return "unknown";
  const ahead = Number(eta) - now;
  return ahead >= 0.5 ? "+" + secs(ahead) : ahead > -0.5 ? "now" : `passed ${secs(-ahead)} ago`;
}

function secs(s) {
  if (s === null || s === undefined) return "";
  if (s < 60) return s.toFixed(1) + " s";
  if (s < 3600) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}

// a URL relative to this page, without the credentials a page URL may carry (fetch
// refuses those; the browser still sends the basic auth it used for the page)
function api(rel) {
  const u = new URL(rel, location.href);
  u.username = "";
  u.password = "";
  return u.href;
}

function short(id) { return id ? String(id).slice(0, 8) : ""; }  // a prefix, as one types it
// an agenda operation "<32 hex>:start" as "<8 hex>:start" (the whole id in the cell's title):
// the whole one, with no place to wrap, pushed the side column past a 1400 px window
function shortOp(op) { const [id, ...rest] = String(op).split(":"); return [short(id), ...rest].join(":"); }

function colours(state) {
  const names = state.endpoints.map(e => e.name).sort();
  const out = {};
  names.forEach((n, i) => { out[n] = PALETTE[i % PALETTE.length]; });
  return out;
}

// -- Gantt ------------------------------------------------------------------------------
function drawGantt(state, colour) {
  const box = document.getElementById("gantt");
  const lanes = state.lanes;
  const width = Math.max(box.clientWidth || 1200, 600);
  const label = 170, laneH = 30, top = 22;
  const height = top + lanes.length * laneH + 8;
  const t0 = state.now - state.window_s;
  const planEnd = Math.max(state.now, ...state.planned.map(p => p.end));
  const ahead = Math.min(Math.max(planEnd - state.now, state.window_s * 0.25), state.window_s);
  const t1 = state.now + ahead;
  const x = t => label + (Math.min(Math.max(t, t0), t1) - t0) / (t1 - t0) * (width - label - 8);
  const svg = el("svg:svg", {width, height, id: "gantt-svg", role: "img", "aria-label": "GPU lanes"});
  svg.append(el("svg:defs", {}, el("svg:pattern", {id: "shade", width: 6, height: 6, patternUnits: "userSpaceOnUse",
    patternTransform: "rotate(45)"}, el("svg:rect", {width: 3, height: 6, fill: "rgba(255,255,255,0.55)"}))));
  // time axis: ticks every "nice" step
  const span = t1 - t0, steps = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
  const step = steps.find(s => span / s <= 10) || 3600;
  for (let t = Math.ceil(t0 / step) * step; t <= t1; t += step) {
    svg.append(el("svg:line", {x1: x(t), x2: x(t), y1: top - 4, y2: height, class: "tick"}));
    if (Math.abs(x(t) - x(state.now)) < 44) continue;  // leave room for the "now" label
    svg.append(el("svg:text", {x: x(t), y: 12, class: "tick-label", "text-anchor": "middle",
      text: t <= state.now ? "-" + secs(state.now - t).replace(".0", "") : "+" + secs(t - state.now).replace(".0", "")}));
  }
  const byGpu = {};
  lanes.forEach((l, i) => { byGpu[l.gpu] = i; });
  lanes.forEach((lane, i) => {
    const y = top + i * laneH;
    // a host out of service: cordoned by an operator (no new lease) or down (no GPU worker)
    const out = ["cordoned", "drained", "down"].includes(lane.host_state) ? lane.host_state : "";
    const g = el("svg:g", {class: out ? `lane host-${out === "drained" ? "cordoned" : out}` : "lane",
      "data-gpu": lane.gpu, "data-host": lane.host,
      "data-host-state": lane.host_state || "", "data-set-point": lane.set_point || "",
      "data-resident": lane.resident || ""});
    g.append(el("svg:rect", {x: 0, y, width, height: laneH, class: i % 2 ? "lane-bg odd" : "lane-bg"}));
    // long host or endpoint names are cut to the label column (the whole text in its tooltip)
    const labelText = `${lane.host} · GPU ${lane.index}` + (out ? ` · ${out}` : "") +
      (lane.worker_down && out !== "down" ? " · worker down" : "");
    const subText = (lane.resident ? "now " + lane.resident : "empty") + (lane.set_point ? " · sp " + lane.set_point : "");
    g.append(el("svg:text", {x: 4, y: y + 13, class: "lane-label", text: fit(labelText, LABEL_CHARS)},
      el("svg:title", {text: labelText})));
    g.append(el("svg:text", {x: 4, y: y + 25, class: "lane-sub", text: fit(subText, LABEL_CHARS + 4)},
      el("svg:title", {text: subText})));
    // the set point: the baseline the lane returns to
    if (lane.set_point) {
      g.append(el("svg:rect", {x: label, y: y + laneH - 5, width: width - label - 8, height: 3,
        fill: colour[lane.set_point] || "#999", class: "set-point", "data-endpoint": lane.set_point}));
    } else {
      g.append(el("svg:line", {x1: label, x2: width - 8, y1: y + laneH - 3.5, y2: y + laneH - 3.5, class: "no-set-point"}));
    }
    svg.append(g);
  });
  const bar = (b, planned) => {
    const i = byGpu[b.gpu];
    if (i === undefined) return;
    const y = top + i * laneH + 3, h = laneH - 10;
    const x0 = x(b.start), w = Math.max(x(b.end) - x0, 1.5);
    const fill = colour[b.endpoint] || "#bdbdbd";
    const g = el("svg:g", {class: planned ? "bar planned" : "bar", "data-job": b.job || "", "data-phase": b.phase || "",
      "data-endpoint": b.endpoint || "", "data-priority": b.priority || ""});
    const title = el("svg:title", {text: `${b.job ? "job " + b.job : "set point"} · ${b.endpoint || "?"} · ` +
      `${planned ? "planned (" + (b.load || "warm") + ")" : b.phase} · ${b.priority || ""} · ` +
      `${clock(b.start)}–${clock(b.end)}`});
    g.append(title);
    g.append(el("svg:rect", {x: x0, y, width: w, height: h, fill, "fill-opacity": planned ? 0.35 : 1,
      stroke: PRIORITY_COLOURS[b.priority] || "#333", "stroke-width": planned ? 1.5 : 1,
      "stroke-dasharray": planned ? "4 2" : null}));
    if (!planned && TRANSITIONS.has(b.phase)) {
      g.append(el("svg:rect", {x: x0, y, width: w, height: h, fill: "url(#shade)", class: "shade"}));
    }
    if (b.priority) {  // priority mark: a triangle at the bar's start in the priority's colour
      g.append(el("svg:path", {d: `M${x0},${y} l7,0 l-7,7 z`, fill: PRIORITY_COLOURS[b.priority] || "#333",
        class: "prio-mark"}));
    }
    if (w > 46 && (b.phase === "execute" || planned)) {
      g.append(el("svg:text", {x: x0 + 9, y: y + h / 2 + 4, class: "bar-label",
        text: `${short(b.job)}${b.priority ? "·" + b.priority[0] : ""}`}));
    }
    svg.append(g);
  };
  state.bars.forEach(b => bar(b, false));
  state.planned.forEach(b => bar(b, true));
  svg.append(el("svg:line", {x1: x(state.now), x2: x(state.now), y1: top - 6, y2: height, class: "now"}));
  svg.append(el("svg:text", {x: x(state.now), y: 12, class: "now-label", "text-anchor": "middle", text: "now"}));
  box.replaceChildren(svg);
  const legend = document.getElementById("legend");
  legend.replaceChildren(...Object.entries(colour).map(([n, c]) =>
      el("span", {class: "chip", "data-endpoint": n}, el("i", {style: `background:${c}`}), n)),
    ...Object.entries(PRIORITY_COLOURS).map(([p, c]) =>
      el("span", {class: "chip"}, el("i", {class: "tri", style: `border-top-color:${c}`}), p)),
    el("span", {class: "chip"}, el("i", {class: "shaded"}), "transition"),
    el("span", {class: "chip"}, el("i", {class: "dashed"}), "planned"));
}

// -- tables -------------------------------------------------------------------------------
const LABEL_CHARS = 26;  // characters of a lane label that fit its 170 px column (11 px text)
function fit(text, chars) {
  return text.length <= chars ? text : text.slice(0, chars - 1) + "…";
}

function drawQueue(state) {
  const text = document.getElementById("queue-filter").value.trim().toLowerCase();
  const prio = document.getElementById("queue-priority").value;
  const rows = state.queue.filter(q => (!prio || q.priority === prio) && (!text ||
    [q.job, q.endpoint, q.reason, q.state, q.priority].join(" ").toLowerCase().includes(text)));
  const waiting = state.counts.queued + state.counts.delayed;
  // the snapshot lists the first list_limit jobs of each priority queue (and of the delayed set)
  document.getElementById("queue-count").textContent =
    `${rows.length} shown of ${waiting} waiting` + (state.queue.length < waiting ?
      ` (the first ${state.counts.list_limit} of each priority are listed; makespan jobs lists all)` : "");
  document.querySelector("#queue tbody").replaceChildren(...rows.map(q => el("tr",
    {class: "queued-job", "data-job": q.job, "data-priority": q.priority, "data-endpoint": q.endpoint},
    el("td", {}, el("span", {class: "prio", style: `background:${PRIORITY_COLOURS[q.priority] || "#666"}`,
      text: q.priority})),
    el("td", {}, el("a", {href: "job/" + encodeURIComponent(q.job), title: q.job, text: short(q.job)})),
    el("td", {text: q.endpoint}), el("td", {text: q.state}), el("td", {class: "num", text: secs(q.wait_s)}),
    el("td", {class: "num", text: q.attempts}),
    el("td", {class: "num eta", text: etaText(q.eta, state.now)}),
    el("td", {class: "reason", text: q.reason}))));
}

function drawEndpoints(state, colour) {
  const agendaByEp = {};
  state.agenda.forEach(a => a.endpoints.forEach(e => { (agendaByEp[e] = agendaByEp[e] || []).push(a); }));
  document.querySelector("#endpoints tbody").replaceChildren(...state.endpoints.map(ep => el("tr",
    {class: "endpoint", "data-endpoint": ep.name},
    el("td", {}, el("i", {class: "swatch", style: `background:${colour[ep.name]}`}), ep.name),
    el("td", {text: ep.set_point.join(" ") || "—"}),
    el("td", {}, ...ep.instances.map(inst => el("span", {class: "inst " + inst.state, "data-state": inst.state,
      text: `${inst.state}${inst.gpus.length ? " " + inst.gpus.map(g => g.replace(/^GPU-/, "")).join(",") : ""}`})),
      ...(agendaByEp[ep.name] || []).map(a => el("span", {class: "inst transition",
        text: `${a.mode.toLowerCase()} ${a.op_id.slice(0, 18)}`})),
      ep.instances.length || agendaByEp[ep.name] ? null : el("span", {class: "none", text: "not loaded"})))));
  document.querySelector("#agenda tbody").replaceChildren(...(state.agenda.length ? state.agenda.map(a => el("tr",
    {class: "agenda-entry" + (a.overdue ? " overdue" : ""), "data-op": a.op_id},
    el("td", {text: shortOp(a.op_id), title: a.op_id}), el("td", {text: a.mode}),
    el("td", {text: a.endpoints.join(", ")}),
    el("td", {text: a.gpus.map(g => g.replace(/^GPU-/, "")).join(",")}),
    el("td", {text: clock(a.expected_end) + (a.overdue ? " (overdue)" : "")}))) :
    [el("tr", {}, el("td", {colspan: 5, class: "none", text: "none"}))]));
  document.getElementById("incidents").replaceChildren(...(state.incidents.length ? state.incidents.map(i => el("li",
    {class: "incident", "data-incident": i.incident_id, "data-endpoint": i.endpoint},
    el("b", {text: `${i.endpoint || "host " + (i.host || "?")} · ${i.failure_mode}`}),
    ` at ${clock(i.detected_at)} on ${i.host || "?"} `,
    el("span", {class: "effect", text: i.effect || ""}),
    // as `makespan incidents` says it: recovered (green), not restarted or failed (red), pending
    // (a recovery's outcome is "recovered" or "recovered: <how>"; a time only for a recovery)
    i.recovery ? el("span", {class: "recovery " + (recovered(i) ? "ok" : closed(i) ? "closed" : "bad"),
      text: ` → ${i.recovery.outcome}` + (recovered(i) && i.recovery.recovery_s !== null ?
        ` in ${secs(i.recovery.recovery_s)}` : "")})
      : el("span", {class: "recovery pending", text: " → recovery pending"}))) :
    [el("li", {class: "none", text: "no incident"})]));
  const d = state.drain;
  document.getElementById("drain").replaceChildren(d ? el("div", {class: "drain" + (["leases", "agenda_entries",
    "busy_slots", "awaited_entries", "set_points_failed"].some(k => d[k]) ? " bad" : " ok"), "data-checks": d.checks},
    `${d.checks} checks · last ${clock(d.checked_at)}: leases ${d.leases ?? 0}, agenda ${d.agenda_entries ?? 0}, ` +
    `busy slots ${d.busy_slots ?? 0}, awaited ${d.awaited_entries ?? 0}` +
    (d.set_points_failed ? `, set points failing ${d.set_points_failed}` : "")) :
    el("div", {class: "none", text: "no drain check yet"}));
  const pools = state.pools || [];  // [] without [[pools]] in the fleet file
  document.getElementById("pools-section").hidden = !pools.length;
  document.querySelector("#pools tbody").replaceChildren(...pools.map(p => el("tr",
    {class: "pool" + (p.leads ? "" : " bad"), "data-pool": p.name, "data-leads": p.leads ? "1" : "0"},
    el("td", {text: p.name}), el("td", {text: p.leads ? "leads" : "none: its jobs wait (no_planner)"}),
    el("td", {class: "num", text: p.queued}),
    el("td", {text: p.drain ? `${clock(p.drain.checked_at)} · leases ${p.drain.leases ?? 0}` : "none yet"}))));
}

function recovered(incident) {
  const outcome = (incident.recovery && incident.recovery.outcome) || "";
  return outcome === "recovered" || outcome.startsWith("recovered:");
}

function closed(incident) {  // ended without a recovery ("closed: the host was cordoned ..."): not open
  return ((incident.recovery && incident.recovery.outcome) || "").startsWith("closed");
}

function plural(count, noun) {
  return `${count} ${noun}${count === 1 ? "" : "s"}`;
}

function render(state, source) {
  const colour = colours(state);
  document.getElementById("fleet-name").textContent = state.fleet.name ? "· " + state.fleet.name : "";
  document.getElementById("window-min").textContent = (state.window_s / 60).toFixed(0);
  const c = state.counts;
  document.getElementById("counts").textContent =
    `${state.lanes.length} GPUs · ${c.running} running · ${c.queued} queued · ${c.delayed} delayed · ` +
    plural(state.incidents.filter(i => !recovered(i) && !closed(i)).length, "open incident") + (state.plan ? ` · plan ${state.plan.policy} at ${clock(state.plan.at)}` : "");
  drawGantt(state, colour);
  drawQueue(state);
  drawEndpoints(state, colour);
  const body = document.body;
  body.dataset.updates = String(Number(body.dataset.updates) + 1);
  body.dataset.source = source;
  body.dataset.snapshotAt = String(state.now);
  document.getElementById("status").textContent = `${source === "sse" ? "live" : "loaded"} · ${clock(state.now)}`;
  document.getElementById("live-dot").className = "dot " + (source === "sse" ? "live" : "");
  window.lastState = state;
}

function dashboard() {
  // the first picture at once; a live update that came first is newer: keep it
  fetch(api("api/state"), {cache: "no-store"}).then(r => r.json()).then(s => {
    if (!s.error && document.body.dataset.source !== "sse") render(s, "fetch");
  }).catch(err => { document.getElementById("status").textContent = "cannot load the state: " + err; });
  // ?updates=N: stop after N live updates (a still page for a screenshot or a headless
  // browser, which waits for open connections to end); default: live until closed
  const maxUpdates = Number(new URLSearchParams(location.search).get("updates") || 0);
  let live = 0;
  const stream = new EventSource(api("api/stream"));
  // a `failure` update (Redis unavailable) counts too: a headless browser's ?updates=N page
  // waited for ever on a Redis that did not answer
  const counted = () => {
    live += 1;
    if (maxUpdates && live >= maxUpdates) {
      stream.close();
      document.getElementById("status").textContent += ` · stopped after ${live} live updates`;
      document.body.dataset.live = "stopped";
    }
  };
  stream.addEventListener("state", e => {
    render(JSON.parse(e.data), "sse");
    counted();
  });
  stream.addEventListener("failure", e => {
    document.getElementById("status").textContent = "Redis unavailable: " + JSON.parse(e.data).error;
    counted();
  });
  stream.onerror = () => {
    document.getElementById("status").textContent = "reconnecting…";
    document.getElementById("live-dot").className = "dot";
  };
  for (const id of ["queue-filter", "queue-priority"]) {
    document.getElementById(id).addEventListener("input", () => window.lastState && drawQueue(window.lastState));
  }
  window.addEventListener("resize", () => window.lastState && render(window.lastState, document.body.dataset.source));
}

// -- job page -------------------------------------------------------------------------------
function jobPage() {
  const id = decodeURIComponent(location.pathname.replace(/\/+$/, "").split("/").pop());
  document.getElementById("job-id").textContent = id;
  fetch(api("../api/job/" + encodeURIComponent(id)), {cache: "no-store"}).then(r => r.json()).then(doc => {
    if (doc.error) { document.getElementById("status").textContent = doc.error; return; }
    const rec = {...doc.record};
    // its function's last ctx.progress report, as `makespan jobs --state leased` shows it
    if (rec.progress_total !== undefined && rec.progress_total !== null && rec.progress_total !== "") {
      rec.progress = `${Number(rec.progress_done || 0)}/${Number(rec.progress_total)}` +
        (rec.progress_note ? ` (${rec.progress_note})` : "");
    }
    // a waiting job's reason, detail and ETA (makespan why's answer) come first
    const fields = ["state", "wait_reason", "wait_detail", "wait_eta", "wait_at", "progress", "endpoint", "fn",
                    "priority", "service_s", "attempts", "preemptions", "submitted_at", "leased_at", "started_at",
                    "finished_at", "lease", "workload_id", "step", "deps", "reason"];
    const times = new Set(["submitted_at", "leased_at", "started_at", "finished_at", "wait_at"]);
    const shown = f => f === "wait_eta" ? `${clock(Number(rec[f]))} (${etaText(rec[f], doc.now)})`
      : times.has(f) ? `${clock(Number(rec[f]))} (${rec[f]})` : Array.isArray(rec[f]) ? rec[f].join(", ") : rec[f];
    document.querySelector("#record tbody").replaceChildren(...fields.filter(f => rec[f] !== undefined && rec[f] !== null && rec[f] !== ""
      && !(Array.isArray(rec[f]) && !rec[f].length))
      .map(f => el("tr", {"data-field": f}, el("th", {text: f}), el("td", {text: shown(f)}))));
    document.querySelector("#phases tbody").replaceChildren(...doc.phases.map(p => el("tr", {class: "phase",
      "data-phase": p.phase}, el("td", {text: p.phase}), el("td", {text: p.gpus.join(", ")}),
      el("td", {text: clock(p.start)}), el("td", {text: clock(p.end)}), el("td", {text: (p.end - p.start).toFixed(3)}),
      el("td", {text: p.complete ? "yes" : p.running ? "running" : "no"}))));
    // P:result:{job} (makespan.results): {"ok": true, "value": ...} or {"ok": false, "error": {...}}
    const res = doc.result;
    if (res !== null && res !== undefined && !(typeof res === "object" && res.ok === false)) {
      document.getElementById("result-section").hidden = false;
      document.getElementById("result").textContent =
        JSON.stringify(typeof res === "object" && "value" in res ? res.value : res, null, 2);
    }
    const err = res && typeof res === "object" && res.ok === false ? res.error : null;
    if (err || rec.state === "failed" || rec.state === "cancelled") {
      document.getElementById("error-section").hidden = false;
      document.getElementById("error").textContent = `${rec.state}: ${rec.reason || "(no reason recorded)"}` +
        (err ? `\n${err.type || "error"}: ${err.message || ""}\n${err.traceback || ""}` : "");
    }
    document.querySelector("#events tbody").replaceChildren(...doc.events.map(e => {
      const {ts, kind, job, ...rest} = e;
      return el("tr", {}, el("td", {text: clock(ts)}), el("td", {text: kind}),
        el("td", {class: "details", text: JSON.stringify(rest)}));
    }));
    document.getElementById("status").textContent = `${rec.state} · ${doc.phases.length} phases`;
    document.body.dataset.loaded = "1";
  }).catch(err => { document.getElementById("status").textContent = "cannot load the job: " + err; });
}

if (document.getElementById("gantt")) dashboard();
else if (document.getElementById("phases")) jobPage();
