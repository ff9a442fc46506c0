// Audio files (WAV, MP3, OGG, WebM, M4A: whatever the browser decodes) to the
// protocols' input format, mono float32 at 16 kHz.

export const INPUT_RATE = 16000;

export async function decodeTo16k(data) {
  // decodeAudioData resamples to its context's rate, so a 16 kHz offline
  // context does the resampling with the browser's own high-quality filter.
  const context = new OfflineAudioContext(1, 1, INPUT_RATE);
  const bytes = data instanceof Blob ? await data.arrayBuffer() : data;
  const decoded = await context.decodeAudioData(bytes);
  const mono = new Float32Array(decoded.length);
  for (let c = 0; c < decoded.numberOfChannels; c += 1) {
    const channel = decoded.getChannelData(c);
    for (let i = 0; i < mono.length; i += 1) mono[i] += channel[i] / decoded.numberOfChannels;
  }
  return mono;
}
