// The one place that knows how to reach the server. Every fetch and every
// WebSocket URL of the pages is built here, and so is the login of a server
// with API keys: a 401 opens the key prompt and the request goes on with the
// key (kept for this tab, or on this device when asked); WebSockets, which
// cannot carry headers, get a short-lived client token minted with the key.

import { askForKey } from './login.js';

const KEY_ITEM = 'omnilive.apiKey';
const TOKEN_PROTOCOL = 'omnilive.token.';
// A token is minted again this long before it expires, so none expires on the way.
const TOKEN_MARGIN_MS = 60_000;
// Links (<audio src>, downloads) cannot ask again when their token expires:
// they get the longest life the server grants (it caps what is asked).
const LINK_TOKEN_TTL_S = 3600;

const tokens = { session: null, link: null }; // {value, expiresAt (ms)}

/** The API key this browser signed in with, or null (also on a server without keys). */
export function storedKey() {
  return sessionStorage.getItem(KEY_ITEM) ?? localStorage.getItem(KEY_ITEM);
}

/** Fired on window when a key is entered (the header then offers to sign out). */
export const SIGNED_IN = 'omnilive-signed-in';

function storeKey(key, remember) {
  forgetKey();
  (remember ? localStorage : sessionStorage).setItem(KEY_ITEM, key);
  window.dispatchEvent(new Event(SIGNED_IN));
}

/** Sign out: drop the key and the tokens minted with it. */
export function forgetKey() {
  sessionStorage.removeItem(KEY_ITEM);
  localStorage.removeItem(KEY_ITEM);
  tokens.session = null;
  tokens.link = null;
}

/** Extra request headers for the server: the key, once there is one. */
function authHeaders() {
  const key = storedKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

/** Query parameters of links the browser fetches by itself (no headers there). */
function authParams() {
  const token = tokens.link;
  return token && token.expiresAt > Date.now() ? { token: token.value } : {};
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
  return `${scheme}//${location.host}${withQuery(path, params)}`;
}

/** An HTTP error with the server's status and its message, if it sent one. */
export class HttpError extends Error {
  constructor(status, message, code = null) {
    super(message || `HTTP ${status}`);
    this.status = status;
    this.code = code; // the server's error code (`unauthorized`, `forbidden`, ...), if any
  }
}

async function errorOf(response) {
  let detail = response.statusText;
  let code = null;
  try {
    const body = await response.json();
    const value = body.detail ?? body.error ?? body.message;
    if (value) detail = typeof value === 'string' ? value : JSON.stringify(value);
    if (typeof body.code === 'string') code = body.code;
  } catch {
    // not JSON: keep the status text
  }
  return new HttpError(response.status, detail, code);
}

/** The header's "Sign in" after a cancelled prompt: ask again, then start the page over. */
export async function signInAgain() {
  const answer = await askForKey('login.needed', { again: true });
  if (!answer) return;
  storeKey(answer.key, answer.remember);
  location.reload();
}

/**
 * After a refusal for want of a credential, ask for a key; true when one was
 * entered and the request should be tried again with it.
 */
async function signIn(error) {
  let reason = null;
  if (error.status === 401) reason = storedKey() ? 'login.rejected' : 'login.needed';
  // Without keys a 403 `forbidden` is the loopback rule, which no key changes.
  else if (error.status === 403 && error.code === 'forbidden' && storedKey()) reason = 'login.admin';
  if (!reason) return false;
  const answer = await askForKey(reason);
  if (!answer) return false;
  storeKey(answer.key, answer.remember);
  return true;
}

/**
 * fetch() with the key, asking for one (and trying again) while the server
 * refuses for want of it; `accept` says which answers are the caller's.
 */
async function fetchSignedIn(path, init, accept = (response) => response.ok) {
  for (;;) {
    const headers = { ...authHeaders(), ...init.headers };
    const response = await fetch(httpUrl(path), { ...init, headers });
    if (accept(response)) return response;
    const error = await errorOf(response);
    if (!(await signIn(error))) throw error;
  }
}

/** fetch() with the server's credentials. Throws HttpError on a non-2xx status. */
export async function request(method, path, { body, json, signal } = {}) {
  if (json === undefined) return fetchSignedIn(path, { method, body, signal });
  const headers = { 'Content-Type': 'application/json' };
  return fetchSignedIn(path, { method, headers, body: JSON.stringify(json), signal });
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
  const response = await fetchSignedIn('/status', {}, (r) => r.ok || r.status === 503);
  try {
    return await response.json();
  } catch {
    throw new HttpError(response.status, response.statusText);
  }
}

async function token(kind, ttlS) {
  if (!storedKey()) return null; // a server without keys needs none
  const cached = tokens[kind];
  if (cached && cached.expiresAt - Date.now() > TOKEN_MARGIN_MS) return cached.value;
  const started = Date.now();
  const body = await sendJSON('POST', '/v1/client_secrets', ttlS ? { ttl_s: ttlS } : {});
  // ttl_s, not expires_at: the browser's clock need not agree with the server's.
  tokens[kind] = { value: body.token, expiresAt: started + body.ttl_s * 1000 };
  return body.token;
}

/**
 * Where to open a WebSocket: its URL and the subprotocols to offer. With a
 * key, a client token rides as the `omnilive.token.<token>` subprotocol (not
 * in the URL, where logs and history would keep it).
 */
export async function socketTarget(path, params) {
  const value = await token('session');
  const protocols = value ? ['omnilive', TOKEN_PROTOCOL + value] : [];
  return { url: wsUrl(path, params), protocols };
}

/**
 * Make httpUrl() links (audio, downloads) carry a client token from now on;
 * call before building them. Nothing to do on a server without keys.
 */
export async function prepareLinks() {
  await token('link', LINK_TOKEN_TTL_S);
}

/**
 * After a WebSocket was refused before it opened: drop its token and check
 * the key (a 401 opens the prompt). True when the server has keys and ours
 * (perhaps just entered) is good, so one more try with a fresh token may
 * succeed; false on a server without keys or when the user cancels.
 */
export async function recheckAccess() {
  tokens.session = null;
  try {
    await getStatus();
  } catch {
    return false;
  }
  return storedKey() !== null;
}

/** A fresh, unguessable client-side session id with a prefix. */
export function newSessionId(prefix) {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return prefix + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}
