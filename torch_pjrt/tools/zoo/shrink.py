"""A tiny configuration from a config class's defaults, by rules on the fields' names.

The defaults (`ConfigClass()`) describe a released model; each field whose name says
what it is gets a small value, the same for every field of its kind, so fields that
were equal stay equal (a vision tower's width and the projector's input, a text
model's hidden size and the cross-attention's). Sub-configurations (text_config,
vision_config, encoder, decoder, ...) are shrunk by the same rules, bottom up, and
the config is built again through its constructor with only the changed fields, so
whatever the class derives from them (head_dim when unset, layer_types, a backbone's
stage names) is derived anew. Per-layer lists (layer_types, a hybrid's block
pattern: any list as long as the layer count) keep one layer of each distinct kind.
Special token ids beyond the small vocabulary move to its top, distinct as before.
Per-architecture values the rules cannot find go in overrides.py.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from .name_rules import name_rule
from .overrides import CONFIG_OVERRIDES

WIDTH = 64  # hidden sizes
HEADS = 4  # attention heads (key/value heads: 2, or 1 where the model had one)
HEAD_DIM = WIDTH // HEADS
INTERMEDIATE = 128
LAYERS = 2
VOCAB = 256
EXPERTS = 4
TOP_K = 2
POSITIONS = 128
SOURCE_POSITIONS = 32  # an audio encoder's positions (Whisper: input frames / 2)
IMAGE = 32
PATCH = 8
WINDOW = 2  # attention windows (Swin-like), in patches
GROUPS = 4  # group norms' groups
RANK = 32  # low-rank projections (MLA's kv/q LoRA ranks, time-step ranks)
LIST_WIDTH = 64  # the largest entry of a per-stage width list after scaling

_is_dropout = name_rule(r"dropout|drop_path|layerdrop|drop_rate|attention_probs_dropout|_drop$")
_is_kv_heads = name_rule(r"^(num_key_value_heads|num_kv_heads|n_head_kv|n_kv_heads|multi_query_group_num|"
                     r"num_key_value_groups|.*_key_value_heads|.*_kv_heads)$")
_is_heads = name_rule(r"^(num_attention_heads|n_head|n_heads|num_heads|attention_heads|.*_attention_heads|"
                  r".*_num_heads|num_.*_heads|.*_n_heads|n_.*_heads)$")
_is_head_dim = name_rule(r"^(head_dim|.*_head_dim|attention_head_dim|kv_channels|d_kv|d_head|attention_head_size|"
                     r"head_size|.*_head_size|qk_nope_head_dim|v_head_dim|qk_rope_head_dim)$")
_is_intermediate = name_rule(r"intermediate|ffn|^d_ff$|_d_ff$|n_inner|mlp_dim|inner_dim|feed_forward|^ff_dim|"
                         r"_ff_dim|fc_dim|mlp_hidden")
_is_width = name_rule(r"^(hidden_size|d_model|n_embd|embed_dim|dim|hidden_dim|d_embed|model_dim|embedding_size|"
                  r"embedding_dim|emb_dim|d_hidden|projection_dim|.*_hidden_size|.*_embed_dim|.*_d_model|"
                  r".*_proj_dim|.*_proj_size|.*_embedding_dim|.*_embedding_size|.*_hidden_dim|.*_model_dim|"
                  r".*_emb_dim|codevector_dim|d_latents|.*_channel|.*_channels|channels)$")
_is_layers = name_rule(r"^(num_hidden_layers|num_layers|n_layer|n_layers|depth|.*_layers|num_.*_layers|"
                   r"num_.*_layer|.*_depth|num_blocks|n_blocks|num_self_attends_per_block)$")
_is_first_dense = name_rule(r"^(first_k_dense_replace|first_k_dense|num_dense_layers|n_dense_layers)$")
_is_experts = name_rule(r"^(num_experts|num_local_experts|n_routed_experts|moe_num_experts|num_routed_experts|"
                    r"n_experts|expert_num|num_moe_experts|.*_num_experts)$")
_is_top_k = name_rule(r"^(num_experts_per_tok|num_experts_per_token|moe_top_k|top_k|moe_k|num_selected_experts|"
                  r"experts_per_token|.*_experts_per_tok|router_top_k|moe_topk)$")
_is_shared_experts = name_rule(r"^(n_shared_experts|num_shared_experts|shared_experts|moe_num_shared_experts)$")
_is_vocab = name_rule(r"vocab")
is_token_id = name_rule(r"(token_id|token_index|token_ids|_token|_idx)$")
_is_positions = name_rule(r"^(max_position_embeddings|n_positions|max_seq_len|max_sequence_length|"
                      r"max_target_positions|n_ctx|max_len|max_length|.*_max_position_embeddings|"
                      r"max_text_len|max_seq_length|.*_max_positions)$")
_is_source_positions = name_rule(r"^(max_source_positions)$")
_is_image = name_rule(r"^(image_size|img_size|.*_image_size|input_size|crop_size)$")
_is_patch = name_rule(r"^(patch_size|.*_patch_size)$")
_is_rotary_dim = name_rule(r"^(rotary_dim|rotary_emb_dim|rope_dim|rotary_ndims)$")
_is_rank = name_rule(r"(_lora_rank|^time_step_rank|_rank)$")
_not_width = name_rule(r"kernel|stride|ratio|dilation|padding|pool|window|factor|patch|scale")
_is_width_list_name = name_rule(r"(hidden_sizes|embed_dims|^dims$|_dims$|conv_dim|tdnn_dim|channels$|_sizes$|hidden_dim$|"
                       r"^widths|_widths$|neck_hidden_sizes|embed_dim$)")
def _is_width_list(name: str) -> bool:
    return _is_width_list_name(name) and not _not_width(name)


_is_depth_list = name_rule(r"(depths$|^depth$|num_layers$|layers$|^blocks$|_blocks$|num_blocks$|block_repeats)")
_is_heads_list = name_rule(r"heads$|num_heads$|attention_heads$")


def _shrink_int(name: str, v: int, kv_heads_of: dict[str, int]) -> int | None:
    """The tiny value of an int field, None to keep it."""
    if v <= 0:
        return None
    if _is_kv_heads(name):
        if v == 1:
            return 1
        return HEADS if v == kv_heads_of.get("heads", -1) else min(v, 2)
    if _is_heads(name):
        return min(v, HEADS)
    if name in ("qk_nope_head_dim", "qk_rope_head_dim"):
        return min(v, HEAD_DIM // 2)  # multi-head latent attention: a query/key head of HEAD_DIM in all
    if _is_head_dim(name):
        return min(v, HEAD_DIM)
    if _is_first_dense(name):
        return min(v, 1)
    if _is_shared_experts(name):
        return min(v, 1)
    if _is_experts(name):
        return min(v, EXPERTS)
    if _is_top_k(name):
        return min(v, TOP_K)
    if name == "n_group":
        return min(v, 2)
    if name == "topk_group":
        return min(v, 1)
    if _is_intermediate(name):
        return min(v, INTERMEDIATE)
    if _is_layers(name):
        return min(v, LAYERS)
    if _is_vocab(name):
        return min(v, VOCAB)
    if _is_source_positions(name):
        return min(v, SOURCE_POSITIONS)
    if _is_positions(name):
        return min(v, POSITIONS)
    if _is_image(name):
        return min(v, IMAGE)
    if _is_patch(name):
        return min(v, PATCH)
    if name in ("num_frames", "frames_per_clip"):
        return min(v, 4)  # video clips: a multiple of every tubelet depth in transformers (2)
    if _is_rotary_dim(name):
        return min(v, HEAD_DIM)
    if name == "num_groups":
        return min(v, GROUPS)
    if _is_rank(name):
        return min(v, RANK)
    if _is_width(name):
        return min(v, WIDTH)
    return None


def _scale(values: list[int]) -> Callable[[int], int]:
    """One scaling for every per-stage width list of a config (a stage's output width is the next
    one's input, across lists): by a common divisor where there is one, else proportionally."""
    top = max(values, default=0)
    if top <= LIST_WIDTH:
        return lambda x: x
    k = top // LIST_WIDTH
    while k > 1 and any(v % k for v in values):
        k -= 1
    if k > 1 and top // k <= 2 * LIST_WIDTH:
        return lambda x: x // k
    return lambda x: max(8, round(x * LIST_WIDTH / top))


def _ints(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _shrink_list(name: str, v: list[Any], width: Callable[[int], int]) -> list[Any] | None:
    if not _ints(v):
        return None
    if _is_heads_list(name):
        g = math.gcd(*v)
        return [max(1, x // g) for x in v]
    if _is_depth_list(name):
        return [min(x, 1) for x in v]
    if _is_width_list(name):
        return [width(x) for x in v]
    if _is_image(name) or (name.endswith("image_size") and len(v) == 2):
        return [min(x, IMAGE) for x in v]
    if _is_patch(name) and len(v) == 2:
        return [min(x, PATCH) for x in v]
    return None


def _keep_layers(layer_lists: list[list[Any]], n: int) -> list[int]:
    """Indices of the layers to keep: the first of each distinct kind (over every per-layer list),
    then the earliest others, to at least LAYERS, in order."""
    seen: set[tuple[str, ...]] = set()
    keep: list[int] = []
    for i in range(n):
        kind = tuple(repr(lst[i]) for lst in layer_lists)
        if kind not in seen:
            seen.add(kind)
            keep.append(i)
    for i in range(n):
        if len(keep) >= LAYERS:
            break
        if i not in keep:
            keep.append(i)
    return sorted(keep)


def _init_fields(cls: type) -> set[str]:
    return {n for n, p in inspect.signature(cls.__init__).parameters.items()
            if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


class _TokenIds:
    """Token ids >= VOCAB moved to the top of the small vocabulary: the same old id to the same
    new one in every sub-config, distinct ids staying distinct."""

    def __init__(self) -> None:
        self.map: dict[int, int] = {}
        self.next = VOCAB - 1

    def __call__(self, v: int) -> int:
        if v < VOCAB:
            return v
        if v not in self.map:
            self.map[v] = self.next
            self.next -= 1
        return self.map[v]


def _fields(config: Any, names: set[str]) -> dict[str, Any]:
    """The config's values of `names` (those it can give as a whole: a per-layer attribute of a
    config with per-layer sub-configs raises on global access and is left alone)."""
    values = {}
    for k in sorted(names):
        try:
            values[k] = getattr(config, k)
        except Exception:  # noqa: BLE001
            continue
    return values


def _is_config(value: Any) -> bool:
    from transformers import PretrainedConfig

    return isinstance(value, PretrainedConfig)


def _layer_count(fields: dict[str, Any]) -> list[int]:
    return sorted({v for k, v in fields.items() if _is_layers(k) and isinstance(v, int) and v > LAYERS})


_is_pattern = name_rule(r"pattern|block_type|layer_type|override")


def _per_layer(name: str, v: Any, layer_counts: list[int]) -> bool:
    """A per-layer list (or pattern string: "M-M*-"): as long as a layer count, and not a list
    of per-stage widths, depths or heads, nor of token ids."""
    if isinstance(v, str):
        return len(v) in layer_counts and _is_pattern(name)
    if not isinstance(v, list) or len(v) not in layer_counts:
        return False
    return not (_is_width_list(name) or _is_depth_list(name) or _is_heads_list(name) or is_token_id(name))


def shrink(config: Any, tokens: _TokenIds | None = None, overrides: dict[str, Any] | None = None) -> Any:
    """A tiny config of the same class as `config` (which is left as it is)."""
    tokens = tokens or _TokenIds()
    overrides = overrides or {}
    cls = type(config)
    init = _init_fields(cls)
    values = _fields(config, init)
    changed: dict[str, Any] = {}
    heads = next((v for k, v in values.items() if k == "num_attention_heads" and isinstance(v, int)), -1)
    layer_counts = _layer_count(values)
    per_layer = {k: v for k, v in values.items() if _per_layer(k, v, layer_counts)}
    width = _scale([x for k, v in values.items() if _ints(v) and _is_width_list(k) and not _is_heads_list(k)
                    and not _is_depth_list(k) for x in v])
    for name, v in values.items():
        if name in per_layer or v is None or isinstance(v, bool):
            continue
        if _is_config(v):
            sub = overrides.get(name, {})
            changed[name] = shrink(v, tokens, sub if isinstance(sub, dict) else {})
        elif isinstance(v, float) and _is_dropout(name):
            if v != 0.0:
                changed[name] = 0.0
        elif isinstance(v, int) and is_token_id(name):
            if v != tokens(v):
                changed[name] = tokens(v)
        elif isinstance(v, list) and is_token_id(name) and all(isinstance(x, int) for x in v):  # eos lists
            if any(x >= VOCAB for x in v):
                changed[name] = [tokens(x) for x in v]
        elif isinstance(v, int):
            new = _shrink_int(name, v, {"heads": heads})
            if new is not None and new != v:
                changed[name] = new
        elif isinstance(v, (list, tuple)):
            new_list = _shrink_list(name, list(v), width)
            if new_list is not None and new_list != list(v):
                changed[name] = type(v)(new_list)
        elif isinstance(v, dict) and name in ("rope_parameters", "rope_scaling"):
            rope = _shrink_rope(v, values)
            if rope != v:
                changed[name] = rope
    if per_layer:
        n_old = max(len(v) for v in per_layer.values())
        keep = _keep_layers([list(v) for v in per_layer.values() if len(v) == n_old], n_old)
        for name, v in per_layer.items():
            if len(v) == n_old:
                picked = [_shrink_int(name, x, {"heads": heads}) or x if isinstance(x, int) and not isinstance(x, bool)
                          else x for x in (v[i] for i in keep)]
                changed[name] = "".join(picked) if isinstance(v, str) else picked
        for name, v in values.items():
            if _is_layers(name) and v == n_old:
                changed[name] = len(keep)
    if "qk_rope_head_dim" in changed and values.get("head_dim") == values.get("qk_rope_head_dim"):
        changed["head_dim"] = changed["qk_rope_head_dim"]  # MLA: head_dim names the rotary part
    changed.update(_unset(values, heads))
    changed.update(_fit_windows({**values, **changed}))
    mrope = _default_mrope(cls, {**values, **changed})
    if mrope is not None:
        changed["rope_parameters"] = mrope
    for name, v in overrides.items():
        if not isinstance(v, dict) or not _is_config(values.get(name)):
            changed[name] = v
    return cls(**changed)


def _unset(values: dict[str, Any], heads: int) -> dict[str, Any]:
    """Fields a released config leaves unset (None) although its model needs them: the vocabulary
    size, an explicit head_dim, and in a config that names some mixture-of-experts field, the
    others (the default config's model would not build either)."""
    out: dict[str, Any] = {}
    moe = any(v is not None for k, v in values.items() if _is_experts(k) or _is_top_k(k))
    for name, v in values.items():
        if v is not None:
            continue
        if _is_vocab(name) and name.endswith("vocab_size"):
            out[name] = VOCAB
        elif name == "head_dim" and heads > 0:
            out[name] = HEAD_DIM
        elif moe and _is_experts(name):
            out[name] = EXPERTS
        elif moe and _is_top_k(name):
            out[name] = TOP_K
    return out


def _fit_windows(values: dict[str, Any]) -> dict[str, Any]:
    """Swin-like stages (a depths list): windows of WINDOW patches, and an image that leaves the
    last stage at least one window wide (image >= patch * window * 2^(stages - 1)), else the
    model's relative-position tables part from its windows."""
    window, patch, image, depths = (values.get(k) for k in ("window_size", "patch_size", "image_size", "depths"))
    if not all(isinstance(x, int) for x in (window, patch, image)) or not isinstance(depths, (list, tuple)):
        return {}
    window = min(window, WINDOW)
    need = patch * window * 2 ** (len(depths) - 1)
    return {"window_size": window, "image_size": max(image, need)}


def _default_mrope(cls: type, values: dict[str, Any]) -> dict[str, Any] | None:
    """Multimodal rotary sections the model reads with a code default sized for the released head
    dim ([16, 24, 24]) when the config has none: given explicitly, summing to HEAD_DIM / 2."""
    rope = values.get("rope_parameters")
    if "mrope_section" not in getattr(cls, "ignore_keys_at_rope_validation", ()) or not isinstance(rope, dict):
        return None
    if "mrope_section" in rope:
        return None
    half = _rotary_half(rope, values)
    return {**rope, "mrope_section": [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]}


def _rotary_half(rope: dict[str, Any], values: dict[str, Any]) -> int:
    """Half the rotary dims of a HEAD_DIM head (a partial rotary factor rotates part of it)."""
    factor = rope.get("partial_rotary_factor", values.get("partial_rotary_factor")) or 1.0
    return max(1, int(HEAD_DIM * float(factor)) // 2)


def _shrink_rope(rope: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Rotary parameters: multimodal sections (summing to half the head dim) rescaled to HEAD_DIM."""
    out: dict[str, Any] = {}
    for k, v in rope.items():
        if isinstance(v, dict):
            out[k] = _shrink_rope(v, values)
        elif k == "original_max_position_embeddings" and isinstance(v, int):
            out[k] = min(v, POSITIONS // 2)  # YaRN/LongRoPE: extended from half the tiny context
        elif k in ("mrope_section", "mrope_sections") and isinstance(v, list) and v:
            half = _rotary_half(rope, values)
            total = sum(v)
            scaled = [max(1, x * half // total) for x in v]
            scaled[0] += half - sum(scaled)
            out[k] = scaled
        else:
            out[k] = v
    return out


def tiny_config(model_type: str) -> Any:
    """CONFIG_MAPPING[model_type]()'s defaults, shrunk, with the type's overrides applied
    (a diffusers type: its constructor's arguments, diffusers_models.py)."""
    from transformers import CONFIG_MAPPING

    from . import diffusers_models

    if diffusers_models.is_diffusers(model_type):
        return diffusers_models.tiny_config(model_type)

    return shrink(CONFIG_MAPPING[model_type](), overrides=CONFIG_OVERRIDES.get(model_type, {}))


def default_config(model_type: str) -> Any:
    from transformers import CONFIG_MAPPING

    from . import diffusers_models

    if diffusers_models.is_diffusers(model_type):
        return diffusers_models.default_config(model_type)

    return CONFIG_MAPPING[model_type]()
