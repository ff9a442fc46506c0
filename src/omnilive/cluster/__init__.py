"""omnilive on a Ray cluster (``omnilive serve --ray``, ``omnilive gateway --ray``).

Workers run as Ray actors, one per GPU (or ``--workers`` CPU actors), each
serving the worker's internal WebSocket API on its node; Ray restarts one that
dies. One registry actor holds the FIFO queue (the gateway's own
:class:`~omnilive.gateway.pool.Pool` and scheduler), watches every worker's
control channel, and places workers as GPUs join. Every gateway talks to it
through :class:`~omnilive.cluster.remote_pool.ClusterPool`, so a client's
position, wait estimate and cancellation are the same whichever gateway it
reached.

Ray is optional (``pip install 'omnilive[ray]'``) and imported only here,
lazily (:mod:`omnilive.cluster.ray_api`).
"""
