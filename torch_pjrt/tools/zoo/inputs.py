"""Forward arguments for a model, from its forward signature, its main input and its config.

Batch 2, short sequences. Token ids are drawn from the vocabulary without the special
ids the config names (an image token in a text-only batch would ask for an image), so
every row is ordinary text. Arguments with defaults that the rules do not know are
left to their defaults; a required one that they do not know makes the architecture
fail on the CPU ("no input for required argument ...").
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from .catalog import LOSS_HEADS
from .overrides import INPUT_OVERRIDES
from .seeds import INPUT_SEED

DUAL_HEADS = frozenset({"base", "pretraining"})  # heads whose text models also get pixel_values


@dataclass
class Shape:
    batch: int = 2
    seq: int = 16
    decoder_seq: int = 8
    frames: int = 16  # audio encoders: frames after the feature extractor's convolutions
    feature_frames: int = 64  # filterbank inputs (input_features) without a config-given length
    label_len: int = 4  # CTC targets
    image: int = 32  # when the config names no image size
    with_pixels: bool = False  # give pixel_values to models whose main input is text


def _sub(config: Any, *names: str) -> Any:
    for n in names:
        sub = getattr(config, n, None)
        if sub is not None and not isinstance(sub, (int, float, str, bool, list, dict)):
            return sub
    return config


def _get(config: Any, name: str, default: Any) -> Any:
    try:
        v = getattr(config, name, None)
    except Exception:  # noqa: BLE001  (per-layer attributes raise on global access)
        return default
    return default if v is None else v


def special_ids(config: Any) -> set[int]:
    """Every int the config (and its sub-configs) names as a token id or index."""
    from .shrink import is_token_id  # the same name rule as the shrinker's

    found: set[int] = set()
    stack, seen = [config], set()
    while stack:
        c = stack.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        for k, v in list(getattr(c, "__dict__", {}).items()):
            if isinstance(v, int) and not isinstance(v, bool) and is_token_id(k):
                found.add(v)
            elif isinstance(v, list) and is_token_id(k):
                found |= {x for x in v if isinstance(x, int)}
            elif hasattr(v, "to_dict") and hasattr(v, "model_type"):
                stack.append(v)
    return found


def vocab_size(config: Any) -> int:
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    v = _get(text, "vocab_size", None) or _get(config, "vocab_size", None)
    return int(v) if v else 0


class Draw:
    """Seeded draws (one generator per architecture: the same inputs in every run)."""

    def __init__(self, seed: int = INPUT_SEED) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def ids(self, allowed: torch.Tensor, *shape: int) -> torch.Tensor:
        return allowed[torch.randint(0, len(allowed), shape, generator=self.gen)]

    def ints(self, high: int, *shape: int) -> torch.Tensor:
        return torch.randint(0, max(high, 1), shape, generator=self.gen)

    def floats(self, *shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen, dtype=torch.float32)


def _allowed_ids(config: Any) -> torch.Tensor:
    vocab = vocab_size(config)
    if vocab <= 0:
        return torch.arange(0)
    special = special_ids(config)
    ids = [i for i in range(min(vocab, 4096)) if i not in special]
    return torch.tensor(ids or list(range(vocab)), dtype=torch.long)


def _image_size(config: Any, shape: Shape) -> tuple[int, int]:
    vc = _sub(config, "vision_config", "backbone_config", "encoder_config", "image_config")
    size = _get(vc, "image_size", None) or _get(config, "image_size", None) or shape.image
    if isinstance(size, (list, tuple)):
        return int(size[0]), int(size[-1])
    if isinstance(size, dict):
        return int(size.get("height", shape.image)), int(size.get("width", shape.image))
    return int(size), int(size)


def _frames(config: Any) -> int:
    vc = _sub(config, "vision_config", "video_config")
    return int(_get(vc, "num_frames", None) or _get(vc, "frames_per_clip", None)
               or _get(config, "num_frames", None) or 0)


def _channels(config: Any) -> int:
    vc = _sub(config, "vision_config", "backbone_config", "encoder_config", "image_config")
    return int(_get(vc, "num_channels", None) or _get(config, "num_channels", 3))


def audio_samples(config: Any, frames: int) -> int:
    """Waveform length giving `frames` after a conv feature extractor (conv_kernel/conv_stride)."""
    kernels = _get(config, "conv_kernel", None)
    strides = _get(config, "conv_stride", None)
    if not isinstance(kernels, (list, tuple)) or not isinstance(strides, (list, tuple)):
        return 4000
    n = frames
    for k, s in reversed(list(zip(kernels, strides))):
        n = (n - 1) * s + k
    return n


def _patch_grid(config: Any, shape: Shape) -> tuple[torch.Tensor, tuple[int, int]]:
    """(grid_thw, flattened patches' shape) for `shape.batch` images of 2 x 2 merged patches."""
    merge = int(_get(config, "spatial_merge_size", 2))
    side = 2 * merge
    grid = torch.tensor([[1, side, side]] * shape.batch, dtype=torch.long)
    per_patch = (int(_get(config, "in_channels", None) or _get(config, "num_channels", 3))
                 * int(_get(config, "temporal_patch_size", 1)) * int(_get(config, "patch_size", 14)) ** 2)
    return grid, (shape.batch * side * side, per_patch)


def _features(config: Any, shape: Shape, draw: Draw) -> torch.Tensor:
    """Filterbank features: Whisper-like (batch, mel bins, 2 * max_source_positions), else
    (batch, frames, features)."""
    c = _sub(config, "audio_config", "encoder_config", "encoder")
    mel = _get(c, "num_mel_bins", None)
    source = _get(c, "max_source_positions", None)
    if mel and source:
        return draw.floats(shape.batch, int(mel), 2 * int(source))
    per_channel = _get(c, "input_feat_per_channel", None)
    if per_channel:
        return draw.floats(shape.batch, shape.feature_frames, int(per_channel) * int(_get(c, "input_channels", 1)))
    size = _get(c, "feature_size", None) or mel or _get(c, "input_dim", None) or _get(c, "num_mel_bins", 80)
    return draw.floats(shape.batch, shape.feature_frames, int(size))


def _labels(head: str, config: Any, shape: Shape, draw: Draw, inputs: dict[str, Any],
            allowed: torch.Tensor) -> torch.Tensor | None:
    num_labels = int(_get(config, "num_labels", 2))
    if head in ("causal-lm", "masked-lm") and "input_ids" in inputs:
        return inputs["input_ids"].clone()
    if head in ("seq2seq-lm", "speech-seq2seq") and "decoder_input_ids" not in inputs and "input_ids" in inputs:
        return inputs["input_ids"].clone()  # a decoder-only model listed as sequence-to-sequence (audio LMs)
    if head in ("seq2seq-lm", "speech-seq2seq"):
        return draw.ids(allowed, shape.batch, shape.decoder_seq) if len(allowed) else None
    if head in ("image-classification", "audio-classification", "sequence-classification"):
        return draw.ints(num_labels, shape.batch)
    if head == "token-classification" and "input_ids" in inputs:
        return draw.ints(num_labels, *inputs["input_ids"].shape)
    if head == "ctc":
        pad = _get(config, "pad_token_id", 0)
        ok = allowed[(allowed != pad) & (allowed > 0)] if len(allowed) else allowed
        return draw.ids(ok, shape.batch, shape.label_len) if len(ok) else None
    return None


def make_inputs(model: torch.nn.Module, config: Any, head: str, model_type: str = "") -> dict[str, Any]:
    """Keyword arguments for model(**inputs) on the CPU, float32."""
    from . import diffusers_models

    if diffusers_models.is_diffusers(model_type):
        return diffusers_models.make_inputs(model, config, model_type)
    over = dict(INPUT_OVERRIDES.get(model_type, {}))
    extra = over.pop("extra", {})
    shape = Shape(**over)
    params = inspect.signature(model.forward).parameters
    main = getattr(model, "main_input_name", "input_ids")
    draw = Draw()
    allowed = _allowed_ids(config)
    inputs: dict[str, Any] = {}

    def wants(name: str) -> bool:
        p = params.get(name)
        return p is not None and (name == main or p.default is inspect.Parameter.empty)

    if wants("input_ids") or (main == "input_ids" and "input_ids" in params):
        if not len(allowed):
            raise ValueError("the config names no vocabulary for input_ids")
        inputs["input_ids"] = draw.ids(allowed, shape.batch, shape.seq)
        if "attention_mask" in params:
            inputs["attention_mask"] = torch.ones(shape.batch, shape.seq, dtype=torch.long)
    # Dual encoders (CLIP-like base models) take both; a generative head's text-only batch
    # leaves its vision tower out (an image would need its placeholder tokens in input_ids).
    dual = head in DUAL_HEADS and "input_ids" in inputs
    if wants("pixel_values") or ((shape.with_pixels or dual) and "pixel_values" in params):
        h, w = _image_size(config, shape)
        frames = _frames(config)
        clip = (frames,) if frames else ()  # video models: (batch, frames, channels, height, width)
        inputs["pixel_values"] = draw.floats(shape.batch, *clip, _channels(config), h, w)
    if "noise" in params and "pixel_values" in inputs and _get(config, "mask_ratio", None) is not None:
        # Masked autoencoders (ViT-MAE) shuffle patches by argsort of noise they draw unless given:
        # given, every run masks the same patches.
        h, w = _image_size(config, shape)
        patch = int(_get(config, "patch_size", 16))
        inputs["noise"] = draw.floats(shape.batch, (h // patch) * (w // patch)).abs()
    if wants("pixel_values_videos"):
        h, w = _image_size(config, shape)
        inputs["pixel_values_videos"] = draw.floats(shape.batch, _frames(config) or 4, _channels(config), h, w)
    if wants("grid_thw"):
        # Qwen-VL-like vision towers: flattened patches of one image per batch item, with the
        # image's (frames, height, width) in patches.
        grid, patches = _patch_grid(config, shape)
        inputs["grid_thw"] = grid
        for name in ("hidden_states", "pixel_values"):
            if wants(name):
                inputs[name] = draw.floats(*patches)
    if wants("input_values"):
        c = _sub(config, "audio_config", "encoder_config")
        inputs["input_values"] = draw.floats(shape.batch, audio_samples(c, shape.frames))
    if wants("input_features"):
        inputs["input_features"] = _features(config, shape, draw)
    if "decoder_input_ids" in params and (_get(config, "is_encoder_decoder", False) or wants("decoder_input_ids")):
        if len(allowed):
            inputs["decoder_input_ids"] = draw.ids(allowed, shape.batch, shape.decoder_seq)
    if "labels" in params and head in LOSS_HEADS:
        labels = _labels(head, config, shape, draw, inputs, allowed)
        if labels is not None:
            inputs["labels"] = labels
    if "use_cache" in params:
        inputs["use_cache"] = False
    if "return_dict" in params:
        inputs["return_dict"] = True
    for name, value in extra.items():
        inputs[name] = value
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in inputs
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise ValueError(f"no input for required argument(s) {', '.join(missing)}")
    return inputs


def move(inputs: dict[str, Any], device: str | torch.device, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """The inputs on `device`; floating tensors cast to `dtype` when given."""
    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            if dtype is not None and v.is_floating_point():
                return v.to(device=device, dtype=dtype)
            return v.to(device)
        return v
    return {k: one(v) for k, v in inputs.items()}
