// GEMM-path panel for ComfyUI (frontend 1.49.x): a sidebar tab that shows which GEMM path every
// Ideogram 4 W8A8 linear really ran, and a badge on our loader / sampler nodes.
// Data: GET /ideogram4_int8/status (nodes/status_report.py) and the websocket event
// "ideogram4_int8.status" pushed after each load and sampler run (nodes/status_nodes.py).
// Pure logic (summaries, warning rules, formatting) lives in ./lib/gemm_status.mjs and is tested
// with Node's test runner; this file only builds DOM and talks to ComfyUI.
import { api } from "../../scripts/api.js";
import { app } from "../../scripts/app.js";
import {
  EVENT,
  LAYER_FILTERS,
  PATHS,
  PATH_INFO,
  ROUTE,
  SEVERITY_COLORS,
  TIMING_ROUTE,
  applyEvent,
  autotuneRows,
  badgeFor,
  callsText,
  checkReport,
  describeEnvironment,
  knownRuns,
  layerRows,
  nodeBadge,
  modelNotes,
  pathLabel,
  reasonGroups,
  sortModels,
  statusBanner,
  summarizeModel,
  timingRows,
  wantsBadge,
} from "./lib/gemm_status.mjs";

const TAB_ID = "ideogram4-int8-gemm-paths";
const SETTING_TIMING = "Ideogram4Int8.GemmTiming";
const CSS_ID = "ig4i8-gemm-panel-css";

const state = {
  // from websocket pushes (no layer table); currentPrompt: the prompt seen starting last (badges of nodes and
  // models that did not run in it read "earlier run")
  live: { report: null, nodeModels: {}, lastEvent: null, currentPrompt: null },
  // runs from before the graph on the canvas was loaded: its nodes get no badge from them (nodeBadge)
  hiddenRuns: new Set(),
  graphLoads: 0, // graphs configured since setup: the first is the workflow the page restores
  full: null, // last full report from the route (with layers)
  error: null,
  loading: false,
  fetchSeq: 0, // only the answer of the latest fetch is shown (an older one may arrive after it)
  fetchedAt: null,
  el: null, // the sidebar container while the tab is open
  open: new Set(), // <details> that the user opened, by key
  filters: {}, // per-model layer filter
};

// -- DOM helpers ---------------------------------------------------------------------------------

