"""The chats' prompts as embeddings, every prompt waiting for the encoders'
lane in one call.

A chat or half-duplex message (:meth:`SlotSimplex.prefill
<omnilive.engines.minicpmo.sessions.simplex.session.SlotSimplex.prefill>`) becomes
embeddings as the model code makes them: its text and images through
``get_vllm_embedding``, its recording through ``get_audio_embedding`` (the
whole recording at once, as ``get_omni_embedding`` does when not streaming),
placed over the prompt's audio placeholders. Whisper at batch 1 is bound by
kernel launches, not arithmetic (about 23 ms a prompt on an H200), so eight
chats arriving together waited ~200 ms for the last one's turn. Here the
recordings of every prompt in the call go through ``get_audio_embedding``
together, the prompts whose features have the same width as ONE batch: the
model code's own batched call over them, whose padding is that of each
prompt alone, so each prompt's audio is what it would be encoded alone (the
batch's size aside, which moves bf16 sums as any batching does). Prompts of
different widths go in a call each (padding one to another's width would
change its last frames through Whisper's convolutions).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omnilive.engines.minicpmo.sessions.encoders.units import Failed

if TYPE_CHECKING:
    from omnilive.engines.minicpmo.sessions.shared import SharedModel

PROMPT_KEY = "prompt"  # the encoders' lane's gather key for prompt_embeddings


def prompt_inputs(
    shared: SharedModel,
    prompt: str,
    images: list[Any],
    audios: list[np.ndarray],
    max_slice_nums: int | None,
    *,
    first: bool,
) -> Any:
    """The processor's inputs for ``prompt`` (CPU work; ``first``: the
    conversation's first, which opens with the special tokens). A
    recording's features are made in the extractor's mode as loaded (the
    duplex sessions' streaming processors switch theirs as their audio
    grows), on :meth:`SharedModel.recordings_processor`."""
    with shared.recordings_processor() as processor:
        return processor(
            [prompt],
            [images],
            [audios],
            max_slice_nums=1 if max_slice_nums is None else max_slice_nums,
            use_image_id=False,
            chunk_input=True,
            return_tensors="pt",
            max_length=None,
            sampling_rate=16000,
            add_special_tokens=first,
            online_streaming=False,
        )


def prompt_embeddings(shared: SharedModel, batch: list[Any]) -> list[torch.Tensor | Failed]:
    """Per processor output of ``batch`` (one prompt each): its ``[n, hidden]``
    embeddings, or what it failed with. A failure stays with its prompt: one
    that cannot move to the GPU, or whose width group's Whisper call fails
    (that group's prompts are then encoded one by one), fails alone."""
    model = shared.model
    moved = [_moved(inputs, shared.device) for inputs in batch]
    recordings = _recordings(model, moved)
    results: list[torch.Tensor | Failed] = []
    for index, inputs in enumerate(moved):
        clips = recordings.get(index)
        failed = inputs if isinstance(inputs, Failed) else clips
        if isinstance(failed, Failed):
            results.append(failed)
            continue
        try:
            with torch.no_grad():
                embeds, _ = model.get_vllm_embedding(inputs)
                if clips is not None:
                    _place(embeds[0], clips, inputs["audio_bounds"][0])
            results.append(embeds[0])
        except Exception as exc:  # that session's to handle
            results.append(Failed(exc))
    return results


def _moved(inputs: Any, device: torch.device) -> Any:
    try:
        return inputs.to(device)
    except Exception as exc:
        return Failed(exc)


Clips = list[torch.Tensor]


def _recordings(model: Any, batch: list[Any]) -> dict[int, Clips | Failed]:
    """Per prompt of ``batch`` with audio: its clips' embeddings, in order;
    one ``get_audio_embedding`` call per width of features, and where a
    group's call fails, one per prompt of it."""
    by_width: defaultdict[int, list[int]] = defaultdict(list)
    for index, inputs in enumerate(batch):
        features = [] if isinstance(inputs, Failed) else inputs.get("audio_features", [])
        if len(features) > 0:
            by_width[int(features.shape[-1])].append(index)
    made: dict[int, Clips | Failed] = {}
    for indices in by_width.values():
        try:
            made.update(zip(indices, _clips(model, [batch[i] for i in indices]), strict=True))
        except Exception as exc:
            if len(indices) == 1:
                made[indices[0]] = Failed(exc)
                continue
            for index in indices:  # which of them failed it: each alone
                try:
                    made[index] = _clips(model, [batch[index]])[0]
                except Exception as alone:
                    made[index] = Failed(alone)
    return made


def _clips(model: Any, prompts: list[Any]) -> list[Clips]:
    """The model code's batched ``get_audio_embedding`` over ``prompts``'
    features (of one width): each prompt's clips."""
    data = {
        "audio_features": torch.cat([inputs["audio_features"] for inputs in prompts], 0),
        "audio_feature_lens": [inputs["audio_feature_lens"][0] for inputs in prompts],
    }
    with torch.no_grad():
        return list(model.get_audio_embedding(data, chunk_length=-1))


def _place(embeds: torch.Tensor, clips: list[torch.Tensor], bounds: Any) -> None:
    """The clips' embeddings, one after another, over the prompt's audio
    placeholders (``bounds``: start and end positions, in order), as the
    model code places them; a prompt whose placeholders do not hold exactly
    its embeddings is refused (the model code would raise or misplace)."""
    audio = torch.cat(clips, 0).to(embeds.dtype)
    spans = [(int(start), int(end)) for start, end in bounds]
    if sum(end - start for start, end in spans) != int(audio.shape[0]):
        raise ValueError(
            f"the prompt's {len(spans)} audio placeholders do not hold its "
            f"{int(audio.shape[0])} audio embeddings"
        )
    at = 0
    for start, end in spans:
        embeds[start:end] = audio[at : at + end - start]
        at += end - start
