// The chat page. Every conversation is a server session: its turns go to
// /v1/chat/completions with "session": id, and its title, messages and
// settings are kept by the server (PUT /v1/sessions/{id}), so the page
// finds them again after a reload, a server restart or in another browser.

import { ApiError, api, events, getJson, onKeyNeeded, sendJson, setKey } from "./api.js";
import { render } from "./markdown.js";

const $ = (id) => document.getElementById(id);

const ui = {
  sidebar: $("sidebar"),
  sessions: $("sessions"),
  newSession: $("new-session"),
  openSidebar: $("open-sidebar"),
  closeSidebar: $("close-sidebar"),
  importInput: $("import"),
  title: $("session-title"),
  info: $("info"),
  save: $("save"),
  exportButton: $("export"),
  exports: $("exports"),
  toggleSettings: $("toggle-settings"),
  settings: $("settings"),
  system: $("system"),
  temperature: $("temperature"),
  topP: $("top_p"),
  maxTokens: $("max_tokens"),
  seed: $("seed"),
  jsonMode: $("json_mode"),
  jsonSchema: $("json_schema"),
  schemaLabel: $("schema-label"),
  error: $("error"),
  errorText: $("error-text"),
  errorClose: $("error-close"),
  log: $("log"),
  composer: $("composer"),
  message: $("message"),
  send: $("send"),
  stop: $("stop"),
  keyDialog: $("key-dialog"),
  keyForm: $("key-form"),
  key: $("key"),
  keyError: $("key-error"),
};

const DEFAULT_TITLE = "New chat";

const state = {
  info: null,
  list: [],
  // The open session: {id, title, messages, settings, tokens, onServer}.
  current: null,
  // The reply in flight: {controller, message}.
  streaming: null,
  stats: null,
};

// ------------------------------------------------------------------ errors

function showError(message) {
  ui.errorText.textContent = message;
  ui.error.hidden = false;
}

function clearError() {
  ui.error.hidden = true;
  ui.errorText.textContent = "";
}

function reportError(e) {
  if (e && e.name === "AbortError") return;
  showError(e instanceof ApiError || e instanceof Error ? e.message : String(e));
}

// ------------------------------------------------------------------ API key

onKeyNeeded(
  (message) =>
    new Promise((resolve) => {
      ui.keyError.textContent = message;
      ui.keyError.hidden = !message;
      ui.key.value = "";
      const done = (ok) => {
        ui.keyForm.removeEventListener("submit", submit);
        ui.keyDialog.removeEventListener("cancel", cancel);
        if (ui.keyDialog.open) ui.keyDialog.close();
        resolve(ok);
      };
      const submit = (ev) => {
        ev.preventDefault();
        const key = ui.key.value.trim();
        if (!key) return;
        setKey(key);
        done(true);
      };
      const cancel = () => done(false);
      ui.keyForm.addEventListener("submit", submit);
      ui.keyDialog.addEventListener("cancel", cancel);
      ui.keyDialog.showModal();
      ui.key.focus();
    }),
);

// ----------------------------------------------------------------- sessions