function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props ?? {})) {
    if (v == null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function details(key, summary, body) {
  const d = h("details", { class: "ig4i8-details", "data-key": key }, h("summary", {}, summary), body);
  d.open = state.open.has(key);
  d.addEventListener("toggle", () => (d.open ? state.open.add(key) : state.open.delete(key)));
  return d;
}

function injectCss() {
  if (document.getElementById(CSS_ID)) return;
  const sev = (name) => SEVERITY_COLORS[name].bg;
  const css = `
.ig4i8-panel{padding:10px 12px;font-size:13px;line-height:1.4;color:var(--fg-color,#ddd);box-sizing:border-box}
.ig4i8-head{display:flex;align-items:center;justify-content:space-between;gap:8px;margin-bottom:4px}
.ig4i8-head h3{margin:0;font-size:15px}
.ig4i8-btn{background:var(--comfy-input-bg,#333);color:var(--input-text,#ddd);border:1px solid var(--border-color,#555);border-radius:4px;padding:2px 10px;cursor:pointer}
.ig4i8-env{color:var(--descrip-text,#999);font-size:12px;margin-bottom:8px}
.ig4i8-banner,.ig4i8-model{border:1px solid var(--border-color,#555);border-left-width:4px;border-radius:4px;padding:6px 8px;margin:8px 0}
.ig4i8-banner ul{margin:4px 0 0 16px;padding:0;color:var(--descrip-text,#999);font-size:12px}
.ig4i8-sev-ok{border-left-color:${sev("ok")}}
.ig4i8-sev-idle{border-left-color:${sev("idle")}}
.ig4i8-sev-notice{border-left-color:${sev("notice")}}
.ig4i8-sev-warning,.ig4i8-sev-error{border-left-color:${sev("warning")};background:rgba(179,38,30,.14)}
.ig4i8-headline{font-weight:600}
.ig4i8-sev-warning .ig4i8-headline,.ig4i8-sev-error .ig4i8-headline{color:#ff8a80}
.ig4i8-warning{margin-top:4px;font-size:12px}
.ig4i8-bar{display:flex;height:8px;border-radius:3px;overflow:hidden;margin:6px 0 2px;background:var(--comfy-input-bg,#333)}
.ig4i8-legend{display:flex;flex-wrap:wrap;gap:4px 10px;font-size:11px;color:var(--descrip-text,#999)}
.ig4i8-dot{display:inline-block;width:8px;height:8px;border-radius:2px;margin-right:4px;vertical-align:middle}
.ig4i8-p-triton-int8{background:#2e9d5b}.ig4i8-p-triton-fp8{background:#1f8a9e}.ig4i8-p-cublas-int8{background:#c98a00}.ig4i8-p-dequant-bf16{background:#d8433a}.ig4i8-p-bf16{background:#6d7f99}
.ig4i8-details{margin-top:6px}
.ig4i8-details summary{cursor:pointer;color:var(--descrip-text,#aaa);font-size:12px}
.ig4i8-table{border-collapse:collapse;width:100%;font-size:11px;margin-top:4px}
.ig4i8-table th,.ig4i8-table td{text-align:left;padding:2px 4px;border-bottom:1px solid var(--border-color,#444);vertical-align:top}
.ig4i8-table td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.ig4i8-table tr.ig4i8-row-warning td{background:rgba(179,38,30,.18)}
.ig4i8-table tr.ig4i8-row-notice td{background:rgba(201,138,0,.12)}
.ig4i8-mono{font-family:ui-monospace,Menlo,Consolas,monospace}
.ig4i8-muted{color:var(--descrip-text,#999);font-size:12px}
.ig4i8-foot{color:var(--descrip-text,#888);font-size:11px;margin-top:10px}
.ig4i8-filter{margin:4px 0;font-size:11px}
.ig4i8-scroll{overflow-x:auto}
.ig4i8-fixed{table-layout:fixed}
.ig4i8-reason{color:var(--descrip-text,#999);font-size:10.5px;white-space:normal;margin-top:1px}
.ig4i8-path{overflow-wrap:anywhere}
.ig4i8-facts{color:var(--descrip-text,#999);font-size:10.5px;font-variant-numeric:tabular-nums}
.ig4i8-table .ig4i8-mono{overflow-wrap:anywhere}
`;
  document.head.append(h("style", { id: CSS_ID }, css));
}

// -- data ----------------------------------------------------------------------------------------

async function readJson(resp) {
  try {
    return await resp.json();
  } catch {
    return null;
  }
}

async function fetchReport() {
  const seq = ++state.fetchSeq;
  state.loading = true;
  render();
  try {
    const resp = await api.fetchApi(ROUTE, { cache: "no-store" });
    const body = await readJson(resp);
    // a load and a run push in quick succession start two fetches: the older answer must not win
    if (seq !== state.fetchSeq) return;
    if (!resp.ok) {
      state.error = `The status route answered HTTP ${resp.status}${body?.error ? `: ${body.error}` : ""}.`;
    } else {
      const problem = checkReport(body);
      state.error = problem ? `Cannot show the GEMM status: ${problem}.` : null;
      if (!problem) {
        state.full = body;
        state.live = { ...state.live, report: body };
      }
    }
  } catch (err) {
    if (seq === state.fetchSeq) {
      state.error = `Could not reach ${ROUTE} (${err?.message ?? err}). Is the pack loaded in this ComfyUI?`;
    }
  } finally {
    if (seq === state.fetchSeq) {
      state.loading = false;
      state.fetchedAt = new Date();
      render();
      redrawCanvas();
    }
  }
}

function onStatusEvent(ev) {
  const before = state.live;
  state.live = applyEvent(state.live, ev.detail);
  if (state.live === before) return; // not a report this panel reads
  // The push is newer than the last full report: show it now (without the per-layer table), so the panel never
  // shows the previous run's paths; while the panel is open, fetch the full report with the table.
  state.full = null;
  redrawCanvas();
  render();
  if (state.el) fetchReport();
}

// -- panel rendering -----------------------------------------------------------------------------

function countsBar(summary) {
  const bar = h("div", { class: "ig4i8-bar", title: summary.headline });
  for (const p of PATHS) {
    const n = summary.counts[p];
    if (!n) continue;
    bar.append(h("div", { class: `ig4i8-p-${p}`, style: `width:${(100 * n) / summary.total}%`, title: `${n} ${pathLabel(p)}` }));
  }
  const legend = h(
    "div",
    { class: "ig4i8-legend" },
    PATHS.filter((p) => summary.counts[p]).map((p) =>
      h("span", { title: PATH_INFO[p].help }, h("span", { class: `ig4i8-dot ig4i8-p-${p}` }), `${pathLabel(p)}: ${summary.counts[p]}`),
    ),
  );
  return [bar, legend];
}

// "layers.0.attention.qkv" may wrap after a dot, never inside a name.
function breakAtDots(name) {
  const parts = String(name).split(".");
  return parts.flatMap((p, i) => (i < parts.length - 1 ? [p + ".", h("wbr")] : [p]));
}

function layerTable(model) {
  const key = String(model.label);
  const filter = state.filters[key] ?? "all";
  const rows = layerRows(model, filter);
  if (rows === null) return h("div", { class: "ig4i8-muted" }, "Per-layer table not loaded yet (Refresh).");
  const select = h(
    "select",
    {
      class: "ig4i8-filter",
      onchange: (e) => {
        state.filters[key] = e.target.value;
        render();
      },
    },
    Object.keys(LAYER_FILTERS).map((f) =>
      h("option", { value: f, selected: f === filter }, f === "all" ? "all layers" : f === "not-fused" ? "not on the fused kernel" : "dequant-bf16 only"),
    ),
  );
  // Narrow sidebar: two columns. Under each layer name: shape, rows of the last call, calls, and
  // why a faster path was not taken (a repeat of the row above is shown as "same as above").
  const table = h(
    "table",
    { class: "ig4i8-table ig4i8-fixed" },
    h("colgroup", {}, h("col", {}), h("col", { style: "width:84px" })),
    h("thead", {}, h("tr", {}, h("th", {}, "layer · N×K · M · calls / why not faster"), h("th", {}, "path"))),
    h(
      "tbody",
      {},
      rows.map((r) =>
        h(
          "tr",
          { class: `ig4i8-row-${r.severity}`, title: r.config ? `Triton config: ${r.config}` : null },
          h(
            "td",
            {},
            h("div", { class: "ig4i8-mono" }, breakAtDots(r.layer)),
            h("div", { class: "ig4i8-facts" }, `${r.shape} · M ${r.m} · ${r.callsText}`),
            r.reason && r.reason !== "—"
              ? h("div", { class: "ig4i8-reason", title: r.reason }, r.sameReasonAsAbove ? "↑ same as above" : r.reason)
              : null,
            r.fusion ? h("div", { class: "ig4i8-reason", title: r.fusion }, `⇄ ${r.fusion}`) : null,
          ),
          h("td", { class: "ig4i8-path" }, r.pathLabel),
        ),
      ),
    ),
  );
  return h("div", {}, select, h("span", { class: "ig4i8-muted" }, ` ${rows.length} shown`), h("div", { class: "ig4i8-scroll" }, table));
}

function modelCard(model) {
  const s = summarizeModel(model);
  const key = String(model.label);
  const card = h(
    "section",
    { class: `ig4i8-model ig4i8-sev-${s.severity}`, "data-model": key, "data-severity": s.severity },
    h("div", { class: "ig4i8-headline" }, s.severity === "warning" ? "⚠ " : "", s.headline),
    countsBar(s),
    s.warning ? h("div", { class: "ig4i8-warning" }, s.warning) : null,
    ...modelNotes(model).map((n) => h("div", { class: "ig4i8-muted", "data-testid": `ig4i8-note-${n.kind}` }, n.text)),
    ...s.idle.map((i) => h("div", { class: "ig4i8-muted", "data-testid": "ig4i8-idle" }, `${i.layer}: ${i.why}`)),
    model.calls > 0
      ? h("div", { class: "ig4i8-muted", "data-testid": "ig4i8-calls" }, `GEMM calls: ${callsText(model.calls_last_run, model.calls)}`)
      : null,
  );
  const groups = reasonGroups(model).filter((g) => g.reason);
  if (groups.length) {
    card.append(
      details(
        `${key}/why`,
        `Why not faster (${groups.length})`,
        h("ul", { class: "ig4i8-muted" }, groups.map((g) => h("li", {}, `${g.count} × ${pathLabel(g.path)}: ${g.reason}`))),
      ),
    );
  }
  card.append(details(`${key}/layers`, `Per-layer table (${model.layers_total} linears)`, layerTable(model)));
  const picks = autotuneRows(model);
  if (picks.length) {
    card.append(
      details(
        `${key}/autotune`,
        `Autotune picks (${picks.length})`,
        h(
          "table",
          { class: "ig4i8-table" },
          h("thead", {}, h("tr", {}, ["N×K", "M bucket", "config", "source"].map((t) => h("th", {}, t)))),
          h(
            "tbody",
            {},
            picks.map((p) =>
              h("tr", {}, h("td", { class: "num" }, p.shape), h("td", { class: "num" }, p.mBucket), h("td", { class: "ig4i8-mono" }, p.config), h("td", {}, p.source)),
            ),
          ),
        ),
      ),
    );
  }
  return card;
}

function timingSection(report) {
  const t = timingRows(report.timing);
  const box = h("section", { class: "ig4i8-model ig4i8-sev-idle", "data-section": "timing" }, h("div", { class: "ig4i8-headline" }, "GEMM time, last timed run"));
  if (t.message) box.append(h("div", { class: "ig4i8-muted" }, t.message));
  if (t.rows.length) {
    box.append(
      h(
        "table",
        { class: "ig4i8-table" },
        h("thead", {}, h("tr", {}, ["path", "GEMM time", `share of ${t.wall}`].map((x) => h("th", {}, x)))),
        h("tbody", {}, t.rows.map((r) => h("tr", {}, h("td", {}, r.label), h("td", { class: "num" }, r.ms), h("td", { class: "num" }, r.share)))),
      ),
    );
  }
  return box;
}

function render() {
  const el = state.el;
  if (!el) return;
  injectCss();
  const report = state.full ?? state.live.report;
  const banner = statusBanner(report, state.error ?? (report ? null : state.loading ? null : "No status yet."));
  const root = h(
    "div",
    { class: "ig4i8-panel", "data-testid": "ig4i8-gemm-panel" },
    h(
      "div",
      { class: "ig4i8-head" },
      h("h3", {}, "Ideogram 4 INT8 · GEMM paths"),
      h("button", { class: "ig4i8-btn", onclick: () => fetchReport(), disabled: state.loading }, state.loading ? "Loading…" : "Refresh"),
    ),
    report ? h("div", { class: "ig4i8-env" }, describeEnvironment(report.environment)) : null,
  );
  if (!report && state.loading && !state.error) {
    root.append(h("div", { class: "ig4i8-muted" }, "Loading the GEMM status…"));
  } else {
    root.append(
      h(
        "div",
        { class: `ig4i8-banner ig4i8-sev-${banner.severity}`, "data-testid": "ig4i8-banner", "data-severity": banner.severity },
        banner.text,
        banner.notes.length ? h("ul", {}, banner.notes.map((n) => h("li", {}, n))) : null,
      ),
    );
  }
  if (report && !checkReport(report)) {
    for (const m of sortModels(report.models)) root.append(modelCard(m));
    const badge = badgeFor(report);
    if (badge) {
      // the badges on the loader / sampler nodes count exactly what the headlines above count
      root.append(h("div", { class: "ig4i8-muted", "data-testid": "ig4i8-badge-note" },
        `Node badges read like "${badge.text}": linears on that path out of each model's linears, as in the ` +
        "headlines above."));
    }
    if (report.models.length) root.append(timingSection(report));
    const when = state.fetchedAt ? state.fetchedAt.toLocaleTimeString() : "—";
    const last = state.live.lastEvent ? ` · last event: ${state.live.lastEvent}` : "";
    root.append(h("div", { class: "ig4i8-foot" }, `Updated ${when}${last} · pack ${report.pack_version} · schema ${report.schema_version}`));
  }
  el.replaceChildren(root); // the frontend's sidebar container scrolls and keeps its position
}

// -- node badges ---------------------------------------------------------------------------------

// Nodes 2.0 (Vue nodes) draws a node's badges in a Vue computed that calls the badge getter and recomputes only
// when something reactive it read changes: the getter reads this key of the frontend's workspace store (a reactive
// Pinia store), and every new report or graph load bumps it. The classic canvas calls the getter on every frame.
const BADGE_REVISION = "__ig4i8BadgeRevision";

function badgeRevision() {
  return app.extensionManager?.[BADGE_REVISION];
}

function redrawCanvas() {
  try {
    const store = app.extensionManager;
    if (store) store[BADGE_REVISION] = (store[BADGE_REVISION] ?? 0) + 1;
  } catch {
    /* a frontend without the store: the classic canvas still redraws */
  }
  try {
    app.graph?.setDirtyCanvas?.(true, true);
  } catch {
    /* the canvas may not exist yet */
  }
}

const EMPTY = Symbol("ig4i8-empty-badge");

function badgeGetter(node) {
  let cacheKey = null;
  let cached = null;
  return () => {
    badgeRevision(); // read for Nodes 2.0's reactivity (see BADGE_REVISION)
    const Badge = window.LGraphBadge;
    const widgets = Object.fromEntries((node.widgets ?? []).map((w) => [w.name, w.value]));
    const type = node.comfyClass ?? node.type;
    const info = nodeBadge(state.live.report, { id: node.id, type, widgets }, state.live.currentPrompt, state.hiddenRuns);
    const key = info ? `${info.severity}|${info.text}` : EMPTY;
    if (key !== cacheKey) {
      cacheKey = key;
      cached = info
        ? new Badge({ text: info.text, fgColor: info.colors.fg, bgColor: info.colors.bg })
        : new Badge({ text: "" });
    }
    return cached;
  };
}

function attachBadge(node) {
  const type = node?.comfyClass ?? node?.type;
  // window.LGraphBadge is the frontend's badge class (1.49.x exposes it globally); without it, no badge.
  if (!wantsBadge(type) || node.__ig4i8Badge || typeof window.LGraphBadge !== "function") return;
  node.__ig4i8Badge = true;
  if (!Array.isArray(node.badges)) node.badges = [];
  node.badges.push(badgeGetter(node));
}

// -- registration --------------------------------------------------------------------------------

async function postTiming(enabled) {
  try {
    const resp = await api.fetchApi(TIMING_ROUTE, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ enabled: !!enabled }),
    });
    if (!resp.ok) console.warn("[ideogram4-int8] timing switch refused:", resp.status, await readJson(resp));
    else if (state.el) fetchReport();
  } catch (err) {
    console.warn("[ideogram4-int8] could not switch GEMM timing:", err);
  }
}

