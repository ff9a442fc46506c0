// Microphone capture: 16 kHz float32 chunks from an AudioWorklet
// (capture-worklet.js). The page decides what to do with each chunk (send,
// hold back while the AI speaks, collect for push-to-talk).

const WORKLET_URL = new URL('./capture-worklet.js', import.meta.url);

export class MicCapture {
  /**
   * @param {{chunkSeconds?: number, onChunk?: (Float32Array) => void,
   *          onLevel?: (number) => void}} options
   */
  constructor({ chunkSeconds = 0.5, onChunk = () => {}, onLevel = () => {} } = {}) {
    this.chunkSeconds = chunkSeconds;
    this.onChunk = onChunk;
    this.onLevel = onLevel;
    this.context = null;
    this.stream = null;
    this.node = null;
    this.flushed = []; // resolvers of pending flush() calls, in order
  }

  get running() {
    return this.context !== null;
  }

  /** Ask for the microphone and start chunking. Call from a user gesture. */
  async start() {
    if (this.context) return;
    this.stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    // The context runs at the device's own rate; the worklet resamples to 16 kHz.
    const context = new AudioContext();
    try {
      await context.audioWorklet.addModule(WORKLET_URL);
      const source = context.createMediaStreamSource(this.stream);
      const node = new AudioWorkletNode(context, 'omnilive-capture', {
        numberOfInputs: 1,
        numberOfOutputs: 1,
        channelCount: 1,
        channelCountMode: 'explicit',
        processorOptions: { targetRate: 16000, chunkSeconds: this.chunkSeconds },
      });
      node.port.onmessage = (event) => {
        const { type, audio, value } = event.data;
        if (type === 'chunk') this.onChunk(audio);
        else if (type === 'level') this.onLevel(value);
        else if (type === 'flushed') this.flushed.shift()?.(audio);
      };
      // A silent path to the destination keeps the node in the rendering graph.
      const mute = context.createGain();
      mute.gain.value = 0;
      source.connect(node);
      node.connect(mute);
      mute.connect(context.destination);
      if (context.state === 'suspended') await context.resume();
      this.context = context;
      this.node = node;
    } catch (error) {
      await context.close();
      this.stream.getTracks().forEach((track) => track.stop());
      this.stream = null;
      throw error;
    }
  }

  /** The partial chunk, now (the end of a push-to-talk utterance). */
  flush() {
    if (!this.node) return Promise.resolve(new Float32Array(0));
    return new Promise((resolve) => {
      this.flushed.push(resolve);
      this.node.port.postMessage({ type: 'flush' });
    });
  }

  /** Forget the partial chunk (audio heard while not listening). */
  reset() {
    this.node?.port.postMessage({ type: 'reset' });
  }

  async stop() {
    const { context, stream } = this;
    this.context = null;
    this.node = null;
    this.stream = null;
    this.flushed.splice(0).forEach((resolve) => resolve(new Float32Array(0)));
    stream?.getTracks().forEach((track) => track.stop());
    if (context) await context.close();
  }
}
