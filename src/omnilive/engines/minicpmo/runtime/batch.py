"""Per-slot KV memory and batched steps of one transformers decoder, for many
sessions on one loaded model.

A live session owns a *slot*: a row of preallocated K/V buffers (every layer,
``capacity`` positions) and its own length. :class:`BatchedSteps` runs the new
positions of any subset of the live slots as one forward of the stock model
(e.g. ``Qwen3Model``): the rows are padded to the longest request, and three
per-row tensors make the batch equal to each session running alone:

- *positions*: row ``b``'s new positions are ``length[b] + i`` (RoPE ids), so
  each session keeps its own timeline whatever the others hold;
- *write index*: :meth:`SlotCache.update` scatters each row's new keys and
  values into its own slot at those positions; padding positions go to a
  scratch column past every slot's capacity, so they never touch a slot;
- *mask*: a 4D additive mask over the columns a step reads lets query ``i`` of
  row ``b`` see columns ``<= length[b] + min(i, count[b] - 1)``: its slot's
  cached positions and its own causal new ones. Leftovers past a slot's length
  (a released or cropped session's, the scratch column) are never visible.

Attention reads only the first *width* columns of the buffers: what the step's
longest row needs, rounded up to the cache's width bucket. It runs through
:func:`slot_attention` (registered with transformers as ``SLOT_ATTENTION``),
which hands the buffers' views to SDPA without transformers' ``repeat_kv`` and
``contiguous`` copies.

Nothing here is CUDA specific: the CPU tests hold it to transformers' eager
path. On a GPU the same :meth:`BatchedSteps.run` can be captured as one CUDA
graph per batch-size bucket, step length and width bucket, because every
per-step value lives in the :class:`StepPlan`'s packed numbers of its rows
(copied into a static tensor before a replay; the plan's other tensors are
derived from them within the graph) and a plan's shapes depend only on those
three. A plan can
be padded up to such a bucket: ``rows`` beyond the requests are *empty rows*
(no slot's positions, see :meth:`BatchedSteps.plan`), ``length`` beyond the
longest request pads every row; :mod:`omnilive.engines.minicpmo.runtime.graphs`
keeps the graphs. A *prefix* plan puts each request on the row of its own
slot and covers slots ``0 .. rows - 1`` with one view of the buffers, no
gather: the other rows of the prefix are empty rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.nn.utils.rnn import pad_sequence
from transformers.cache_utils import Cache

from omnilive.engines.minicpmo.runtime.attention import (
    SLOT_ATTENTION,
    attention_named,
    register_attention,
)
from omnilive.engines.minicpmo.runtime.step_plan import StepPlan

# Buffer widths and width buckets are multiples of this many columns: aligned
# masks for SDPA's fused kernels (the memory-efficient one pads others by copying).
ALIGN = 16


class SlotError(RuntimeError):
    """A slot used against its lifecycle (not live, released twice, none free)."""


class SlotOverflow(SlotError):
    """A step would write past a slot's capacity."""


class StepRequest(NamedTuple):
    """New positions for one live slot: token ids ``[n]`` or embeddings ``[n, hidden]``."""

    slot: int
    inputs: torch.Tensor


@dataclass(frozen=True)
class StepResult:
    """The last new position's hidden state ``[hidden]`` (after the final
    norm) and, with a head, its logits ``[vocab]``; for a program's step
    with a pick, the pick's value (:mod:`~omnilive.engines.minicpmo.runtime.programs`)."""

    slot: int
    hidden: torch.Tensor
    logits: torch.Tensor | None
    picked: Any = None


