"""Model types of the installed transformers and the class the sweep runs for each.

A type is in the catalog when any auto mapping (MODEL_*_MAPPING_NAMES) names a class
for it; diffusers' model classes follow, as "diffusers/<Class>" (diffusers_models.py). Each type runs one class: the first head in HEADS that it has (the head most
users run), else its base model (MODEL_MAPPING_NAMES), else the first class any other
mapping names for it.
"""

from __future__ import annotations

from .entry import Entry

# (head, mapping) in order of preference; the mapping is MODEL_<mapping>_MAPPING_NAMES. A masked LM
# comes before a causal LM (BERT-like encoders have a causal head for use as decoders, which few run),
# sequence-to-sequence before causal LM (BART's or Whisper's causal class is their decoder alone),
# CTC before audio classification (speech encoders are mostly run for recognition).
HEADS: tuple[tuple[str, str], ...] = (
    ("masked-lm", "FOR_MASKED_LM"),
    ("seq2seq-lm", "FOR_SEQ_TO_SEQ_CAUSAL_LM"),
    ("speech-seq2seq", "FOR_SPEECH_SEQ_2_SEQ"),
    ("causal-lm", "FOR_CAUSAL_LM"),
    ("image-classification", "FOR_IMAGE_CLASSIFICATION"),
    ("ctc", "FOR_CTC"),
    ("audio-classification", "FOR_AUDIO_CLASSIFICATION"),
    ("sequence-classification", "FOR_SEQUENCE_CLASSIFICATION"),
    ("image-text-to-text", "FOR_IMAGE_TEXT_TO_TEXT"),
    ("multimodal-lm", "FOR_MULTIMODAL_LM"),
    ("token-classification", "FOR_TOKEN_CLASSIFICATION"),
    ("question-answering", "FOR_QUESTION_ANSWERING"),
    ("semantic-segmentation", "FOR_SEMANTIC_SEGMENTATION"),
    ("depth-estimation", "FOR_DEPTH_ESTIMATION"),
    ("time-series-prediction", "FOR_TIME_SERIES_PREDICTION"),
    ("pretraining", "FOR_PRETRAINING"),
)
BASE = "base"
# Heads whose models compute a loss from `labels` (and how the labels look: inputs.py).
LOSS_HEADS = frozenset({"causal-lm", "masked-lm", "seq2seq-lm", "speech-seq2seq", "image-classification",
                        "audio-classification", "ctc", "sequence-classification", "token-classification"})


def _names(mapping: str) -> dict[str, str | tuple[str, ...]]:
    from transformers.models.auto import modeling_auto

    return getattr(modeling_auto, f"MODEL_{mapping}_MAPPING_NAMES")


def _first(value: str | tuple[str, ...]) -> str:
    return value if isinstance(value, str) else value[0]


def _other_mappings() -> list[str]:
    from transformers.models.auto import modeling_auto

    known = {m for _, m in HEADS}
    return sorted(n[len("MODEL_"):-len("_MAPPING_NAMES")] for n in dir(modeling_auto)
                  if n.startswith("MODEL_") and n.endswith("_MAPPING_NAMES") and n != "MODEL_MAPPING_NAMES"
                  and n[len("MODEL_"):-len("_MAPPING_NAMES")] not in known)


def entries() -> list[Entry]:
    """Every model type with an auto class, sorted by type, then diffusers' classes."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from .diffusers_models import entries as diffusers_entries

    base = _base_names()
    heads = [(head, _names(mapping)) for head, mapping in HEADS]
    others = [(f"other:{m.lower()}", _names(m)) for m in _other_mappings()]
    types: set[str] = set(base)
    for _, names in heads + others:
        types |= set(names)
    result = []
    for t in sorted(types):
        head, cls = next(((h, _first(names[t])) for h, names in heads if t in names), ("", ""))
        seq2seq = dict(heads).get("seq2seq-lm", {})
        if head == "masked-lm" and t in seq2seq and _first(seq2seq[t]) == cls:
            head = "seq2seq-lm"  # BART-like: the masked-LM mapping names the sequence-to-sequence class
        if not cls and t in base:
            head, cls = BASE, _first(base[t])
        if not cls:
            head, cls = next((h, _first(names[t])) for h, names in others if t in names)
        result.append(Entry(t, CONFIG_MAPPING_NAMES.get(t, ""), head, cls,
                            _first(base[t]) if t in base else ""))
    return result + diffusers_entries()


def _base_names() -> dict[str, str | tuple[str, ...]]:
    from transformers.models.auto import modeling_auto

    return modeling_auto.MODEL_MAPPING_NAMES


def entry(model_type: str) -> Entry:
    for e in entries():
        if e.model_type == model_type:
            return e
    raise KeyError(f"{model_type!r} is not a model type with an auto class in this transformers")


def sample(items: list[str], n: int) -> list[str]:
    """n items spread evenly over `items` (deterministic: the same list gives the same sample)."""
    if n >= len(items):
        return list(items)
    if n <= 0:
        return []
    return [items[(2 * i + 1) * len(items) // (2 * n)] for i in range(n)]
