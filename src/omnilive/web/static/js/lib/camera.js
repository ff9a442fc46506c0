// The camera: a live preview and JPEG stills grabbed through a canvas, one
// per duplex unit. Frames are scaled down before encoding because the model
// sees a few hundred pixels anyway and every byte crosses the network.

export class Camera {
  constructor(video) {
    this.video = video;
    this.stream = null;
    this.facing = 'user';
    this.canvas = document.createElement('canvas');
  }

  get running() {
    return this.stream !== null;
  }

  async start(facing = this.facing) {
    this.stop();
    this.facing = facing;
    this.stream = await navigator.mediaDevices.getUserMedia({
      video: { facingMode: facing, width: { ideal: 1280 }, height: { ideal: 720 } },
      audio: false,
    });
    this.video.srcObject = this.stream;
    this.video.muted = true;
    this.video.playsInline = true;
    await this.video.play();
  }

  /** Switch between the front and back cameras (phones). */
  async flip() {
    await this.start(this.facing === 'user' ? 'environment' : 'user');
  }

  /**
   * The current picture as base64 JPEG (no data: prefix), its longer side at
   * most `maxSide` pixels; null before the first frame has arrived.
   */
  grab(maxSide = 640, quality = 0.8) {
    const { videoWidth: w, videoHeight: h } = this.video;
    if (!this.stream || !w || !h) return null;
    const scale = Math.min(1, maxSide / Math.max(w, h));
    this.canvas.width = Math.round(w * scale);
    this.canvas.height = Math.round(h * scale);
    this.canvas.getContext('2d').drawImage(this.video, 0, 0, this.canvas.width, this.canvas.height);
    const url = this.canvas.toDataURL('image/jpeg', quality);
    return url.slice(url.indexOf(',') + 1);
  }

  stop() {
    this.stream?.getTracks().forEach((track) => track.stop());
    this.stream = null;
    this.video.srcObject = null;
  }
}
