"""The tiny model's tokenizer: a byte-level BPE trained here, at import,
on a fixed corpus (deterministic, a second on any CPU), with MiniCPM-o's
special tokens and a chat template that writes messages and tools as the
model's own template does (as ``sessions/simplex_history.py`` restates it)."""

from __future__ import annotations

import functools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# Tokens the engine looks up by name (DuplexVocab, SimplexVocab, the prompts).
SPECIAL = [
    "<unk>", "<|im_start|>", "<|im_end|>", "</s>", "<|endoftext|>",
    "<unit>", "</unit>", "<image>", "</image>", "<slice>", "</slice>",
    "<|listen|>", "<|speak|>", "<|tts_bos|>", "<|tts_eos|>", "<|chunk_eos|>",
    "<|chunk_tts_eos|>", "<|turn_eos|>", "<|tts_pad|>",
    "<|audio_start|>", "<|audio_end|>", "<tool_call>", "</tool_call>",
]  # fmt: skip
VOCAB_SIZE = 1024

# What the merges are learned from: the prompts' own words and the tests'.
CORPUS = [
    "You are a helpful assistant. Be brief. Keep listening. Tell me a story.",
    "Hello there. One two three four five. Sunny all day. Rain tomorrow.",
    "It is clear in Paris. Let me look. Sure. Fine. Again. Same voice.",
    '{"type": "function", "function": {"name": "get_weather", "description": '
    '"The weather in a city.", "parameters": {"type": "object", "properties": '
    '{"city": {"type": "string"}}}}}',
    "system user assistant tool tool_response Call one of these functions now.",
]

# Qwen's layout: each message between <|im_start|>ROLE and <|im_end|>; tools
# in the first system message, one JSON object a line; a tool's output as a
# user turn of <tool_response>s. transformers renders templates with
# trim_blocks, which eats a newline after a tag: every text is an expression.
TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_TAIL = (
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
CHAT_TEMPLATE = (
    "{%- if tools -%}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{% endif -%}"
    "{{ head }}{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}{{ tail }}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (tools and loop.first and message.role == 'system') -%}"
    "{%- if message.role == 'tool' -%}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content"
    " + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else -%}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif -%}"
)


@functools.cache
def tokenizer() -> PreTrainedTokenizerFast:
    """The tokenizer (one per process: it is only read)."""
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([*CORPUS, TOOLS_HEAD, TOOLS_TAIL], trainer)
    made = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL[5:],
    )
    made.chat_template = CHAT_TEMPLATE.replace("{{ head }}", _literal(TOOLS_HEAD)).replace(
        "{{ tail }}", _literal(TOOLS_TAIL)
    )
    return made


def _literal(text: str) -> str:
    """``text`` as a Jinja expression that writes it as it is."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return "{{ '" + escaped + "' }}"
