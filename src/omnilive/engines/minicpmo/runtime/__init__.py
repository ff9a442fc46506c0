"""The batched runtime at the bottom of the GPU engine: per-slot caches
(``batch``), their attention (``attention``), the fused decoder and its
kernels, CUDA graphs per bucket (``graphs``, ``block_graphs``), the loop
(``plan`` -> ``execute`` -> ``loop``) and the lanes beside it. It knows slots,
rows and programs, not what a unit or an answer is: it imports nothing
above it (tests/minicpmo/test_layers.py)."""