class SlotCache(Cache):
    """Static K/V buffers ``[slots + 1, kv_heads, columns, head_dim]`` per
    layer: a row per slot, and the idle row of empty rows (see :meth:`BatchedSteps.plan`).

    A transformers ``Cache``, so the model's own attention writes through
    :meth:`update`; which rows and columns a step touches comes from the
    :class:`StepPlan` bound by :class:`BatchedSteps` for that forward.

    A step reads the first :meth:`width_for` columns: its longest row's needs
    rounded up to a multiple of ``bucket`` (at most every column), so the cost
    of attention follows the live sessions' lengths, not the capacity, while
    :attr:`widths` stays a short list (one CUDA graph each)."""

    def __init__(
        self,
        config: Any,
        slots: int,
        capacity: int,
        *,
        bucket: int = 512,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if slots < 1 or capacity < 1:
            raise ValueError("a slot cache needs at least one slot and one position")
        if bucket < 1 or bucket % ALIGN:
            raise ValueError(f"a width bucket is a positive multiple of {ALIGN} columns")
        heads = config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        self.slots = slots
        self.capacity = capacity
        # One more column than a slot can fill: padding positions are written there.
        self.columns = _round_up(capacity + 1, ALIGN)
        self.scratch = self.columns - 1
        self.bucket = bucket
        # One more buffer row than slots, never acquired: the *idle row* that
        # empty rows of a padded plan read (its column 0, always zero) and
        # write (its scratch column), so they touch no slot.
        self.idle = slots
        shape = (config.num_hidden_layers, slots + 1, heads, self.columns, head_dim)
        # Every layer's buffer is a view of one tensor: a window's edit of a
        # slot (cache_edits.py) and a release are then one kernel over every
        # layer instead of one a layer.
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.key_cache = list(self.keys.unbind(0))
        self.value_cache = list(self.values.unbind(0))
        self.lengths = [0] * slots
        self._free = set(range(slots))
        self._plan: StepPlan | None = None

    # --- the slots' lifecycle --------------------------------------------------------

    def acquire(self, slot: int | None = None) -> int:
        """A free slot for a new session: ``slot`` if given (another cache's
        slot of the same session), else the lowest (batches of neighbouring
        slots read the buffers without a gather)."""
        if slot is None:
            if not self._free:
                raise SlotError(f"all {self.slots} slots are live")
            slot = min(self._free)
        elif slot not in self._free:
            raise SlotError(f"slot {slot} is not free")
        self._free.remove(slot)
        return slot

    def release(self, slot: int) -> None:
        """End a session: its slot is emptied, so the next owner inherits nothing."""
        self._check_live(slot)
        self.keys[:, slot].zero_()
        self.values[:, slot].zero_()
        self.lengths[slot] = 0
        self._free.add(slot)

    def crop(self, slot: int, length: int) -> None:
        """Keep the first ``length`` positions (a rolled-back turn); the rest
        is masked from now on and overwritten by the slot's next steps."""
        self._check_live(slot)
        if not 0 <= length <= self.lengths[slot]:
            raise ValueError(f"slot {slot} holds {self.lengths[slot]} positions, not {length}")
        self.lengths[slot] = length

    def is_live(self, slot: int) -> bool:
        return 0 <= slot < self.slots and slot not in self._free

    @property
    def widths(self) -> tuple[int, ...]:
        """Every width :meth:`width_for` answers, ascending."""
        return (*range(self.bucket, self.columns, self.bucket), self.columns)

    def width_for(self, needed: int) -> int:
        """The columns a step reads when its longest row needs ``needed``."""
        return min(_round_up(needed, self.bucket), self.columns)

    @property
    def nbytes_per_slot(self) -> int:
        return sum(buffer[0].nbytes for buffer in (*self.key_cache, *self.value_cache))

    def _check_live(self, slot: int) -> None:
        if not self.is_live(slot):
            raise SlotError(f"slot {slot} is not live")

    # --- one step ----------------------------------------------------------------------

    def check(self, slots: Sequence[int], counts: Sequence[int]) -> None:
        """Refuse a step before anything runs: nothing is written or counted."""
        if len(set(slots)) != len(slots):
            raise SlotError(f"a slot appears twice in one step: {list(slots)}")
        for slot, count in zip(slots, counts, strict=True):
            self._check_live(slot)
            if count < 1:
                raise ValueError(f"slot {slot}: a step needs at least one new position")
            if self.lengths[slot] + count > self.capacity:
                raise SlotOverflow(
                    f"slot {slot} holds {self.lengths[slot]} positions: {count} more would "
                    f"pass its capacity of {self.capacity}"
                )

    def bind(self, plan: StepPlan | None) -> None:
        self._plan = plan

    def commit(self, plan: StepPlan) -> None:
        """After the forward: each slot grows by its real positions only."""
        for slot, count in zip(plan.slots, plan.counts, strict=True):
            self.lengths[slot] += count

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        cache_kwargs: dict[str, Any] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scatter row ``b``'s new states ``[B, heads, L, dim]`` to its slot's
        columns ``plan.write[b]``; return the batch's view of the buffers
        ``[B, heads, plan.width, dim]``, which the plan's mask matches."""
        plan = self._plan
        if plan is None:
            raise SlotError("a SlotCache is written only inside BatchedSteps.run")
        keys, values = self.key_cache[layer_idx], self.value_cache[layer_idx]
        write_rows(keys, plan, key_states.transpose(1, 2))
        write_rows(values, plan, value_states.transpose(1, 2))
        return rows_view(keys, plan), rows_view(values, plan)

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        # Only a fallback for callers without explicit positions: the longest slot.
        return max(self.lengths)

    def get_max_cache_shape(self) -> int:
        return self.capacity


def write_rows(buffer: torch.Tensor, plan: StepPlan, states: torch.Tensor) -> None:
    """Row ``b``'s new states ``[B, L, heads, dim]`` into slot ``plan.rows[b]``
    of ``buffer`` at columns ``plan.write[b]``."""
    # Advanced indices on dims 0 and 2 put the [B, L] index dims first.
    buffer[plan.rows[:, None], :, plan.write] = states.to(buffer.dtype)


def rows_view(buffer: torch.Tensor, plan: StepPlan) -> torch.Tensor:
    if plan.prefix:
        # Empty rows read a slot here (column 0 only) but write the idle row.
        return buffer[: plan.batch, :, : plan.width]
    first = plan.slots[0]
    if not plan.gather and plan.slots == tuple(range(first, first + len(plan.slots))):
        # A view, no copy (strided when the width is under the buffer's: SDPA's
        # kernels need only the last dimension dense).
        return buffer[first : first + len(plan.slots), :, : plan.width]
    return buffer[:, :, : plan.width].index_select(0, plan.rows)


class BatchedSteps:
    """Batched forwards of ``backbone`` (a transformers base decoder such as
    ``Qwen3Model``) over the slots of ``cache``; ``head`` (optional, e.g. the
    LM head) maps each row's last hidden state to logits.

    ``attention`` names the attention function of these forwards:
    :data:`SLOT_ATTENTION`, :data:`GQA_SLOT_ATTENTION`, or ``None`` for the
    model's own (for comparisons: transformers' copies included).
    ``embedding`` is the table token ids go through (default: the backbone's
    input embeddings; the speech LM's tokens have a table of their own).
    ``decoder`` (a :class:`~omnilive.engines.minicpmo.runtime.fused_decoder.FusedDecoder`
    of ``backbone``) runs the forwards instead of the backbone's own code."""

    def __init__(
        self,
        backbone: Any,
        cache: SlotCache,
        head: Any = None,
        *,
        attention: str | None = SLOT_ATTENTION,
        embedding: Any = None,
        decoder: Any = None,
    ) -> None:
        register_attention()
        self.backbone = backbone
        self.decoder = decoder
        self.embedding = embedding if embedding is not None else backbone.get_input_embeddings()
        self.cache = cache
        self.head = head
        self.attention = attention
        param = next(backbone.parameters())
        self.device, self.dtype = param.device, param.dtype

    def step(self, requests: Iterable[tuple[int, torch.Tensor]]) -> list[StepResult]:
        """One forward over every request's new positions, in request order.
        Slots not named are neither read nor written."""
        requests = [StepRequest(*request) for request in requests]
        if not requests:
            return []
        plan = self.plan(requests)
        hidden, logits = self.run(self.embed(requests), plan)
        self.cache.commit(plan)
        return [
            StepResult(slot, hidden[b], None if logits is None else logits[b])
            for b, slot in enumerate(plan.slots)
        ]

    def any_width(self, length: int) -> int | None:
        """The width a step of ``length`` positions a row can always read,
        if it costs the same at every width: the buffers' every column where
        its attention reads only each row's own (the fused decoder's kernel),
        so that one CUDA graph serves it at every context length instead of
        one per width bucket, each captured while sessions wait the first
        time their contexts reach it. None: its width bucket."""
        if self.decoder is not None and self.decoder.reads_own_columns(length):
            return self.cache.columns
        return None

    def plan(
        self,
        requests: Sequence[StepRequest],
        *,
        width: int | None = None,
        rows: int | None = None,
        length: int | None = None,
        gather: bool = False,
        prefix: bool = False,
    ) -> StepPlan:
        """The step's tensors, after the cache accepted it. Attention reads
        ``width`` columns: by default the width bucket of the longest row's
        needs; a wider one (a CUDA graph's) reads more masked columns.

        ``rows`` (a batch-size bucket, at least the requests) appends *empty
        rows*: zero new positions of no slot. Each reads only column 0 of the
        cache's idle row (zeros: never a fully masked row), writes only that
        row's scratch column, and its output is not a result. ``length`` (a
        step-length bucket, at least the longest request) pads every row.
        ``gather`` reads through an index of rows even for neighbouring slots.
        ``prefix`` puts each request on the row of its slot and reads slots
        ``0 .. rows - 1`` as one view: every other row of it is an empty row,
        which reads column 0 of its slot and still writes only the idle row."""
        slots = tuple(int(request.slot) for request in requests)
        counts = tuple(int(request.inputs.shape[0]) for request in requests)
        self.cache.check(slots, counts)  # empty rows are no request: never checked
        held = [self.cache.lengths[slot] for slot in slots]
        longest = max(counts)
        width_rows = rows or (max(slots) + 1 if prefix else len(slots))
        index = slots if prefix else tuple(range(len(slots)))
        if width_rows < max(index) + 1 or (length or longest) < longest:
            raise ValueError(
                f"a plan of {rows} rows and {length} positions cannot hold "
                f"{len(slots)} requests of up to {longest}"
            )
        longest = length or longest
        # Every row's last new position is column needed - 1 or before: a
        # narrower read would hide it (needed <= capacity < columns).
        needed = max(n + c for n, c in zip(held, counts, strict=True))
        if width is None:
            width = self.cache.width_for(needed)
        elif not needed <= width <= self.cache.columns:
            raise ValueError(
                f"a step needing {needed} columns cannot read {width} "
                f"(the buffers hold {self.cache.columns})"
            )
        # An empty row counts as one position at column 0 of the row it reads
        # (the idle row's, or in a prefix its slot's), and writes it to the
        # idle row's scratch column like any padding position.
        row_held, row_counts = [0] * width_rows, [1] * width_rows
        row_slots = [self.cache.idle] * width_rows
        for k, row in enumerate(index):
            row_held[row], row_counts[row], row_slots[row] = held[k], counts[k], slots[k]
        # The rows' numbers cross to the device as one queued copy: a blocking
        # copy per list would wait each time for everything on the stream.
        packed = torch.tensor(
            [[slot == self.cache.idle for slot in row_slots], row_held, row_counts, row_slots]
        ).to(self.device, non_blocking=True)
        return StepPlan(
            slots=slots,
            counts=counts,
            width=width,
            length=longest,
            packed=packed,
            scratch=self.cache.scratch,
            dtype=self.dtype,
            gather=not prefix and (gather or width_rows > len(slots)),
            prefix=prefix,
            index=index,
        )

    def embed(
        self,
        requests: Sequence[StepRequest],
        *,
        rows: int | None = None,
        length: int | None = None,
        index: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """``[B, L, hidden]``: token ids through the model's embedding table,
        embeddings as given, zero padding after each row's real positions (to
        ``length``) and as the empty rows up to ``rows`` (see :meth:`plan`);
        request ``k`` on row ``index[k]`` (a plan's :attr:`StepPlan.index`)."""
        with torch.no_grad():  # inputs, never differentiated: no history to keep
            ids = [request.inputs for request in requests if not request.inputs.is_floating_point()]
            looked_up = iter(self._look_up(ids))
            embedded = [
                next(looked_up)
                if not request.inputs.is_floating_point()
                else request.inputs.to(self.device, self.dtype)
                for request in requests
            ]
        padded = pad_sequence(embedded, batch_first=True)
        wide, long = rows or padded.shape[0], length or padded.shape[1]
        in_order = index is None or tuple(index) == tuple(range(len(requests)))
        if in_order and (wide, long) == padded.shape[:2]:
            return padded
        out = padded.new_zeros(wide, long, padded.shape[2])
        if in_order:
            out[: padded.shape[0], : padded.shape[1]] = padded
        else:
            out[list(index), : padded.shape[1]] = padded  # type: ignore[arg-type]  # not None: in_order when index is None
        return out

    def _look_up(self, ids: list[torch.Tensor]) -> Sequence[torch.Tensor]:
        """Each request's token ids through the embedding table, all in one
        lookup; ids on the CPU cross to the device as one queued copy (a
        blocking copy per request would wait for the stream each time)."""
        if not ids:
            return []
        if any(row.device != ids[0].device for row in ids):
            return [self.embedding(row.to(self.device)) for row in ids]
        joined = torch.cat(ids).to(self.device, non_blocking=True)
        return self.embedding(joined).split([int(row.shape[0]) for row in ids])

    def run(self, embeds: torch.Tensor, plan: StepPlan) -> tuple[torch.Tensor, Any]:
        """The forward alone: each row's last real hidden state ``[B, hidden]``
        and, with a head, its logits. Writes the new positions into the slots
        but does not count them (:meth:`SlotCache.commit` does).

        This is what a CUDA graph per batch-size bucket, step length and width
        bucket captures (:class:`~omnilive.engines.minicpmo.runtime.graphs.GraphCache`),
        over a plan whose tensors are copied in before each replay: padded with
        empty rows, and either a prefix of the slots (one view of the buffers)
        or read through the gather (``index_select`` in :meth:`SlotCache.update`),
        so that one graph serves any slots of its shape."""
        # No autograd history: the buffers are written in place every step.
        if self.decoder is not None:
            with torch.no_grad():
                hidden = self.decoder.forward(embeds, plan, self.cache)
                return hidden, (self.head(hidden) if self.head is not None else None)
        with torch.no_grad(), attention_named(self.backbone.config, self.attention):
            self.cache.bind(plan)
            try:
                out = self.backbone(
                    inputs_embeds=embeds,
                    attention_mask=plan.mask,
                    position_ids=plan.positions,
                    past_key_values=self.cache,
                    # Only handed to cache.update, which places rows by plan.write.
                    cache_position=torch.arange(embeds.shape[1], device=embeds.device),
                    use_cache=True,
                    return_dict=True,
                )
            finally:
                self.cache.bind(None)
            rows = torch.arange(embeds.shape[0], device=embeds.device)
            hidden = out.last_hidden_state[rows, plan.last]
            return hidden, (self.head(hidden) if self.head is not None else None)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple
