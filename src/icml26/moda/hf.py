"""MoDA inside a ``transformers`` LLaVA-family model: ``attach_moda`` and the ``from_pretrained`` round trip.

``attach_moda(model, adapter)`` registers the adapter as the submodule ``moda`` of the LLaVA core model
(``model.model.moda`` for ``LlavaForConditionalGeneration``) and wraps the projector's output:

    V = projector(vision_tower(pixels));  V~ = adapter(V, T, pad)

where ``T`` are the language model's input embeddings (``embed_tokens``) of the **instruction**: the tokens
that are neither image placeholders nor padding and, when ``labels`` are passed (training), whose label is -100
(the prompt side), i.e. the official rule (``labels == -100`` minus the image token) with a key-padding mask
added. ``attach_moda(..., response_template=ids)`` (the token ids that open the assistant's turn, e.g. the ids of
LLaVA-1.5's ``"ASSISTANT:"``) also cuts each row after the last occurrence of the template, with or without
labels, so a teacher-forced forward without labels (scoring) never shows the answer to the gate. Without labels
and without a template every non-image, non-padding token counts: right for prompt-only inputs (``generate``
passes the prompt), a leak of the answer for a prompt + answer input. The adapter is moved to the projector's
dtype and device when attached (a float32 adapter on a bfloat16 model runs in bfloat16). The adapter is
looked up by name on every call, so PEFT's ``modules_to_save=["moda"]`` (which replaces it by a trainable copy)
works; it must then be saved with the adapter. LLaVA-NeXT (any-resolution crops) is refused.

Saved with ``save_pretrained``, the checkpoint holds the adapter's weights under ``model.moda.*`` and its
constructor arguments in ``config.moda``; ``from_pretrained_with_moda(path)`` rebuilds and re-attaches it (a
plain ``from_pretrained`` gives the model without MoDA).

Example:
    >>> import torch, transformers as tf
    >>> from icml26.moda import MoDAAdapter, attach_moda
    >>> cfg = tf.LlavaConfig(vision_config=tf.SiglipVisionConfig(hidden_size=16, intermediate_size=32,
    ...     num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8, vision_use_head=False),
    ...     text_config=tf.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
    ...     num_attention_heads=4, num_key_value_heads=4), image_token_id=39, image_seq_length=4,
    ...     vision_feature_layer=-1, vision_feature_select_strategy="full")
    >>> model = attach_moda(tf.LlavaForConditionalGeneration(cfg), MoDAAdapter(32, num_heads=4, ff_dim=16))
    >>> ids = torch.tensor([[1, 39, 39, 39, 39, 5, 6, 7]])
    >>> out = model(input_ids=ids, pixel_values=torch.randn(1, 3, 16, 16))
    >>> tuple(model.model.moda.last_mask.shape)
    (1, 4, 32)
"""

from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..common.optional import requires
from .module import MoDAAdapter

IGNORE_INDEX = -100
ADAPTER_NAME = "moda"
_STATE = "_icml26_moda"


def _core(model: nn.Module) -> nn.Module:
    """The module that owns ``multi_modal_projector`` (LlavaModel inside LlavaForConditionalGeneration)."""
    for candidate in (model, getattr(model, "model", None)):
        if candidate is not None and isinstance(getattr(candidate, "multi_modal_projector", None), nn.Module):
            return candidate
    raise TypeError(f"{type(model).__name__} has no multi_modal_projector (model.model.multi_modal_projector): "
                    "attach_moda supports LLaVA-1.5-style models (LlavaForConditionalGeneration, LlavaModel)")


def _check_supported(core: nn.Module, model: nn.Module) -> None:
    """Refuse LLaVA-NeXT-style cores: their projector output holds several any-resolution crops per image, which
    are then unpadded and joined by ``image_newline`` tokens, so one projector row is not one image's tokens."""
    name = type(model).__name__
    if hasattr(core, "image_newline") or "LlavaNext" in name or "LlavaOnevision" in name:
        raise TypeError(f"{type(model).__name__} is not supported: attach_moda supports LLaVA-1.5-style models "
                        "(LlavaForConditionalGeneration, LlavaModel), one projector output per image; LLaVA-NeXT's "
                        "any-resolution crops (image_newline) are not mapped to their instructions")


