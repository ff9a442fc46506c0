"""Stand-in for librosa: importable, unusable."""


def __getattr__(name):
    raise ImportError(f"librosa.{name}: librosa is a stand-in in this benchmark")
