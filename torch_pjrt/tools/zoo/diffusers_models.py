"""diffusers' model classes in the zoo: UNets, autoencoders and diffusion transformers.

Each class in CLASSES is a catalog type named "diffusers/<Class>" (head "diffusion"). Its
tiny config is its constructor's defaults (no hub config is read) shrunk by rules on the
arguments' names: two stages at most (the first and last block kinds of a UNet or VAE,
and every per-stage list picked the same way), stage widths (32, 64), one layer per
block, 8 norm groups, 2 heads of 16 in transformers (every width that equalled the old
heads x head dim follows it), 32-wide text conditioning, 16-pixel images for UNets and
VAEs and 8-latent-pixel ones for transformers. OVERRIDES holds what the rules cannot
derive (values only). Inputs come from the forward's argument names: the sample (batch
2), the timestep, and the conditioning the class takes (text states, pooled projections,
Flux's position ids, DiT's class labels). The run, the judge and the worker are the
transformers types' own.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
import types
from typing import Any

import torch

from .entry import Entry
from .name_rules import name_rule
from .seeds import INPUT_SEED, WEIGHT_SEED, redraw_constant_matrices

PREFIX = "diffusers/"
HEAD = "diffusion"

# The classes swept, by family. Video (3D) and audio models are left out: their inputs
# need per-class layouts the rules below do not give.
CLASSES: tuple[str, ...] = (
    # UNets
    "UNet1DModel", "UNet2DModel", "UNet2DConditionModel",
    # autoencoders
    "AutoencoderKL", "AsymmetricAutoencoderKL", "AutoencoderTiny", "VQModel", "AutoencoderDC",
    # diffusion transformers
    "DiTTransformer2DModel", "PixArtTransformer2DModel", "Transformer2DModel", "SD3Transformer2DModel",
    "FluxTransformer2DModel", "AuraFlowTransformer2DModel", "SanaTransformer2DModel",
)

STAGE_WIDTHS = (32, 64)  # a UNet's or VAE's block_out_channels after the pick
GROUPS = 8  # group norms: divides every stage width and the transformers' inner width
UNET_HEAD_DIM = 8  # a UNet's attention_head_dim (head size, or head count in legacy UNets): divides 32 and 64
HEADS = 2
HEAD_DIM = 16
TEXT_WIDTH = 32  # text encoders' widths, pooled projections, caption channels
IMAGE_SIDE = 16  # UNets and VAEs: pixels (or latent pixels) per side
LATENT_SIDE = 8  # transformers: latent pixels per side (patch 2: 16 tokens)
LATENT_CHANNELS = 4
TRANSFORMER_LAYERS = 2
POS_EMBED = 16  # pos_embed_max_size: patches per side of the position table
TEXT_LEN = 8  # encoder_hidden_states' sequence length
SEQUENCE = 64  # UNet1DModel's samples per channel

# Per class: constructor arguments the rules cannot derive, applied last.
OVERRIDES: dict[str, dict[str, Any]] = {
    # Without caption_channels the text states would skip the caption projection (the model's
    # inner width instead): given, PixArt's T5 projection runs as in its pipelines.
    "PixArtTransformer2DModel": {"caption_channels": TEXT_WIDTH},
    # The default (no in_channels, no patch size) builds nothing: a latent-image transformer with
    # cross attention, as Stable Diffusion's UNet blocks hold; its group norm reads 4 channels.
    # Dance Diffusion's layout: the first block reads the Fourier time embedding as extra
    # input channels, so their counts must agree (the defaults' do not).
    "UNet1DModel": {"sample_size": SEQUENCE, "time_embedding_dim": 16, "extra_in_channels": 16},
    "Transformer2DModel": {"in_channels": LATENT_CHANNELS, "cross_attention_dim": TEXT_WIDTH, "norm_num_groups": 2},
}

# Classes whose pipelines pass float timesteps (a flow-matching time in [0, 1] or sigma x 1000);
# the others take integer diffusion steps.
UNIT_TIMESTEPS = frozenset({"FluxTransformer2DModel", "AuraFlowTransformer2DModel"})  # scaled by 1000 inside
SIGMA_TIMESTEPS = frozenset({"SD3Transformer2DModel", "SanaTransformer2DModel"})


def is_diffusers(model_type: str) -> bool:
    return model_type.startswith(PREFIX)


def available() -> bool:
    return importlib.util.find_spec("diffusers") is not None


def entries() -> list[Entry]:
    """The catalog entries (none when diffusers is not installed). No diffusers import: a
    transformers worker does not pay for it."""
    if not available():
        return []
    return [Entry(PREFIX + name, "", HEAD, name, "") for name in CLASSES]


def class_name(model_type: str) -> str:
    return model_type.removeprefix(PREFIX)


def model_class(name: str) -> type:
    import diffusers.models

    cls = getattr(diffusers.models, name, None)
    if cls is None:
        raise ImportError(f"diffusers has no model class {name}")
    return cls


def default_config(model_type: str) -> dict[str, Any]:
    """The constructor's defaults (what from_config({}) builds), by argument name."""
    cls = model_class(class_name(model_type))
    return {n: p.default for n, p in inspect.signature(cls.__init__).parameters.items()
            if n != "self" and p.default is not inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


_is_stage_list = name_rule(r"block_types$|block_out_channels$|layers_per(_down|_up)?_block$|_blocks$|"
                       r"^attention_head_dim$|^num_attention_heads$|^only_cross_attention$|^cross_attention_dim$|"
                       r"qkv_multiscales$|norm_types$|act_fns$")
_is_block_widths = name_rule(r"block_out_channels$")
_is_block_layers = name_rule(r"layers_per(_down|_up)?_block$|^num_(en|de)coder_blocks$")
_is_other_layers = name_rule(r"^(num_|n_).*layers$")
_is_text_width = name_rule(r"^(cross_attention_dim|joint_attention_dim|pooled_projection_dim|caption_channels|"
                       r"caption_projection_dim|text_embed_dim|cap_feat_dim|encoder_hid_dim)$")
_is_io_channels = name_rule(r"^(in_channels|out_channels)$")


def _stage_count(defaults: dict[str, Any]) -> int:
    for name in ("down_block_types", "block_out_channels", "encoder_block_out_channels", "down_block_out_channels"):
        v = defaults.get(name)
        if isinstance(v, (list, tuple)):
            return len(v)
    return 0


def _kept_stages(n: int) -> list[int]:
    """The first and last stage (the outermost block kinds: a UNet's plain and attention blocks)."""
    return list(range(n)) if n <= 2 else [0, n - 1]


def _block_widths(v: list[int]) -> list[int]:
    """STAGE_WIDTHS' first for stages as wide as the first, the second for wider ones."""
    return [STAGE_WIDTHS[0] if x <= v[0] else STAGE_WIDTHS[1] for x in v]


def _rope_axes(axes: list[int], head_dim: int) -> list[int]:
    """Rotary axes' dims rescaled to sum to head_dim, each even (pairs of rotated channels)."""
    pairs, total = head_dim // 2, sum(axes) // 2
    scaled = [max(1, (x // 2) * pairs // total) for x in axes]
    scaled[0] += pairs - sum(scaled)
    return [2 * x for x in scaled]


def _stages(defaults: dict[str, Any], out: dict[str, Any]) -> None:
    """Per-stage lists picked to the kept stages; widths, layers and head sizes made tiny."""
    n = _stage_count(defaults)
    keep = _kept_stages(n)
    for name, v in defaults.items():
        if isinstance(v, (list, tuple)) and len(v) == n and _is_stage_list(name):
            v = [v[i] for i in keep]
            out[name] = v
        if _is_block_widths(name) and isinstance(v, (list, tuple)):
            out[name] = _block_widths(list(v))
        elif v is None:
            continue  # unset (a reversed copy of another list): derived from the others
        elif _is_block_layers(name) or name == "transformer_layers_per_block":
            out[name] = [1] * len(v) if isinstance(v, (list, tuple)) else 1
        elif name == "attention_head_dim":
            out[name] = [UNET_HEAD_DIM] * len(v) if isinstance(v, (list, tuple)) else UNET_HEAD_DIM
    if "sample_size" in defaults:
        out["sample_size"] = IMAGE_SIDE


def _transformer(defaults: dict[str, Any], out: dict[str, Any]) -> None:
    """A diffusion transformer: HEADS x HEAD_DIM wide; widths equal to the old inner width follow."""
    heads, head_dim = defaults.get("num_attention_heads"), defaults.get("attention_head_dim")
    old_inner = heads * head_dim if isinstance(heads, int) and isinstance(head_dim, int) else None
    for name, v in defaults.items():
        if name in ("num_attention_heads", "num_cross_attention_heads", "num_kv_heads") and isinstance(v, int):
            out[name] = HEADS
        elif name in ("attention_head_dim", "cross_attention_head_dim") and isinstance(v, int):
            out[name] = HEAD_DIM
        elif isinstance(v, int) and not isinstance(v, bool) and v == old_inner:
            out[name] = HEADS * HEAD_DIM
        elif name == "num_layers" and isinstance(v, int):
            out[name] = min(v, TRANSFORMER_LAYERS)
        elif _is_other_layers(name) and isinstance(v, int):
            out[name] = min(v, 1)
        elif _is_io_channels(name) and isinstance(v, int) and v > LATENT_CHANNELS:
            out[name] = LATENT_CHANNELS
        elif name == "pos_embed_max_size" and isinstance(v, int):
            out[name] = min(v, POS_EMBED)
        elif name in ("axes_dims_rope", "axes_dim_rope") and isinstance(v, (list, tuple)):
            out[name] = tuple(_rope_axes(list(v), HEAD_DIM))
        elif name == "sample_size":
            out[name] = LATENT_SIDE


def shrink(name: str, defaults: dict[str, Any]) -> dict[str, Any]:
    """The tiny constructor arguments of class `name` from its defaults (only those changed)."""
    out: dict[str, Any] = {}
    if _stage_count(defaults):
        _stages(defaults, out)
    else:
        _transformer(defaults, out)
    for arg, v in defaults.items():
        if arg in out:
            continue
        if _is_text_width(arg) and isinstance(v, int) and v > TEXT_WIDTH:
            out[arg] = TEXT_WIDTH
        elif arg == "norm_num_groups" and isinstance(v, int) and v > GROUPS:
            out[arg] = GROUPS
        elif "dropout" in arg and isinstance(v, float) and v:
            out[arg] = 0.0
    out.update(OVERRIDES.get(name, {}))
    return out


def tiny_config(model_type: str) -> dict[str, Any]:
    """The full constructor arguments: the defaults with the tiny values over them."""
    name = class_name(model_type)
    defaults = default_config(model_type)
    return {**defaults, **shrink(name, defaults)}


class EncodeDecode(torch.nn.Module):
    """An autoencoder run as encode then decode. AutoencoderTiny's forward rounds its latents to
    bytes (no gradient reaches the encoder) and makes the float64 run's latents float32."""

    def __init__(self, vae: torch.nn.Module) -> None:
        super().__init__()
        self.vae = vae

    def forward(self, sample: torch.Tensor) -> Any:
        return self.vae.decode(self.vae.encode(sample).latents)


ENCODE_DECODE = frozenset({"AutoencoderTiny"})


def build(entry: Entry, config: dict[str, Any] | None = None) -> tuple[torch.nn.Module, Any]:
    """(model in eval mode, float32, CPU; its config, a FrozenDict). Seeded and with constant
    matrices re-drawn as the transformers types are (adaLN-zero and zero-initialized output
    projections would hide every path behind them from the gradients)."""
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()
    config = config if config is not None else tiny_config(entry.model_type)
    cls = model_class(entry.model_class)
    torch.manual_seed(WEIGHT_SEED)
    model = cls(**config)
    redraw_constant_matrices(model, 0.02)
    run = EncodeDecode(model) if entry.model_class in ENCODE_DECODE else model
    return run.float().eval(), model.config


def _timesteps_float64(self: torch.nn.Module, timesteps: torch.Tensor) -> torch.Tensor:
    """diffusers' sinusoidal Timesteps embedding, in float64."""
    half = self.num_channels // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float64, device=timesteps.device)
    freqs = torch.exp(exponent / (half - self.downscale_freq_shift))
    angles = self.scale * (timesteps[:, None].to(torch.float64) * freqs[None, :])
    emb = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    if self.flip_sin_to_cos:
        emb = torch.cat([emb[:, half:], emb[:, :half]], dim=-1)
    return torch.nn.functional.pad(emb, (0, 1)) if self.num_channels % 2 else emb


def float64_time_embeddings(model: torch.nn.Module) -> list[str]:
    """Makes the float64 copy's Timesteps modules compute in float64. diffusers computes them in
    float32 whatever the model's dtype, so the float64 run equalled the CPU's float32 there and
    the bound shrank to ulps, while sin of angles up to 1000 moves by 1e-5 when exp's last bit
    differs (as XLA's and the CPU's do, both within an ulp or two). Returns the modules changed."""
    if "diffusers" not in sys.modules:
        return []
    from diffusers.models.embeddings import Timesteps

    changed = []
    for name, module in model.named_modules():
        if isinstance(module, Timesteps):
            module.forward = types.MethodType(_timesteps_float64, module)
            changed.append(name)
    return changed


# ---- inputs ----


def _get(config: Any, name: str, default: Any = None) -> Any:
    v = config.get(name) if hasattr(config, "get") else getattr(config, name, None)
    return default if v is None else v


def _text_width(config: Any) -> int | None:
    """The width of the text states the model reads (the first conditioning width it names)."""
    for name in ("joint_attention_dim", "caption_channels", "cross_attention_dim", "text_embed_dim", "cap_feat_dim",
                 "encoder_hid_dim"):
        v = _get(config, name)
        if isinstance(v, int):
            return v
        if isinstance(v, (list, tuple)) and v:
            return int(v[0])
    return None


def _timestep(name: str, gen: torch.Generator) -> torch.Tensor:
    """Two timesteps: integer steps, or float times as the class's pipeline passes them."""
    if name in UNIT_TIMESTEPS:
        return torch.rand(2, generator=gen, dtype=torch.float32)
    if name in SIGMA_TIMESTEPS:
        return torch.rand(2, generator=gen, dtype=torch.float32) * 1000
    return torch.randint(0, 1000, (2,), generator=gen)


def _image_ids(side: int) -> torch.Tensor:
    """Flux's latent position ids: (0, row, column) per packed latent pixel."""
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    return torch.stack([torch.zeros_like(rows), rows, cols], dim=-1).reshape(-1, 3).float()


def _side(config: Any) -> int:
    """Pixels per side: the config's sample size, else a transformer's latent side (Flux names none)."""
    size = _get(config, "sample_size", LATENT_SIDE)
    return int(size[0]) if isinstance(size, (list, tuple)) else int(size)


def _sample(name: str, config: Any, params: dict[str, Any], gen: torch.Generator) -> torch.Tensor:
    """The main input: images (batch, channels, side, side); Flux's packed latents (batch,
    tokens, channels); a 1D UNet's (batch, channels, samples)."""
    channels, side = int(_get(config, "in_channels", 3)), _side(config)
    if "img_ids" in params:
        return torch.randn(2, side * side, channels, generator=gen)
    if name == "UNet1DModel":
        return torch.randn(2, channels, side, generator=gen)
    return torch.randn(2, channels, side, side, generator=gen)


def make_inputs(model: torch.nn.Module, config: Any, model_type: str) -> dict[str, Any]:
    """Keyword arguments for model(**inputs), CPU float32, batch 2, seeded."""

    name = class_name(model_type)
    params = inspect.signature(model.forward).parameters
    gen = torch.Generator().manual_seed(INPUT_SEED)
    main = next(p for p in ("sample", "hidden_states", "x") if p in params)
    x: dict[str, Any] = {main: _sample(name, config, params, gen)}
    if "timestep" in params:
        x["timestep"] = _timestep(name, gen)
    width = _text_width(config)
    if "encoder_hidden_states" in params and width:
        x["encoder_hidden_states"] = torch.randn(2, TEXT_LEN, width, generator=gen)
    if "pooled_projections" in params and _get(config, "pooled_projection_dim"):
        x["pooled_projections"] = torch.randn(2, int(_get(config, "pooled_projection_dim")), generator=gen)
    if "img_ids" in params:
        x["img_ids"] = _image_ids(_side(config))
        x["txt_ids"] = torch.zeros(TEXT_LEN, 3)
    if "guidance" in params and _get(config, "guidance_embeds", False):
        x["guidance"] = torch.full((2,), 3.5)
    if "class_labels" in params and _get(config, "norm_type") == "ada_norm_zero":
        x["class_labels"] = torch.randint(0, int(_get(config, "num_embeds_ada_norm", 1000)), (2,), generator=gen)
    if "added_cond_kwargs" in params and _get(config, "norm_type") == "ada_norm_single":
        x["added_cond_kwargs"] = {"resolution": None, "aspect_ratio": None}
    if "return_dict" in params:
        x["return_dict"] = True
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in x
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if missing:
        raise ValueError(f"no input for required argument(s) {', '.join(missing)}")
    return x