def _image_token_id(model: nn.Module) -> int:
    cfg = model.config
    for name in ("image_token_id", "image_token_index"):
        value = getattr(cfg, name, None)
        if isinstance(value, int):
            return value
    raise TypeError(f"{type(model).__name__}.config has no image_token_id")


def _check_template(response_template: Any) -> tuple[int, ...] | None:
    if response_template is None:
        return None
    if isinstance(response_template, (str, bytes)) or not hasattr(response_template, "__iter__"):
        raise TypeError("response_template must be a sequence of token ids (ints), got "
                        f"{type(response_template).__name__}")
    ids = tuple(response_template)
    if not ids:
        raise ValueError("response_template is empty: give the token ids that open the assistant's turn")
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise TypeError(f"response_template must hold non-negative int token ids, got {list(ids)}")
    return ids


def after_response_template(input_ids: Tensor, response_template: tuple[int, ...],
                            valid: Tensor | None = None) -> Tensor:
    """``(B, T)`` bool: the positions after the end of each row's last ``response_template`` occurrence (the
    response); all False in a row without it.

    Example:
        >>> after_response_template(torch.tensor([[1, 7, 8, 9, 7, 8, 5, 6], [1, 2, 3, 4, 5, 6, 7, 9]]), (7, 8)).int()
        tensor([[0, 0, 0, 0, 0, 0, 1, 1],
                [0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.int32)
    """
    b, t = input_ids.shape
    m = len(response_template)
    out = torch.zeros(b, t, dtype=torch.bool, device=input_ids.device)
    if t < m:
        return out
    tmpl = torch.tensor(response_template, dtype=input_ids.dtype, device=input_ids.device)
    hit = (input_ids.unfold(1, m, 1) == tmpl).all(-1)  # (B, T - m + 1): a template starts here
    if valid is not None:
        hit &= valid.bool().unfold(1, m, 1).all(-1)
    starts = torch.arange(t - m + 1, device=input_ids.device)
    last = torch.where(hit, starts, torch.full_like(starts, -1)).max(1).values
    pos = torch.arange(t, device=input_ids.device)[None, :]
    return (last[:, None] >= 0) & (pos >= (last + m)[:, None])


def instruction_embeddings(model: nn.Module, input_ids: Tensor, attention_mask: Tensor | None = None,
                           labels: Tensor | None = None, response_template: Any = None) -> tuple[Tensor, Tensor]:
    """``(T, pad)``: right-padded LM input embeddings of each row's instruction tokens and the padding mask.

    Instruction tokens: not the image placeholder, not padding (``attention_mask`` 0, or the pad id when no mask
    is given), when ``labels`` are given labelled -100 (the prompt side), and when ``response_template`` (token ids)
    is given not after the row's last occurrence of it (``after_response_template``), labels or not.

    Raises:
        ValueError: a row has no instruction token.
    """
    image_id = _image_token_id(model)
    keep = input_ids != image_id
    if attention_mask is not None:
        keep &= attention_mask.bool()
    else:
        pad_id = getattr(getattr(model.config, "text_config", model.config), "pad_token_id", None)
        if pad_id is None:
            pad_id = getattr(model.config, "pad_token_id", None)
        if pad_id is not None:
            keep &= input_ids != pad_id
    if labels is not None:
        if labels.shape != input_ids.shape:
            raise ValueError(f"labels has shape {tuple(labels.shape)} but input_ids has {tuple(input_ids.shape)}")
        keep &= labels == IGNORE_INDEX
    template = _check_template(response_template)
    if template is not None:
        keep &= ~after_response_template(input_ids, template, attention_mask)
    counts = keep.sum(1)
    if bool((counts == 0).any()):
        rows = (counts == 0).nonzero().flatten().tolist()
        raise ValueError(f"rows {rows[:10]} have an empty instruction: no prompt token besides image and padding")
    width = int(counts.max())
    # stable order: instruction tokens first, in their original order
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :width]
    ids = torch.gather(input_ids, 1, order)
    pad = torch.arange(width, device=input_ids.device)[None, :] >= counts[:, None]
    text = model.get_input_embeddings()(ids.masked_fill(pad, 0))
    return text, pad


