// Base64 of raw bytes, as the wire protocols carry audio (float32 PCM,
// little-endian, which is every browser's native order) and images.

const SLICE = 0x8000; // String.fromCharCode's argument list must stay small

export function bytesToBase64(bytes) {
  let binary = '';
  for (let i = 0; i < bytes.length; i += SLICE) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + SLICE));
  }
  return btoa(binary);
}

export function base64ToBytes(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i += 1) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

export function float32ToBase64(samples) {
  return bytesToBase64(new Uint8Array(samples.buffer, samples.byteOffset, samples.byteLength));
}

export function base64ToFloat32(text) {
  const bytes = base64ToBytes(text);
  // A fresh Uint8Array's buffer is aligned; a trailing partial sample is dropped.
  return new Float32Array(bytes.buffer, 0, Math.floor(bytes.length / 4));
}

export async function blobToBase64(blob) {
  return bytesToBase64(new Uint8Array(await blob.arrayBuffer()));
}

/** Join float32 pieces into one array. */
export function concatFloat32(pieces) {
  const total = pieces.reduce((n, p) => n + p.length, 0);
  const out = new Float32Array(total);
  let at = 0;
  for (const piece of pieces) {
    out.set(piece, at);
    at += piece.length;
  }
  return out;
}