app.registerExtension({
  name: "comfyui_ideogram4_int8.GemmPathPanel",
  settings: [
    {
      id: SETTING_TIMING,
      category: ["Ideogram 4 INT8", "GEMM panel", "Timing"],
      name: "Time every GEMM per path (CUDA events, small overhead)",
      tooltip:
        "The panel then shows the GEMM milliseconds of the last sampler run per path and their share of the run. " +
        "Server-wide; IDEOGRAM4_INT8_GEMM_TIMING=1 switches it on at start.",
      type: "boolean",
      defaultValue: false,
      onChange: (value, oldValue) => {
        // At page load the frontend calls this with oldValue undefined: only push an explicit "on",
        // so an untouched default never switches off what the server's environment turned on.
        if (oldValue === undefined && !value) return;
        postTiming(value);
      },
    },
  ],
  async setup() {
    const tab = {
      id: TAB_ID,
      icon: "pi pi-microchip",
      title: "GEMM paths",
      tooltip: "Ideogram 4 INT8: which GEMM path each linear ran",
      type: "custom",
      render: (el) => {
        if (state.el === el && el.firstChild) return; // Vue calls function refs again on re-render
        state.el = el;
        render();
        fetchReport();
      },
      destroy: () => {
        state.el = null;
      },
    };
    const tabs = app.extensionManager?.sidebarTab;
    if (tabs?.registerSidebarTab) tabs.registerSidebarTab(tab);
    else app.extensionManager?.registerSidebarTab?.(tab);

    api.addEventListener(EVENT, onStatusEvent);
    api.addEventListener("execution_start", (ev) => {
      const id = ev?.detail?.prompt_id;
      if (id == null) return;
      state.live = { ...state.live, currentPrompt: String(id) };
      // the graph on the canvas runs now: each of our nodes either runs (a new event) or is cached, and then its
      // event from the run that computed the same thing stands (shown as an earlier run)
      state.hiddenRuns = new Set();
      redrawCanvas();
    });
    // Badges need a report even when the panel was never opened.
    try {
      const resp = await api.fetchApi(`${ROUTE}?layers=0`, { cache: "no-store" });
      const body = resp.ok ? await readJson(resp) : null;
      if (body && !checkReport(body) && !state.live.report) {
        state.live = { ...state.live, report: body };
        redrawCanvas();
      }
    } catch {
      /* the panel shows the error when opened */
    }
  },
  afterConfigureGraph() {
    // a workflow loaded after the page's own restore (a template, a file, another tab): its nodes ran in none of
    // the runs so far, so the report's badges for their ids belong to another graph
    if (state.graphLoads++ === 0) return;
    state.hiddenRuns = knownRuns(state.live.report, state.live.currentPrompt);
    redrawCanvas();
  },
  nodeCreated(node) {
    attachBadge(node);
  },
  loadedGraphNode(node) {
    attachBadge(node);
  },
});