function newId() {
  const bytes = new Uint8Array(8);
  crypto.getRandomValues(bytes);
  return "w" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

function readSettings() {
  const num = (input) => (input.value === "" ? null : Number(input.value));
  return {
    temperature: num(ui.temperature),
    top_p: num(ui.topP),
    max_tokens: num(ui.maxTokens),
    seed: num(ui.seed),
    json_mode: ui.jsonMode.checked,
    json_schema: ui.jsonSchema.value,
  };
}

function showSettings(settings, messages) {
  const s = settings || {};
  const put = (input, v, d) => (input.value = v === null || v === undefined ? d : String(v));
  put(ui.temperature, s.temperature, "0.8");
  put(ui.topP, s.top_p, "0.95");
  put(ui.maxTokens, s.max_tokens, "512");
  put(ui.seed, s.seed, "");
  ui.jsonMode.checked = Boolean(s.json_mode);
  if (s.json_schema) ui.jsonSchema.value = s.json_schema;
  ui.schemaLabel.hidden = !ui.jsonMode.checked;
  const system = messages.length && messages[0].role === "system" ? messages[0].content : "";
  ui.system.value = system;
}

function draft() {
  return { id: newId(), title: DEFAULT_TITLE, messages: [], settings: null, tokens: null, onServer: false };
}

function notes(session) {
  return { title: session.title, messages: session.messages, settings: readSettings() };
}

// Writes the open session's notes to the server.
async function putNotes(session = state.current) {
  const stored = await sendJson("PUT", `/v1/sessions/${session.id}`, notes(session));
  session.onServer = true;
  session.tokens = stored.tokens ?? session.tokens;
  return stored;
}

async function refreshList() {
  const res = await getJson("/v1/sessions");
  state.list = res.data;
  renderList();
}

function renderList() {
  ui.sessions.replaceChildren();
  const rows = [...state.list];
  const cur = state.current;
  if (cur && !cur.onServer && !rows.some((r) => r.id === cur.id)) {
    rows.unshift({ id: cur.id, title: cur.title, tokens: null });
  }
  for (const row of rows) {
    const li = document.createElement("li");
    li.dataset.id = row.id;
    if (cur && row.id === cur.id) {
      li.classList.add("current");
      li.setAttribute("aria-current", "true");
    }
    const pick = document.createElement("button");
    pick.type = "button";
    pick.className = "pick";
    pick.textContent = row.title || row.id;
    pick.title = row.id;
    pick.addEventListener("click", () => openSession(row.id).catch(reportError));
    const rename = document.createElement("button");
    rename.type = "button";
    rename.className = "small";
    rename.textContent = "✎";
    rename.setAttribute("aria-label", `Rename ${row.title || row.id}`);
    rename.addEventListener("click", () => startRename(li, row));
    const del = document.createElement("button");
    del.type = "button";
    del.className = "small";
    del.textContent = "✕";
    del.setAttribute("aria-label", `Delete ${row.title || row.id}`);
    del.addEventListener("click", () => deleteSession(row).catch(reportError));
    li.append(pick, rename, del);
    ui.sessions.appendChild(li);
  }
}

function startRename(li, row) {
  const input = document.createElement("input");
  input.value = row.title || row.id;
  input.setAttribute("aria-label", "Session name");
  input.maxLength = 200;
  li.replaceChildren(input);
  input.focus();
  input.select();
  let done = false;
  const finish = async (commit) => {
    if (done) return;
    done = true;
    const title = input.value.trim();
    if (commit && title && title !== row.title) {
      try {
        await renameSession(row.id, title);
      } catch (e) {
        reportError(e);
      }
    }
    renderList();
  };
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") finish(true);
    else if (ev.key === "Escape") {
      ev.stopPropagation();
      finish(false);
    }
  });
  input.addEventListener("blur", () => finish(true));
}

async function renameSession(id, title) {
  if (state.current && state.current.id === id) {
    state.current.title = title;
    await putNotes();
    ui.title.textContent = title;
  } else {
    const s = await getJson(`/v1/sessions/${id}`);
    await sendJson("PUT", `/v1/sessions/${id}`, { title, messages: s.messages, settings: s.settings });
  }
  await refreshList();
}

async function deleteSession(row) {
  if (!confirm(`Delete "${row.title || row.id}" and its saved snapshot?`)) return;
  if (state.current && state.current.id === row.id && state.streaming) stop();
  const onServer = state.list.some((r) => r.id === row.id);
  if (onServer) await api("DELETE", `/v1/sessions/${row.id}`);
  await refreshList();
  if (state.current && state.current.id === row.id) {
    if (state.list.length) await openSession(state.list[0].id);
    else setCurrent(draft());
  }
}

function setCurrent(session) {
  state.current = session;
  state.stats = null;
  ui.exports.hidden = true;
  ui.exports.replaceChildren();
  showSettings(session.settings, session.messages);
  ui.title.textContent = session.title;
  history.replaceState(null, "", "#" + encodeURIComponent(session.id));
  renderList();
  renderLog();
  renderInfo();
  closeSidebar();
}

async function openSession(id) {
  if (state.streaming) return;
  clearError();
  const s = await getJson(`/v1/sessions/${id}`);
  setCurrent({
    id: s.id,
    title: s.title || s.id,
    messages: s.messages,
    settings: s.settings,
    tokens: s.tokens,
    onServer: true,
  });
}

async function newSession() {
  if (state.streaming) return;
  clearError();
  const s = draft();
  setCurrent(s);
  await putNotes(s);
  await refreshList();
  ui.message.focus();
}

// ----------------------------------------------------------------- messages

