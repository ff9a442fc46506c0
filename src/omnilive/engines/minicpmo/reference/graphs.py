"""CUDA graphs for the short transformer steps of the model's sessions.

The model's code runs its transformers one step at a time: in a duplex unit
the LLM once per spoken token and once or twice for the unit's markers (its
``StreamDecoder.feed``), in a chat or half-duplex answer the LLM once per
token (its chunked generation), and the speech LM once per speech token. On
a GPU as fast as an H100 each such step is bound by Python and kernel
launches, not by the GPU: about 50 ms for one token of the 8B LLM, of which
the GPU needs a few.

:class:`StepGraphs` replays those steps from CUDA graphs. A graph runs the
same module (a transformers base model, e.g. ``Qwen3Model``) on a static KV
cache that mirrors the caller's ``DynamicCache``:

- after a graph step, every layer of the dynamic cache is a *view* of the
  static buffers (``buffer[:, :, :length]``), so the model code that reads,
  slices, crops or replaces cache tensors keeps working unchanged;
- before a graph step, a layer that is no longer such a view (an eager
  forward appended to it, the model cut or rebuilt it) is copied back into the
  buffer, so the mirror never serves stale keys;
- positions past the cache's length hold leftovers, masked out by the causal
  mask transformers builds from ``cache_position`` for its static cache.

Anything else (a step longer than ``max_tokens``, no cache yet, a cache that
would outgrow ``max_capacity``, arguments the graph does not model) runs the
model's own code. One graph is captured per step length; they share the
buffers and one memory pool. When the cache outgrows the buffers they are
reallocated twice as large and the graphs are captured again.
"""

from __future__ import annotations

import logging
import time
import types
from collections import OrderedDict
from typing import Any

log = logging.getLogger(__name__)


