"""Presets per mode: YAML files shipped in ``builtin/`` plus operators' folders."""