function messageView(m, index) {
  const art = document.createElement("article");
  art.className = `msg ${m.role}`;
  art.dataset.index = String(index);
  const head = document.createElement("div");
  head.className = "head";
  const role = document.createElement("span");
  role.className = "role";
  role.textContent = m.role;
  head.appendChild(role);
  if (m.stopped) {
    const note = document.createElement("span");
    note.className = "note";
    note.textContent = "stopped";
    head.appendChild(note);
  }
  const actions = document.createElement("div");
  actions.className = "actions";
  if (m.role !== "system") {
    const fork = document.createElement("button");
    fork.type = "button";
    fork.className = "small fork";
    fork.textContent = "Fork";
    fork.title = "A new session with the history up to this message";
    fork.addEventListener("click", () => forkAt(index).catch(reportError));
    actions.appendChild(fork);
  }
  head.appendChild(actions);
  art.appendChild(head);
  const reasoning = document.createElement("details");
  reasoning.className = "reasoning";
  const summary = document.createElement("summary");
  summary.textContent = "Reasoning";
  const rtext = document.createElement("div");
  rtext.className = "text";
  reasoning.append(summary, rtext);
  art.appendChild(reasoning);
  const body = document.createElement("div");
  body.className = m.role === "assistant" ? "body md" : "body";
  art.appendChild(body);
  fillMessage(art, m);
  return art;
}

function fillMessage(art, m) {
  const reasoning = art.querySelector(".reasoning");
  reasoning.hidden = !m.reasoning_content;
  if (m.reasoning_content) reasoning.querySelector(".text").textContent = m.reasoning_content;
  const body = art.querySelector(".body");
  if (m.role === "assistant") body.replaceChildren(render(m.content));
  else body.textContent = m.content;
}

function renderLog() {
  const messages = state.current ? state.current.messages : [];
  ui.log.replaceChildren();
  if (!messages.some((m) => m.role !== "system")) {
    const empty = document.createElement("p");
    empty.className = "empty";
    empty.textContent = "Send a message to start. This conversation is a server session: save it, fork it from any message, and come back to it later.";
    ui.log.appendChild(empty);
  }
  messages.forEach((m, i) => {
    if (m.role !== "system") ui.log.appendChild(messageView(m, i));
  });
  ui.log.scrollTop = ui.log.scrollHeight;
}

function renderInfo() {
  const i = state.info;
  const parts = [];
  if (i) parts.push(i.model, `context ${i.n_ctx}`, `KV ${i.kv_type}`);
  const used = state.current && state.current.tokens;
  parts.push(`used ${used ?? "–"}${i ? " / " + i.n_ctx : ""}`);
  if (state.stats) parts.push(`${state.stats.approx ? "≈" : ""}${state.stats.rate.toFixed(1)} tokens/s`);
  ui.info.textContent = parts.join(" · ");
}

// ------------------------------------------------------------------- a turn

function requestBody(session) {
  const s = readSettings();
  const body = {
    messages: session.messages.map((m) => ({ role: m.role, content: m.content })),
    session: session.id,
    stream: true,
    stream_options: { include_usage: true },
  };
  if (s.temperature !== null) body.temperature = s.temperature;
  if (s.top_p !== null) body.top_p = s.top_p;
  if (s.max_tokens !== null) body.max_tokens = s.max_tokens;
  if (s.seed !== null) body.seed = s.seed;
  if (s.json_mode) {
    let schema;
    try {
      schema = JSON.parse(s.json_schema);
    } catch (e) {
      throw new Error(`the JSON schema is not valid JSON: ${e.message}`);
    }
    body.response_format = { type: "json_schema", json_schema: { name: "page", schema } };
  }
  return body;
}

function syncSystem(session) {
  const text = ui.system.value.trim();
  const has = session.messages.length && session.messages[0].role === "system";
  if (text && has) session.messages[0].content = text;
  else if (text) session.messages.unshift({ role: "system", content: text });
  else if (has) session.messages.shift();
}

function setStreaming(on) {
  ui.send.disabled = on;
  ui.stop.disabled = !on;
  ui.save.disabled = on;
}

// A turn, from the request to its notes written (document.body's
// data-busy while it runs).
async function send() {
  if (state.streaming || document.body.dataset.busy) return;
  document.body.dataset.busy = "true";
  try {
    await turn();
  } finally {
    delete document.body.dataset.busy;
  }
}

