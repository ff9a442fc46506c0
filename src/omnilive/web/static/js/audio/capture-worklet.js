// AudioWorklet processor: microphone audio at the context's rate in, float32
// 16 kHz chunks of a fixed length out (posted to the main thread). It runs on
// the audio rendering thread, so chunks are paced by the hardware clock, not
// by timers that stall when a tab is busy.
//
// Resampling: a moving average over one output period (a cheap low-pass that
// keeps aliasing out of speech) followed by linear interpolation at the exact
// fractional positions, carried across render quanta so chunks join without
// clicks or drift.

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions || {};
    this.targetRate = opts.targetRate || 16000;
    this.step = sampleRate / this.targetRate; // input samples per output sample
    this.taps = Math.max(1, Math.round(this.step));
    this.ring = new Float32Array(this.taps);
    this.ringAt = 0;
    this.ringSum = 0;
    this.previous = 0; // last filtered input sample
    this.phase = 0; // position of the next output, in input samples after `previous`
    this.setChunk(opts.chunkSeconds || 0.5);
    this.level = 0;
    this.levelCount = 0;
    this.port.onmessage = (event) => this.command(event.data);
  }

  setChunk(seconds) {
    this.chunk = new Float32Array(Math.max(1, Math.round(seconds * this.targetRate)));
    this.filled = 0;
  }

  command(message) {
    if (message.type === 'flush') {
      // push-to-talk release: the partial chunk is the end of the utterance
      const rest = this.chunk.slice(0, this.filled);
      this.filled = 0;
      this.port.postMessage({ type: 'flushed', audio: rest }, [rest.buffer]);
    } else if (message.type === 'reset') {
      // drop what was heard while the page was not listening (echo of the AI)
      this.filled = 0;
    } else if (message.type === 'chunkSeconds') {
      this.setChunk(message.value);
    }
  }

  emit(samples) {
    this.port.postMessage({ type: 'chunk', audio: samples }, [samples.buffer]);
  }

  push(value) {
    this.chunk[this.filled] = value;
    this.filled += 1;
    this.level = Math.max(this.level, Math.abs(value));
    if (this.filled === this.chunk.length) {
      const full = this.chunk;
      // emit() hands the buffer over (detaching it), so take the size first
      this.chunk = new Float32Array(full.length);
      this.filled = 0;
      this.emit(full);
    }
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || channels.length === 0) return true;
    const frames = channels[0].length;
    for (let i = 0; i < frames; i += 1) {
      let x = 0;
      for (let c = 0; c < channels.length; c += 1) x += channels[c][i];
      x /= channels.length;
      this.ringSum += x - this.ring[this.ringAt];
      this.ring[this.ringAt] = x;
      this.ringAt = (this.ringAt + 1) % this.taps;
      const filtered = this.ringSum / this.taps;
      while (this.phase <= 1) {
        this.push(this.previous + (filtered - this.previous) * this.phase);
        this.phase += this.step;
      }
      this.phase -= 1;
      this.previous = filtered;
    }
    // a peak level about every 50 ms, for meters
    this.levelCount += frames;
    if (this.levelCount >= sampleRate / 20) {
      this.port.postMessage({ type: 'level', value: this.level });
      this.level = 0;
      this.levelCount = 0;
    }
    return true;
  }
}

registerProcessor('omnilive-capture', CaptureProcessor);