class _Context:
    """What the top-level forward saw, for the projector hook of the same call."""

    def __init__(self) -> None:
        self.input_ids: Tensor | None = None
        self.attention_mask: Tensor | None = None
        self.labels: Tensor | None = None
        self.active = False


def attach_moda(model: nn.Module, moda: nn.Module, *, text_source: str = "instruction",
                response_template: Any = None) -> nn.Module:
    """Insert ``moda`` after the projector of a ``transformers`` LLaVA-family model (in place; returns it).

    Args:
        model: e.g. ``LlavaForConditionalGeneration`` (or a module whose ``.model`` has ``multi_modal_projector``).
        moda: a ``MoDAAdapter``, or any module with its call signature ``(visual, text, text_padding_mask)``
            (the reproduction's comparison arms). Its ``embed_dim`` must equal the LM's hidden size.
        text_source: ``"instruction"`` (the only choice): prompt tokens, never the response.
        response_template: token ids opening the assistant's turn (e.g. ``tokenizer("ASSISTANT:",
            add_special_tokens=False).input_ids``); tokens after a row's last occurrence never reach the gate, with
            or without ``labels``. ``None``: only ``labels`` mark the response (see the module docstring).

    The adapter is moved to the projector's dtype and device (its parameters become, e.g., bfloat16).

    Returns:
        ``model``, whose forward now modulates the visual tokens with the instruction of the same call.

    Raises:
        TypeError: not a LLaVA-1.5-style model (LLaVA-NeXT is refused), ``moda`` is not an ``nn.Module``, or a
            ``response_template`` that is not token ids.
        ValueError: width mismatch, MoDA already attached, an unknown ``text_source`` or an empty template.
    """
    if text_source != "instruction":
        raise ValueError(f"text_source must be 'instruction' (prompt tokens only), got {text_source!r}")
    if not isinstance(moda, nn.Module):
        raise TypeError(f"moda must be an nn.Module, got {type(moda).__name__}")
    template = _check_template(response_template)
    core = _core(model)
    _check_supported(core, model)
    if hasattr(model, _STATE) or ADAPTER_NAME in core._modules:
        raise ValueError("this model already has a MoDA adapter attached")
    hidden = model.get_input_embeddings().embedding_dim
    width = getattr(moda, "embed_dim", None)
    if width is not None and width != hidden:
        raise ValueError(f"the adapter's embed_dim={width} differs from the language model's hidden size {hidden}")
    _image_token_id(model)
    proj = next(core.multi_modal_projector.parameters(), None)
    if proj is not None:
        # the adapter runs in the projector's dtype (bf16 models: bf16 adapters) on its device
        moda.to(device=proj.device, dtype=proj.dtype)
    core.add_module(ADAPTER_NAME, moda)
    ctx = _Context()
    signature = inspect.signature(model.forward)

    def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        bound = signature.bind_partial(*args, **kwargs).arguments
        ctx.input_ids = bound.get("input_ids")
        ctx.attention_mask = bound.get("attention_mask")
        ctx.labels = bound.get("labels")
        ctx.active = True

    def post_hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        ctx.input_ids = ctx.attention_mask = ctx.labels = None
        ctx.active = False

    def projector_hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        if not ctx.active:
            raise RuntimeError("the MoDA-wrapped projector was called outside the model's forward; call the model "
                               "(with input_ids) so the adapter sees the instruction")
        if ctx.input_ids is None:
            raise ValueError("MoDA needs input_ids to find the instruction (inputs_embeds alone are not enough)")
        text, pad = instruction_embeddings(model, ctx.input_ids, ctx.attention_mask, ctx.labels, template)
        n_tokens = output.shape[1]
        per_row = (ctx.input_ids == _image_token_id(model)).sum(1)
        if bool((per_row % n_tokens).any()):
            raise ValueError(f"image placeholders per row {per_row.tolist()} are not multiples of the {n_tokens} "
                             "tokens per image")
        owner = torch.repeat_interleave(torch.arange(len(per_row), device=per_row.device), per_row // n_tokens)
        if owner.numel() != output.shape[0]:
            raise ValueError(f"{output.shape[0]} images but {owner.numel()} image slots in input_ids")
        if owner.numel() != len(per_row) or bool((owner != torch.arange(len(owner), device=owner.device)).any()):
            text, pad = text[owner], pad[owner]
        adapter = getattr(core, ADAPTER_NAME)  # looked up per call: PEFT may have wrapped it
        return adapter(output, text.to(output.dtype), pad)

    handles = [model.register_forward_pre_hook(pre_hook, with_kwargs=True),
               model.register_forward_hook(post_hook, with_kwargs=True, always_call=True),
               core.multi_modal_projector.register_forward_hook(projector_hook)]
    object.__setattr__(model, _STATE, handles)
    original_generate = getattr(model, "generate", None)
    if callable(original_generate):
        # transformers' generate() encodes the images before the first forward (mm_encoder_outputs): give the
        # hook that call's prompt too
        def generate(*args: Any, **kwargs: Any) -> Any:
            ctx.input_ids = kwargs.get("input_ids", kwargs.get("inputs", args[0] if args else None))
            ctx.attention_mask = kwargs.get("attention_mask")
            ctx.labels = None
            ctx.active = True
            try:
                return original_generate(*args, **kwargs)
            finally:
                ctx.input_ids = ctx.attention_mask = ctx.labels = None
                ctx.active = False

        generate.__doc__ = original_generate.__doc__
        object.__setattr__(model, "generate", generate)
    if isinstance(moda, MoDAAdapter):
        model.config.moda = moda.config_dict()
    if template is not None:
        model.config.moda_response_template = list(template)
    return model


def detach_moda(model: nn.Module) -> nn.Module:
    """Remove an attached adapter (hooks, submodule and ``config.moda``); returns the model."""
    handles = getattr(model, _STATE, None)
    if handles is None:
        raise ValueError("this model has no MoDA adapter attached")
    for h in handles:
        h.remove()
    object.__delattr__(model, _STATE)
    model.__dict__.pop("generate", None)
    core = _core(model)
    del core._modules[ADAPTER_NAME]
    for key in ("moda", "moda_response_template"):
        if hasattr(model.config, key):
            delattr(model.config, key)
    return model


def get_moda(model: nn.Module) -> nn.Module:
    """The attached adapter (``model.model.moda``)."""
    core = _core(model)
    if ADAPTER_NAME not in core._modules:
        raise ValueError("this model has no MoDA adapter attached")
    return core._modules[ADAPTER_NAME]


def _checkpoint_tensors(path: Path, prefix: str) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
        else ["model.safetensors"]
    out: dict[str, Tensor] = {}
    for name in files:
        for key, value in load_file(str(path / name)).items():
            if key.startswith(prefix):
                out[key[len(prefix):]] = value
    return out


def from_pretrained_with_moda(path: str | os.PathLike[str], model_class: Any = None, **kwargs: Any) -> nn.Module:
    """``model_class.from_pretrained(path, **kwargs)`` with the saved MoDA adapter rebuilt and re-attached.

    ``model_class`` defaults to ``transformers.LlavaForConditionalGeneration``; ``local_files_only=True`` unless
    given. The checkpoint must come from ``save_pretrained`` of a model with ``attach_moda`` (``config.moda``).
    """
    transformers = requires("transformers", extra="moda", purpose="loading a LLaVA model with MoDA")
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} holds no saved model (config.json missing)")
    config = json.loads((path / "config.json").read_text())
    if "moda" not in config:
        raise ValueError(f"{path}/config.json has no 'moda' entry: the model was saved without an attached MoDA")
    model_class = model_class or transformers.LlavaForConditionalGeneration
    kwargs.setdefault("local_files_only", True)
    level = transformers.utils.logging.get_verbosity()
    transformers.utils.logging.set_verbosity_error()  # the adapter's keys are "unexpected" to the base class
    try:
        model = model_class.from_pretrained(path, **kwargs)
    finally:
        transformers.utils.logging.set_verbosity(level)
    moda = MoDAAdapter(**config["moda"])
    state = None
    for prefix in (f"model.{ADAPTER_NAME}.", f"{ADAPTER_NAME}."):
        state = _checkpoint_tensors(path, prefix)
        if state:
            break
    if not state:
        raise ValueError(f"{path} has config.moda but no adapter weights (model.{ADAPTER_NAME}.*)")
    moda.load_state_dict(state)
    param = next(model.parameters())
    moda.to(device=param.device, dtype=param.dtype)
    return attach_moda(model, moda.train(model.training), response_template=config.get("moda_response_template"))