class StepGraphs:
    """Graph-replayed steps of one transformers base model over a static
    mirror of a ``DynamicCache``. ``head`` (optional) maps the last position's
    hidden state to logits inside the graph."""

    def __init__(
        self,
        backbone: Any,
        head: Any = None,
        *,
        name: str = "llm",
        max_tokens: int = 128,
        initial_capacity: int = 1024,
        max_capacity: int = 32768,
        max_graphs: int = 8,
        capture: bool | None = None,
    ) -> None:
        import torch

        self.torch = torch
        self.backbone = backbone
        self.head = head
        self.name = name
        self.max_tokens = max_tokens
        self.initial_capacity = initial_capacity
        self.max_capacity = max_capacity
        self.max_graphs = max_graphs
        self.capacity = 0
        self.cache: Any = None  # transformers StaticCache: the buffers
        self.graphs: OrderedDict[int, _Graph] = OrderedDict()
        self.pool: Any = None
        # Step lengths seen so far: a length is captured on its second use, so
        # one-off steps (a system prompt's parts) do not evict the unit's.
        self.seen: dict[int, int] = {}
        param = next(backbone.parameters())
        self.device, self.dtype = param.device, param.dtype
        # Without CUDA graphs (a CPU, or tests) every step runs the same
        # static-cache forward eagerly: the mirror logic is the same.
        self.capture = self.device.type == "cuda" if capture is None else capture
        self.active = True  # False: every step runs eagerly
        self.replays = 0
        self.fallbacks = 0
        self.syncs = 0
        self.captures = 0
        self.capture_ms = 0.0

    def step(self, dynamic: Any, embeds: Any, position: Any = None) -> _Graph | None:
        """Run ``embeds`` ([1, L, H]) after ``dynamic``'s contents; the first
        new position is ``position`` (an int or a 0-d device tensor; default:
        the cache length). Returns the graph, whose ``hidden`` / ``logits``
        hold the result until the next step, or None to run eagerly."""
        # The model's weights require grad and its callers do not always turn
        # it off: without this, copying inputs into the static buffers would
        # chain every step's autograd history (and its activations) forever.
        with self.torch.no_grad():
            return self._step(dynamic, embeds, position)

    def _step(self, dynamic: Any, embeds: Any, position: Any) -> _Graph | None:
        length = int(embeds.shape[1])
        if (
            not self.active
            or length > self.max_tokens
            or dynamic is None
            or not getattr(dynamic, "key_cache", None)
            or embeds.shape[0] != 1
        ):
            return None
        past = int(dynamic.key_cache[0].shape[2])
        if past == 0 or past + length > self.max_capacity:
            return None
        if length not in self.graphs:
            if len(self.seen) > 4 * self.max_tokens:
                self.seen.clear()
            self.seen[length] = self.seen.get(length, 0) + 1
            if self.seen[length] < 2:
                return None
        if past + length > self.capacity:
            self._allocate(past + length)
        graph = self._graph(length)
        self._sync(dynamic, past)
        graph.run(embeds, past, past if position is None else position)
        self._expose(dynamic, past + length)
        self.replays += 1
        return graph

    def release(self) -> None:
        """After a session: a cache grown past the initial size gives its
        memory back (the next step allocates and captures again)."""
        if self.capacity > self.initial_capacity:
            self.graphs.clear()
            self.pool = None
            self.cache = None
            self.capacity = 0

    def stats(self) -> dict[str, float]:
        return {
            "capacity": self.capacity,
            "graphs": len(self.graphs),
            "replays": self.replays,
            "fallbacks": self.fallbacks,
            "syncs": self.syncs,
            "captures": self.captures,
            "capture_ms": round(self.capture_ms, 1),
        }

    # --- the static cache ------------------------------------------------------------------

    def _allocate(self, needed: int) -> None:
        from transformers import StaticCache

        capacity = max(self.initial_capacity, self.capacity)
        while capacity < needed:
            capacity *= 2
        self.graphs.clear()
        self.pool = None
        self.cache = None
        # Normal tensors even when the caller runs in inference mode (the
        # simplex views do): the buffers are updated in place later, outside it.
        with self.torch.inference_mode(False):
            self.cache = StaticCache(
                config=self.backbone.config,
                max_batch_size=1,
                max_cache_len=min(capacity, self.max_capacity),
                device=self.device,
                dtype=self.dtype,
            )
        self.capacity = min(capacity, self.max_capacity)
        log.info("%s step graphs: a static KV cache of %d positions", self.name, self.capacity)

    def _sync(self, dynamic: Any, past: int) -> None:
        """Copy every layer that is not already a view of the buffers."""
        static = self.cache
        layers = zip(
            [*dynamic.key_cache, *dynamic.value_cache],
            [*static.key_cache, *static.value_cache],
            strict=True,
        )
        copied = False
        for tensor, buffer in layers:
            if not _is_prefix_view(tensor, buffer, past):
                buffer[:, :, :past].copy_(tensor)
                copied = True
        if copied:
            self.syncs += 1

    def _expose(self, dynamic: Any, length: int) -> None:
        """Make the dynamic cache's layers views of the first ``length`` positions."""
        static = self.cache
        dynamic.key_cache = [buffer[:, :, :length] for buffer in static.key_cache]
        dynamic.value_cache = [buffer[:, :, :length] for buffer in static.value_cache]
        if hasattr(dynamic, "_seen_tokens"):
            dynamic._seen_tokens = length

    def _graph(self, length: int) -> _Graph:
        graph = self.graphs.get(length)
        if graph is not None:
            self.graphs.move_to_end(length)
            return graph
        if len(self.graphs) >= self.max_graphs:
            self.graphs.popitem(last=False)
        if self.pool is None and self.capture:
            self.pool = self.torch.cuda.graph_pool_handle()
        started = time.perf_counter()
        # Its static tensors are normal ones too (see _allocate). Leaving
        # inference mode turns grad mode back on: capturing with it on would
        # pin every activation of the step for a backward pass.
        with self.torch.inference_mode(False), self.torch.no_grad():
            graph = _Graph(self, length)
        elapsed_ms = (time.perf_counter() - started) * 1000
        self.captures += 1
        self.capture_ms += elapsed_ms
        self.graphs[length] = graph
        log.info(
            "%s step graphs: captured a %d-position step in %.0f ms", self.name, length, elapsed_ms
        )
        return graph