async function turn() {
  clearError();
  const session = state.current;
  const text = ui.message.value;
  const last = session.messages[session.messages.length - 1];
  // An empty message replies to a last user message (after an error, or in
  // a fork taken at a question).
  if (!text.trim() && !(last && last.role === "user")) return;
  syncSystem(session);
  if (text.trim()) session.messages.push({ role: "user", content: text });
  let body;
  try {
    body = requestBody(session);
  } catch (e) {
    if (text.trim()) session.messages.pop();
    reportError(e);
    return;
  }
  if (session.title === DEFAULT_TITLE) {
    const first = session.messages.find((m) => m.role === "user");
    if (first) {
      const line = first.content.trim().split("\n")[0];
      session.title = (line.length > 60 ? line.slice(0, 59) + "…" : line) || DEFAULT_TITLE;
    }
    ui.title.textContent = session.title;
  }
  ui.message.value = "";
  const reply = { role: "assistant", content: "" };
  session.messages.push(reply);
  renderLog();
  const view = ui.log.lastElementChild;
  view.classList.add("streaming");
  const controller = new AbortController();
  state.streaming = { controller, reply };
  setStreaming(true);
  const started = performance.now();
  let first = null;
  let lastAt = null;
  let pieces = 0;
  let usage = null;
  let pending = false;
  const paint = () => {
    pending = false;
    fillMessage(view, reply);
    ui.log.scrollTop = ui.log.scrollHeight;
  };
  try {
    const res = await api("POST", "/v1/chat/completions", { json: body, signal: controller.signal });
    for await (const chunk of events(res)) {
      if (chunk.error) throw new ApiError(500, chunk.error.message);
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const d = choice.delta || {};
        if (d.reasoning_content) reply.reasoning_content = (reply.reasoning_content || "") + d.reasoning_content;
        if (d.content) reply.content += d.content;
        if (d.content || d.reasoning_content) {
          pieces++;
          lastAt = performance.now();
          if (first === null) first = lastAt;
        }
      }
      if (!pending) {
        pending = true;
        requestAnimationFrame(paint);
      }
    }
  } catch (e) {
    if (e.name === "AbortError") {
      reply.stopped = true;
    } else {
      // The turn did not happen: its messages go, the text comes back.
      session.messages.pop();
      if (text.trim()) {
        session.messages.pop();
        ui.message.value = text;
      }
      state.streaming = null;
      setStreaming(false);
      renderLog();
      reportError(e);
      return;
    }
  }
  state.streaming = null;
  setStreaming(false);
  view.classList.remove("streaming");
  if (usage) {
    session.tokens = usage.total_tokens;
    const n = usage.completion_tokens;
    const span = first !== null && lastAt > first ? (lastAt - first) / 1000 : (performance.now() - started) / 1000;
    state.stats = { rate: n > 1 && lastAt > first ? (n - 1) / span : n / span, approx: false };
  } else if (pieces > 1 && lastAt > first) {
    state.stats = { rate: (pieces - 1) / ((lastAt - first) / 1000), approx: true };
  }
  renderLog();
  renderInfo();
  try {
    await putNotes(session);
    await refreshList();
  } catch (e) {
    reportError(e);
  }
}

function stop() {
  if (state.streaming) state.streaming.controller.abort();
}

// ------------------------------------------------------ fork, save, export

async function forkAt(index) {
  if (state.streaming) return;
  clearError();
  const src = state.current;
  if (!src.onServer) await putNotes(src);
  const history = src.messages.slice(0, index + 1).map((m) => ({ ...m }));
  const res = await sendJson("POST", `/v1/sessions/${src.id}/fork`, {
    title: `${src.title} (fork)`.slice(0, 200),
    messages: history,
    settings: readSettings(),
  });
  await refreshList();
  await openSession(res.id);
}

async function save() {
  if (state.streaming) return;
  clearError();
  const s = state.current;
  await putNotes(s);
  const res = await sendJson("POST", `/v1/sessions/${s.id}/save`, {});
  s.tokens = res.tokens;
  renderInfo();
  await refreshList();
  flash(ui.save, "Saved");
}

function flash(button, text) {
  const label = button.textContent;
  button.dataset.label = label;
  button.setAttribute("aria-label", label);
  button.textContent = text;
  setTimeout(() => (button.textContent = button.dataset.label), 1500);
}

function fileName(title) {
  return (title || "session").replace(/[^\w.-]+/g, "_").slice(0, 60) || "session";
}

function downloadLink(blob, name) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = name;
  a.textContent = name;
  return a;
}

async function exportSession() {
  if (state.streaming) return;
  clearError();
  const s = state.current;
  const name = fileName(s.title) + ".oxisnap";
  ui.exports.replaceChildren();
  const label = document.createElement("span");
  label.textContent = "Export:";
  ui.exports.appendChild(label);
  try {
    const res = await api("GET", `/v1/sessions/${s.id}/snapshot`);
    ui.exports.appendChild(downloadLink(await res.blob(), name));
  } catch (e) {
    // A session with no turn yet has no state to export, only its messages.
    if (!(e instanceof ApiError && e.status === 404)) throw e;
  }
  const chat = new Blob([JSON.stringify({ title: s.title, messages: s.messages, settings: readSettings() }, null, 1)], {
    type: "application/json",
  });
  ui.exports.appendChild(downloadLink(chat, name + ".chat.json"));
  const close = document.createElement("button");
  close.type = "button";
  close.className = "icon";
  close.textContent = "×";
  close.setAttribute("aria-label", "Close export");
  close.addEventListener("click", () => (ui.exports.hidden = true));
  ui.exports.appendChild(close);
  ui.exports.hidden = false;
}

