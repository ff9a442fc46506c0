"""Settings every test process needs before anything is imported."""

import os
import shutil

# The minicpmo engine's Triton kernels run in Triton's interpreter on a
# machine without a GPU. Triton decides that for every @triton.jit function
# (its own, such as tl.sum, included) when it is first imported, which
# transformers' import of torch._dynamo does long before the kernels' module.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")