class _Graph:
    """One captured step of ``length`` positions, with its static inputs and outputs."""

    def __init__(self, owner: StepGraphs, length: int) -> None:
        torch = owner.torch
        self.owner = owner
        hidden_size = owner.backbone.config.hidden_size
        self.embeds = torch.zeros((1, length, hidden_size), dtype=owner.dtype, device=owner.device)
        self.offsets = torch.arange(length, device=owner.device)
        self.cache_position = self.offsets.clone()
        self.positions = self.offsets.clone()
        self.hidden: Any = None
        self.logits: Any = None
        self.graph: Any = None
        if owner.capture:
            self._capture(length)

    def _capture(self, length: int) -> None:
        torch = self.owner.torch
        owner = self.owner
        # Capturing needs warm-up runs on a side stream, and they write keys
        # into the buffers. They write at the buffers' tail, which is kept
        # aside and put back: the live cache may be a view of the buffers.
        cache = owner.cache
        tail = owner.capacity - length
        self.cache_position.copy_(self.offsets + tail)
        self.positions.copy_(self.cache_position)
        buffers = [*cache.key_cache, *cache.value_cache]
        kept = [buffer[:, :, tail:].clone() for buffer in buffers]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # (step() turned autograd off: nothing is recorded)
            self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=owner.pool):
            self.hidden, self.logits = self._forward()
        for buffer, saved in zip(buffers, kept, strict=True):
            buffer[:, :, tail:].copy_(saved)

    def _forward(self) -> tuple[Any, Any]:
        owner = self.owner
        # The model's own forward, not a hook installed over it.
        forward = getattr(owner.backbone, "_omnilive_eager_forward", owner.backbone)
        out = forward(
            inputs_embeds=self.embeds,
            position_ids=self.positions.unsqueeze(0),
            cache_position=self.cache_position,
            past_key_values=owner.cache,
            use_cache=True,
            return_dict=True,
        )
        hidden = out.last_hidden_state
        return hidden, (owner.head(hidden[:, -1]) if owner.head is not None else None)

    def run(self, embeds: Any, past: int, position: Any) -> None:
        torch = self.owner.torch
        self.embeds.copy_(embeds)
        torch.add(self.offsets, past, out=self.cache_position)
        # A tensor position stays on the device: no sync to read it.
        torch.add(self.offsets, position, out=self.positions)
        if self.graph is not None:
            self.graph.replay()
        else:
            self.hidden, self.logits = self._forward()


def _is_prefix_view(tensor: Any, buffer: Any, length: int) -> bool:
    """``tensor`` is ``buffer[:, :, :length]`` (same storage, start and strides)."""
    return (
        tensor.data_ptr() == buffer.data_ptr()
        and tensor.stride() == buffer.stride()
        and tensor.shape[2] == length
    )


# --- where the model's code meets the graphs -----------------------------------------------


def install_decoder_graphs(decoder: Any, graphs: StepGraphs) -> None:
    """Route the duplex ``StreamDecoder.feed(embeds [L, H], return_logits)``
    through ``graphs`` (built over ``decoder.m.model`` with ``lm_head``).
    Idempotent; the decoder's own ``feed`` runs whatever the graphs decline."""
    if getattr(decoder, "_omnilive_graphs", None) is graphs:
        return
    eager = getattr(decoder, "_omnilive_eager_feed", decoder.feed)

    def feed(self: Any, embeds: Any, return_logits: bool = False) -> Any:
        graph = graphs.step(self.cache, embeds.unsqueeze(0))
        if graph is None:
            graphs.fallbacks += graphs.active
            return eager(embeds, return_logits=return_logits)
        if return_logits:
            # Static outputs: the next replay overwrites them, callers keep these.
            return graph.logits.clone(), graph.hidden.clone()
        return None

    decoder._omnilive_eager_feed = eager
    decoder.feed = types.MethodType(feed, decoder)
    decoder._omnilive_graphs = graphs


def install_backbone_graphs(backbone: Any, graphs: StepGraphs) -> None:
    """Route one-call steps of a transformers base model (the speech LM's
    ``LlamaModel``) through ``graphs`` where the call is a plain cached step:
    embeddings in, an existing ``DynamicCache``, explicit positions, nothing
    but the last hidden state and the cache wanted back."""
    if getattr(backbone, "_omnilive_graphs", None) is graphs:
        return
    eager = getattr(backbone, "_omnilive_eager_forward", backbone.forward)
    from transformers.modeling_outputs import BaseModelOutputWithPast

    plain = {"use_cache": True, "output_attentions": False, "return_dict": True}

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        if args:
            graphs.fallbacks += graphs.active
            return eager(*args, **kwargs)
        embeds = kwargs.get("inputs_embeds")
        positions = kwargs.get("position_ids")
        cache = kwargs.get("past_key_values")
        extra = set(kwargs) - {"inputs_embeds", "position_ids", "past_key_values", *plain}
        simple = (
            embeds is not None
            and positions is not None
            and kwargs.get("input_ids") is None
            and not extra
            and all(kwargs.get(name, value) in (value, None) for name, value in plain.items())
        )
        graph = graphs.step(cache, embeds, positions[0, 0]) if simple else None
        if graph is None:
            graphs.fallbacks += graphs.active
            return eager(**kwargs)
        hidden = graph.hidden.clone()  # static: the next replay overwrites it
        return BaseModelOutputWithPast(last_hidden_state=hidden, past_key_values=cache)

    backbone._omnilive_eager_forward = eager
    backbone.forward = types.MethodType(forward, backbone)
    backbone._omnilive_graphs = graphs


