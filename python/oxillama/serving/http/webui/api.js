// Calls to the server's API: the key (kept in this tab's sessionStorage
// only), the server's error messages, and server-sent event streams.

const KEY = "oxillama-api-key";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function getKey() {
  return sessionStorage.getItem(KEY);
}

export function setKey(key) {
  sessionStorage.setItem(KEY, key);
}

let askKey = null;

// `ask(message)` is called on a 401: it resolves true once a new key is
// set (the request is then sent again), false to give up.
export function onKeyNeeded(ask) {
  askKey = ask;
}

async function errorMessage(res) {
  const text = await res.text();
  try {
    const body = JSON.parse(text);
    if (body && body.error && body.error.message) return body.error.message;
  } catch {
    // not JSON: the text itself
  }
  return `${res.status} ${res.statusText}${text ? ": " + text.slice(0, 300) : ""}`;
}

// fetch() with the key; a server error becomes an ApiError with the
// server's own message.
export async function api(method, path, { json, body, signal, type } = {}) {
  for (;;) {
    const headers = {};
    const key = getKey();
    if (key) headers.Authorization = "Bearer " + key;
    let payload = body;
    if (json !== undefined) {
      headers["Content-Type"] = "application/json";
      payload = JSON.stringify(json);
    } else if (type) {
      headers["Content-Type"] = type;
    }
    let res;
    try {
      res = await fetch(path, { method, headers, body: payload, signal });
    } catch (e) {
      if (e.name === "AbortError") throw e;
      throw new ApiError(0, `cannot reach the server (${e.message}): is oxillama serve still running?`);
    }
    if (res.status === 401 && askKey) {
      const message = await errorMessage(res);
      if (await askKey(message)) continue;
      throw new ApiError(401, message);
    }
    if (!res.ok) throw new ApiError(res.status, await errorMessage(res));
    return res;
  }
}

export async function getJson(path) {
  return (await api("GET", path)).json();
}

export async function sendJson(method, path, json) {
  return (await api(method, path, { json })).json();
}

// The JSON events of a server-sent event stream, up to "[DONE]".
export async function* events(res) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        yield JSON.parse(data);
      }
    }
  }
}
