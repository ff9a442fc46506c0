"""What transformers' check of a checkpoint's own code needs that the code does not.

``trust_remote_code`` runs ``check_imports`` over each model file before it
imports it: every module named in an ``import`` statement must be importable,
whatever ``if`` the statement sits under. MiniCPM-o 4.5's
``modeling_minicpmo.py`` imports ``flag_gems`` (FlagOS kernels) only when
``USE_FLAGOS=1``, so a checkpoint with that file refuses to load wherever
flag_gems is not installed, though the code would never import it. While the
checkpoint loads, :func:`optional_imports_stood_in` puts an empty module in
such a package's place (not where its switch is on, nor where it is
installed) and takes it away again after.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import types
from collections.abc import Iterator

# A package the model code imports only under an environment switch: its name
# and the variable that must be "1" for the code to import it.
SWITCHED_IMPORTS = {"flag_gems": "USE_FLAGOS"}


@contextlib.contextmanager
def optional_imports_stood_in(
    switched: dict[str, str] = SWITCHED_IMPORTS,
) -> Iterator[list[str]]:
    """Empty modules for the ``switched`` packages that are absent and
    switched off, for the duration; yields the names stood in for."""
    placed = []
    for name, switch in switched.items():
        if os.environ.get(switch) == "1" or name in sys.modules:
            continue
        if importlib.util.find_spec(name) is not None:
            continue
        module = types.ModuleType(name, f"omnilive: absent; imported only with {switch}=1")
        sys.modules[name] = module
        placed.append(name)
    try:
        yield placed
    finally:
        for name in placed:
            sys.modules.pop(name, None)
