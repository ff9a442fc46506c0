// What the server runs: GET /status, once per page load (the engine and its
// capabilities do not change while a page is open; live numbers are fetched
// again by the pages that show them).

import { getStatus } from './api.js';

let statusPromise = null;

/** /status, or null when the server cannot be reached. */
export function serverStatus() {
  statusPromise ??= getStatus().catch(() => null);
  return statusPromise;
}

/** The engine's capabilities, or {} while no worker has reported them. */
export async function capabilities() {
  return (await serverStatus())?.capabilities || {};
}