def install_causal_lm_graphs(llm: Any, graphs: StepGraphs) -> None:
    """Route the simplex views' LLM steps (the model's chunked generation
    calls ``llm(inputs_embeds=..., past_key_values=cache, use_cache=True,
    output_hidden_states=...)`` once per token) through ``graphs``, built over
    ``llm.model`` with ``lm_head``. Such a caller reads the last position's
    logits and the last hidden states; other calls run the model's own code."""
    if getattr(llm, "_omnilive_graphs", None) is graphs:
        return
    eager = getattr(llm, "_omnilive_eager_forward", llm.forward)
    from transformers.modeling_outputs import CausalLMOutputWithPast

    accepted = {
        "inputs_embeds",
        "past_key_values",
        "use_cache",
        "output_hidden_states",
        "output_attentions",
        "return_dict",
    }

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        embeds = kwargs.get("inputs_embeds")
        simple = (
            not args
            and embeds is not None
            and set(kwargs) <= accepted
            and kwargs.get("use_cache") in (True, None)
            and not kwargs.get("output_attentions")
            and kwargs.get("return_dict") in (True, None)
        )
        graph = graphs.step(kwargs.get("past_key_values"), embeds) if simple else None
        if graph is None:
            graphs.fallbacks += graphs.active
            return eager(*args, **kwargs)
        # Static outputs, cloned: the next replay overwrites them. Only the last
        # position's logits and the last layer's states exist; the callers read
        # ``logits[:, -1]`` and ``hidden_states[-1]``.
        hidden = graph.hidden.clone()
        return CausalLMOutputWithPast(
            logits=graph.logits.clone().unsqueeze(1),
            past_key_values=kwargs["past_key_values"],
            hidden_states=(hidden,) if kwargs.get("output_hidden_states") else None,
        )

    llm._omnilive_eager_forward = eager
    llm.forward = types.MethodType(forward, llm)
    llm._omnilive_graphs = graphs


class ModelGraphs:
    """The graphs of one loaded MiniCPM-o: its LLM's short steps (the duplex
    decoder's ``feed`` and the simplex views' chunked generation) and its
    speech LM's one-token steps. Active only between :meth:`attach` (a
    session starts) and :meth:`release` (it ends)."""

    def __init__(self, model: Any) -> None:
        llm = model.llm
        # 4096 positions (~600 MB) hold about 50 s of omni units before the
        # buffers grow (and every graph is captured again).
        self.llm = StepGraphs(llm.model, llm.lm_head, name="llm", initial_capacity=4096)
        install_causal_lm_graphs(llm, self.llm)
        speech_lm = getattr(getattr(model, "tts", None), "model", None)
        self.tts: StepGraphs | None = None
        if speech_lm is not None:
            self.tts = StepGraphs(speech_lm, name="tts", max_tokens=1)
            install_backbone_graphs(speech_lm, self.tts)
        self._set_active(False)

    def attach(self, duplex: Any = None) -> None:
        """Before a session; a duplex session's decoder (it may be a new
        object) is hooked too."""
        decoder = getattr(duplex, "decoder", None)
        if decoder is not None and hasattr(decoder, "feed"):
            install_decoder_graphs(decoder, self.llm)
        self._set_active(True)

    def release(self) -> None:
        self._set_active(False)
        for graphs in self._all():
            graphs.release()

    def stats(self) -> dict[str, dict[str, float]]:
        return {graphs.name: graphs.stats() for graphs in self._all()}

    def _all(self) -> list[StepGraphs]:
        return [self.llm, *([self.tts] if self.tts is not None else [])]

    def _set_active(self, active: bool) -> None:
        for graphs in self._all():
            graphs.active = active
