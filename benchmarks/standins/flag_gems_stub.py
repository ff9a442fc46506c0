"""An empty ``flag_gems``: the checkpoint's modeling_minicpmo.py imports it only
when ``USE_FLAGOS=1``, but transformers refuses remote code whose imports are
missing, conditional ones too. Never imported with that variable unset."""
