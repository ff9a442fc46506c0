"""Reference voices: uploads decoded with ffmpeg and stored under the data dir,
speech made with espeak-ng (presets, the default sample), and the engine's
default voice."""
