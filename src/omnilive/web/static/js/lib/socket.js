// One WebSocket session with the server: JSON in and out, the queue messages
// routed to a QueueView, everything else to the page.

import { recheckAccess, socketTarget } from './api.js';
import { t } from './i18n.js';

/** A server message to the page: queue messages also to its QueueView. */
export function deliver(data, queue, onMessage) {
  let message;
  try {
    message = JSON.parse(data);
  } catch {
    return; // the protocols only send JSON text
  }
  if (message.type === 'queued' || message.type === 'queue_update') queue?.update(message);
  else if (message.type === 'queue_done') queue?.done();
  onMessage(message);
}

export class LiveSocket {
  /**
   * @param {string} path  e.g. '/ws/half_duplex/hd_...'
   * @param {{params?: object, queue?: import('../ui/queue.js').QueueView,
   *          onMessage?: (msg) => void, onClose?: (CloseEvent) => void}} options
   */
  constructor(path, { params = {}, queue = null, onMessage = () => {}, onClose = () => {} } = {}) {
    this.path = path;
    this.params = params;
    this.queue = queue;
    this.onMessage = onMessage;
    this.onClose = onClose;
    this.ws = null;
    this.sent = 0;
  }

  get open() {
    return this.ws !== null && this.ws.readyState === WebSocket.OPEN;
  }

  /**
   * Connect; resolves once open, rejects if the connection cannot be made.
   * A server with API keys that refuses the upgrade gets one more try after
   * the key is checked (and asked for, when the server no longer takes it).
   */
  async connect() {
    try {
      return await this.attempt();
    } catch (error) {
      if (!(await recheckAccess())) throw error;
    }
    try {
      return await this.attempt();
    } catch {
      // The key is good, so the refusal was something else a browser cannot
      // read from a refused upgrade: most often this key's session limit.
      throw new Error(t('error.refused'));
    }
  }

  async attempt() {
    const { url, protocols } = await socketTarget(this.path, this.params);
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, protocols);
      this.ws = ws;
      let opened = false;
      ws.onopen = () => {
        opened = true;
        resolve(this);
      };
      ws.onmessage = (event) => deliver(event.data, this.queue, this.onMessage);
      ws.onclose = (event) => {
        if (!opened) {
          reject(new Error(`connection refused (${event.code})`));
          return; // connect() may try again: the page hears of a close once it was open
        }
        this.queue?.done();
        this.onClose(event);
      };
    });
  }

  /** Send one message; false when the connection is not open. */
  send(message) {
    if (!this.open) return false;
    this.ws.send(JSON.stringify(message));
    this.sent += 1;
    return true;
  }

  /** Bytes accepted by send() but not yet on the network. */
  get backlog() {
    return this.ws ? this.ws.bufferedAmount : 0;
  }

  close(code = 1000) {
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(code);
  }
}
