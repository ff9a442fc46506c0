// One WebSocket session with the server: JSON in and out, the queue messages
// routed to a QueueView, everything else to the page. A connection that drops
// (no close frame) is resumed with the session's token, retried with backoff
// within the server's grace period (docs/resume.md); the page is told by a
// notice and hears of the close only if the resume fails.

import { notify } from '../ui/nav.js';
import { recheckAccess, socketTarget } from './api.js';
import { t } from './i18n.js';

/** A server message as an object (JSON text parsed); null if it is not JSON,
 * which the protocols never send. */
export function parsed(data) {
  if (typeof data !== 'string') return data;
  try {
    return JSON.parse(data);
  } catch {
    return null;
  }
}

/** A server message (JSON text, or already parsed) to the page: queue
 * messages also to its QueueView. */
export function deliver(data, queue, onMessage) {
  const message = parsed(data);
  if (message === null) return;
  if (message.type === 'queued' || message.type === 'queue_update') queue?.update(message);
  else if (message.type === 'queue_done') queue?.done();
  onMessage(message);
}

const ABNORMAL_CLOSE = 1006;
const FIRST_RETRY_MS = 200;
const MAX_RETRY_MS = 4000;

/**
 * Keep a server message's resume fields on ``live`` (a LiveSocket or LiveRtc:
 * its resumeToken, graceMs, lastSeq). True for the resume's own notice,
 * `session.resumed`, which is not the page's.
 */
export function keepResumeFields(live, message) {
  if (message.type === 'session.resumed') {
    live.resumeToken = message.resume_token;
    return true;
  }
  if (typeof message.seq === 'number') live.lastSeq = message.seq;
  if (message.resume_token && message.seq === 1) {
    live.resumeToken = message.resume_token;
    live.graceMs = (message.resume_grace_s || 0) * 1000;
  }
  return false;
}

/**
 * Try ``attempt`` again, backing off, until it succeeds (true), ``graceMs``
 * has passed or ``stop()`` says so (false): the server holds a dropped
 * session that long.
 */
export async function retryWithin(graceMs, stop, attempt) {
  const deadline = Date.now() + graceMs;
  let delay = FIRST_RETRY_MS;
  while (!stop() && Date.now() < deadline) {
    try {
      await attempt();
      return true;
    } catch {
      await new Promise((done) => setTimeout(done, delay));
      delay = Math.min(2 * delay, MAX_RETRY_MS);
    }
  }
  return false;
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
    this.resumeToken = null; // from the session's first message, then each session.resumed
    this.graceMs = 0;
    this.lastSeq = 0;
    this.closing = false; // the page closed it: no resume
    this.resumes = 0;
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

  async attempt(resume = false) {
    const { url, protocols } = await socketTarget(this.path, { ...this.params, seq: '1' });
    if (resume) {
      if (!protocols.includes('omnilive')) protocols.unshift('omnilive');
      protocols.push(`omnilive.resume.${this.resumeToken}`, `omnilive.last_seq.${this.lastSeq}`);
    }
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(url, protocols);
      this.ws = ws;
      let opened = false;
      ws.onopen = () => {
        opened = true;
        resolve(this);
      };
      ws.onmessage = (event) => {
        const message = parsed(event.data);
        if (message !== null && !keepResumeFields(this, message)) {
          deliver(message, this.queue, this.onMessage);
        }
      };
      ws.onclose = (event) => {
        if (!opened) {
          reject(new Error(`connection refused (${event.code})`));
          return; // connect() may try again: the page hears of a close once it was open
        }
        if (this.ws === ws && this.shouldResume(event)) {
          this.resume(event);
          return;
        }
        if (this.ws !== ws) return; // an old socket, taken over by a resume
        this.queue?.done();
        this.onClose(event);
      };
    });
  }

  shouldResume(event) {
    return !this.closing && this.resumeToken !== null && event.code === ABNORMAL_CLOSE;
  }

  /** Reconnect with the token until the grace period is over; else the page hears the close. */
  async resume(lostEvent) {
    notify(t('live.reconnecting'), 'info');
    if (await retryWithin(this.graceMs, () => this.closing, () => this.attempt(true))) {
      this.resumes += 1;
      notify(t('live.resumed'), 'ok');
      return;
    }
    this.queue?.done();
    this.onClose(lostEvent);
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
    this.closing = true;
    if (this.ws && this.ws.readyState <= WebSocket.OPEN) this.ws.close(code);
  }
}
