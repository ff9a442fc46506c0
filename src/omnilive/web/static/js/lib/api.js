// The one place that knows how to reach the server. Every fetch and every
// WebSocket URL of the pages is built here, so that adding credentials (an
// API key login, short-lived client tokens) later changes this file only.

/** Extra request headers for the server; empty until pages log in. */
function authHeaders() {
  return {};
}

/** Query parameters a WebSocket upgrade carries (browsers cannot set headers on it). */
function authParams() {
  return {};
}

function withQuery(path, params) {
  const query = new URLSearchParams();
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null) query.set(key, String(value));
  }
  const text = query.toString();
  if (!text) return path;
  return path + (path.includes('?') ? '&' : '?') + text;
}

/** A same-origin URL for an HTTP path (for links, <audio src>, downloads). */
export function httpUrl(path, params) {
  return new URL(withQuery(path, { ...params, ...authParams() }), location.origin).toString();
}

/** The ws:// or wss:// URL of a WebSocket path on this server. */
export function wsUrl(path, params) {
  const scheme = location.protocol === 'https:' ? 'wss:' : 'ws:';
  return `${scheme}//${location.host}${withQuery(path, { ...params, ...authParams() })}`;
}

/** An HTTP error with the server's status and its message, if it sent one. */
export class HttpError extends Error {
  constructor(status, message) {
    super(message || `HTTP ${status}`);
    this.status = status;
  }
}

async function errorOf(response) {
  let detail = response.statusText;
  try {
    const body = await response.json();
    const value = body.detail ?? body.error ?? body.message;
    if (value) detail = typeof value === 'string' ? value : JSON.stringify(value);
  } catch {
    // not JSON: keep the status text
  }
  return new HttpError(response.status, detail);
}

/** fetch() with the server's credentials. Throws HttpError on a non-2xx status. */
export async function request(method, path, { body, json, signal } = {}) {
  const headers = { ...authHeaders() };
  let payload = body;
  if (json !== undefined) {
    headers['Content-Type'] = 'application/json';
    payload = JSON.stringify(json);
  }
  const response = await fetch(httpUrl(path), { method, headers, body: payload, signal });
  if (!response.ok) throw await errorOf(response);
  return response;
}

export async function getJSON(path, options) {
  return (await request('GET', path, options)).json();
}

export async function sendJSON(method, path, json) {
  return (await request(method, path, { json })).json();
}

/**
 * GET a JSON API that may not exist on every server (optional features
 * arrive in stages): a 404 gives `fallback` instead of an error.
 */
export async function getOptional(path, fallback) {
  try {
    return await getJSON(path);
  } catch (error) {
    if (error instanceof HttpError && (error.status === 404 || error.status === 405)) return fallback;
    throw error;
  }
}

/** GET /status; it answers 503 with a body while no worker is ready. */
export async function getStatus() {
  const response = await fetch(httpUrl('/status'), { headers: authHeaders() });
  try {
    return await response.json();
  } catch {
    throw new HttpError(response.status, response.statusText);
  }
}

/** A fresh, unguessable client-side session id with a prefix. */
export function newSessionId(prefix) {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}
