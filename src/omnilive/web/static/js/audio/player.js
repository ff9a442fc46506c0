// Gap-free, in-order playback of the AI's 24 kHz float32 audio.
//
// Each piece becomes an AudioBufferSourceNode started exactly where the
// previous one ends on the audio clock, so pieces join without gaps or
// overlaps however irregularly they arrive. A short lead before the first
// piece absorbs network jitter. flush() stops everything at once, for
// interruptions (force-listen, pause, stop, a new question).

import { base64ToFloat32 } from '../lib/b64.js';

export const OUTPUT_RATE = 24000;

// What every player on the page has scheduled, for tests and diagnostics.
const totals = { chunks: 0, seconds: 0, flushes: 0 };
window.omniliveAudio = totals;

export class PcmPlayer {
  /** @param {{leadSeconds?: number, onIdle?: () => void, onStart?: () => void}} options */
  constructor({ leadSeconds = 0.08, onIdle = () => {}, onStart = () => {} } = {}) {
    this.leadSeconds = leadSeconds;
    this.onIdle = onIdle;
    this.onStart = onStart;
    this.context = null;
    this.gain = null;
    this.sources = new Set();
    this.nextTime = 0;
    this.volume = 1;
  }

  /**
   * Create (or wake) the audio context. Browsers only allow sound after a
   * user gesture, so pages call this from their Start / Send click.
   */
  unlock() {
    if (!this.context) {
      this.context = new AudioContext();
      this.gain = this.context.createGain();
      this.gain.gain.value = this.volume;
      this.gain.connect(this.context.destination);
    }
    if (this.context.state === 'suspended') this.context.resume();
    return this.context;
  }

  /** True while audio is scheduled or playing. */
  get playing() {
    return this.sources.size > 0;
  }

  /** Seconds of scheduled audio not yet played. */
  get remaining() {
    if (!this.context || !this.playing) return 0;
    return Math.max(0, this.nextTime - this.context.currentTime);
  }

  setVolume(value) {
    this.volume = value;
    if (this.gain) this.gain.gain.value = value;
  }

  /** Queue one piece: a Float32Array, or base64 of float32 PCM. */
  enqueue(audio) {
    const samples = typeof audio === 'string' ? base64ToFloat32(audio) : audio;
    if (!samples || samples.length === 0) return;
    const context = this.unlock();
    const buffer = context.createBuffer(1, samples.length, OUTPUT_RATE);
    buffer.copyToChannel(samples, 0);
    const source = context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.gain);
    const wasIdle = !this.playing;
    const start = Math.max(this.nextTime, context.currentTime + (wasIdle ? this.leadSeconds : 0));
    source.start(start);
    this.nextTime = start + buffer.duration;
    this.sources.add(source);
    source.onended = () => {
      this.sources.delete(source);
      if (!this.playing) this.onIdle();
    };
    totals.chunks += 1;
    totals.seconds += buffer.duration;
    if (wasIdle) this.onStart();
  }

  /** Stop and drop everything scheduled. */
  flush() {
    const sources = [...this.sources];
    this.sources.clear();
    for (const source of sources) {
      source.onended = null;
      try {
        source.stop();
      } catch {
        // never started: nothing to stop
      }
    }
    this.nextTime = 0;
    if (sources.length) {
      totals.flushes += 1;
      this.onIdle();
    }
  }

  async close() {
    this.flush();
    const context = this.context;
    this.context = null;
    if (context) await context.close();
  }
}
