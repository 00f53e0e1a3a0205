"""Tiny causal language models for the serving tests and benchmark, made locally (no hub):
a Llama and a GPT-2 built from configs with random weights, each saved with a byte-level
BPE tokenizer trained here and a chat template, so `vllm serve <dir>` and
`transformers.AutoModelForCausalLM.from_pretrained(<dir>)` both load them offline.

    python serving_models.py DIR    (writes DIR/llama and DIR/gpt2)
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402

VOCAB = 512
MAX_LEN = 256
LLAMA_MAX_LEN = 2048  # rotary positions: long-context tests serve the same tiny Llama
KINDS = ("llama", "gpt2")  # what the tests serve
# For the benchmark: a Llama where attention over long contexts matters (hidden 512, 8 layers,
# 2,048 positions), with the usual small initialization (its output is timed, not compared).
LARGE = "llama-large"
LARGE_MAX_LEN = 2048
# Larger than the usual 0.02: random weights then give logits whose top two differ clearly,
# so greedy decoding is decided by the model, not by float32 rounding (the tests check it).
INIT_RANGE = 0.25

_TEXT = """The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins
with a single step. To be or not to be, that is the question. All that glitters is not gold.
The early bird catches the worm. Knowledge is power. Time and tide wait for no man. Where
there is a will, there is a way. Actions speak louder than words. Practice makes perfect.
Serving language models needs paged memory, batching and compiled programs for each shape."""

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _tokenizer() -> transformers.PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_TEXT] * 4, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                                eos_token="<|endoftext|>", pad_token="<|pad|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _config(kind: str, vocab: int, eos: int) -> transformers.PretrainedConfig:
    if kind == "llama":
        return transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=LLAMA_MAX_LEN,
            initializer_range=INIT_RANGE, bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=False,
            torch_dtype="float32")
    if kind == "gpt2":
        return transformers.GPT2Config(
            vocab_size=vocab, n_embd=128, n_layer=2, n_head=4, n_positions=MAX_LEN,
            initializer_range=INIT_RANGE, bos_token_id=eos, eos_token_id=eos, torch_dtype="float32")
    if kind == LARGE:
        return transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
            num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=LARGE_MAX_LEN,
            initializer_range=0.02, bos_token_id=eos, eos_token_id=eos, tie_word_embeddings=False,
            torch_dtype="float32")
    raise ValueError(f"unknown model kind {kind!r}; expected one of {KINDS + (LARGE,)}")


def make_model(kind: str, directory: str, seed: int = 0) -> str:
    """Writes model `kind` (weights, config, tokenizer) to `directory`; returns it."""
    os.makedirs(directory, exist_ok=True)
    tokenizer = _tokenizer()
    torch.manual_seed(seed)
    config = _config(kind, len(tokenizer), tokenizer.eos_token_id)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    with open(os.path.join(directory, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": tokenizer.eos_token_id, "do_sample": False}, f)
    return directory


def make_models(directory: str) -> dict[str, str]:
    return {kind: make_model(kind, os.path.join(directory, kind)) for kind in KINDS}


if __name__ == "__main__":
    print(make_models(sys.argv[1]))