async function importFiles(files) {
  clearError();
  const list = Array.from(files);
  const snap = list.find((f) => !f.name.endsWith(".json"));
  const json = list.find((f) => f.name.endsWith(".json"));
  if (!snap && !json) return;
  const id = newId();
  let messages = [];
  let title = (snap || json).name.replace(/\.chat\.json$|\.json$/, "").replace(/\.oxisnap$/, "");
  let settings = null;
  if (json) {
    let data;
    try {
      data = JSON.parse(await json.text());
    } catch (e) {
      throw new Error(`${json.name} is not JSON: ${e.message}`);
    }
    if (!Array.isArray(data.messages)) throw new Error(`${json.name} holds no "messages" list`);
    messages = data.messages.map((m) => {
      const out = { role: m.role, content: m.content };
      if (m.reasoning_content) out.reasoning_content = m.reasoning_content;
      if (m.stopped) out.stopped = true;
      return out;
    });
    if (typeof data.title === "string" && data.title) title = data.title;
    settings = data.settings || null;
  }
  if (snap) {
    await api("PUT", `/v1/sessions/${id}/snapshot`, { body: snap, type: "application/octet-stream" });
  }
  await sendJson("PUT", `/v1/sessions/${id}`, { title: title.slice(0, 200) || "Imported", messages, settings });
  await refreshList();
  await openSession(id);
}

// ------------------------------------------------------------------- layout

function openSidebar() {
  ui.sidebar.classList.add("open");
  ui.openSidebar.setAttribute("aria-expanded", "true");
  ui.newSession.focus();
}

function closeSidebar() {
  if (!ui.sidebar.classList.contains("open")) return;
  ui.sidebar.classList.remove("open");
  ui.openSidebar.setAttribute("aria-expanded", "false");
}

// -------------------------------------------------------------------- wiring

function wire() {
  ui.composer.addEventListener("submit", (ev) => {
    ev.preventDefault();
    send().catch(reportError);
  });
  ui.message.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      send().catch(reportError);
    }
  });
  document.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape" && state.streaming) {
      ev.preventDefault();
      stop();
    } else if (ev.key === "Escape") {
      closeSidebar();
    }
  });
  ui.stop.addEventListener("click", stop);
  ui.newSession.addEventListener("click", () => newSession().catch(reportError));
  ui.save.addEventListener("click", () => save().catch(reportError));
  ui.exportButton.addEventListener("click", () => exportSession().catch(reportError));
  ui.importInput.addEventListener("change", () => {
    importFiles(ui.importInput.files)
      .catch(reportError)
      .finally(() => (ui.importInput.value = ""));
  });
  ui.toggleSettings.addEventListener("click", () => {
    ui.settings.hidden = !ui.settings.hidden;
    ui.toggleSettings.setAttribute("aria-expanded", String(!ui.settings.hidden));
  });
  ui.jsonMode.addEventListener("change", () => (ui.schemaLabel.hidden = !ui.jsonMode.checked));
  for (const input of [ui.temperature, ui.topP, ui.maxTokens, ui.seed, ui.jsonMode, ui.jsonSchema, ui.system]) {
    input.addEventListener("change", () => {
      const s = state.current;
      if (!s || state.streaming) return;
      if (input === ui.system) {
        syncSystem(s);
        renderLog();
      }
      if (s.onServer) putNotes(s).catch(reportError);
    });
  }
  ui.errorClose.addEventListener("click", clearError);
  // Sessions another browser or client made show up when the tab is back.
  window.addEventListener("focus", () => {
    if (!state.streaming) refreshList().catch(() => {});
  });
  ui.openSidebar.addEventListener("click", openSidebar);
  ui.closeSidebar.addEventListener("click", closeSidebar);
}

async function start() {
  wire();
  setStreaming(false);
  try {
    state.info = await getJson("/v1/info");
    document.title = `${state.info.model} · oxillama`;
    await refreshList();
    const wanted = decodeURIComponent(location.hash.slice(1));
    const known = state.list.find((r) => r.id === wanted) || state.list[0];
    if (known) await openSession(known.id);
    else setCurrent(draft());
  } catch (e) {
    setCurrent(draft());
    reportError(e);
  }
  renderInfo();
  document.body.dataset.ready = "true";
  ui.message.focus();
}

start();
