"""The tiny vision-language lab shared by the VLM papers (MoDA, Align-TI): entangled scenes, a real HF LLaVA.

Everything a CPU reproduction of a LLaVA-family method needs, built from ``transformers`` configs:

- **Scenes with entangled patches** (``SceneSpec``, ``sample_scenes``, ``render``): a ``grid`` x ``grid`` image of
  ``patch`` x ``patch`` pixel patches, and **each patch holds two objects** (a left and a right one), each a
  shape in {square, circle, triangle, cross} and a colour in {red, green, blue, yellow}. A patch encoder
  therefore mixes two objects into one token: the "semantic entanglement" MoDA is about. Scenes are attribute
  arrays ``(n, patches, side, [colour, shape])``; rendering is vectorised (sprites pasted by fancy indexing) with
  pixel noise and vertical jitter.
- **Questions** (``make_items``, ``item_for``), one ``Item`` per scene, in families:

  ==============  ==============================================  ================================  ======
  family          prompt                                          answer                            tokens
  ==============  ==============================================  ================================  ======
  ``attribute``   ``what color is the left object in patch 3``    ``red``                           1
  ``object``      ``describe the right object in patch 3``        ``blue circle``                   2
  ``patch``       ``describe patch 3``                            ``red square and blue circle``    5
  ``count``       ``how many red objects are there ?``            ``4``                             1
  ``caption``     ``caption .``                                   ``patch 0 red square blue ...``   5 G^2
  ==============  ==============================================  ================================  ======

  The patch index ends the prompts that name one, so a one-layer LM can ground it in one attention hop.
  ``mmvp_pairs`` makes MMVP-style pairs: two scenes that differ only in the attribute a question asks about,
  the same question, different answers (a pair counts when both are right). ``Item.entangled`` marks a
  question whose answer differs from the same attribute of the *other* object in the same patch (reading "a
  colour in patch p" is then not enough). ``item_id`` names a question by its scene and prompt (the papers'
  unit ids); ``recording_sampler`` is ``instruction_sampler`` that also records the ids it trains on.
- **The model** (``VLMSpec``, ``tiny_vlm``): a real ``LlavaForConditionalGeneration``: a tiny SigLIP vision
  tower (one token per scene patch, learned position embedding, no CLS; LLaVA reads its last layer, strategy
  ``"full"``), LLaVA's ``mlp2x_gelu`` projector (``LlavaMultiModalProjector``) and a tiny Llama from a
  ``LlamaConfig``; ``vlm_tokenizer()`` is a word-level ``PreTrainedTokenizerFast`` (66 words) with an ``<image>``
  token. ``VLMSpec.attn_implementation`` defaults to ``"eager"`` so attention maps exist (Align-TI's IVA);
  ``"sdpa"`` is faster for training only.
- **The recipe** (``LabRecipe``, ``lab_vlm``): stage 0, the vision tower is briefly pretrained on per-patch
  attribute recognition (linear heads for the four attributes and the patch index, thrown away), then frozen
  for good (``pretrain_encoder``, ``encoder_for``: shared by every model with the same vision settings); LLaVA
  stage 1 (alignment) on captions (``"patch"`` descriptions); LLaVA stage 2 (instruction tuning) optional, with
  ``train_vlm`` for anything custom (adapters via ``extra_params``, auxiliary losses via ``extra_loss``). LLaVA's
  stage 1 trains the projector alone because its LLM was pretrained on text; the lab's LM has never read
  anything, so ``stage1_trainable`` defaults to ``"projector+lm"`` (pass ``"projector"`` for LLaVA's rule on a
  pretrained LM). Schedules are LLaVA's (AdamW, warm-up 3 %, cosine). ``grid_recipe`` is the papers' recipe
  shape (square grid, 4 heads, MLP width ``2 * hidden``). ``lab_vlm`` caches each result keyed by every field of
  the recipe and ``LAB_VERSION`` (``cached_vlm``: ``common.cache``, in ``$ICML26_CACHE`` or ``~/.cache/icml26``,
  atomic and self-healing); training is deterministic under its seed, so a cache hit is what a retrain would give.
- **Batches and scores**: ``encode`` gives LLaVA inputs (``<s>``, ``N`` image tokens, prompt, answer, ``</s>``;
  right padding; ``labels`` = -100 on the prompt, LLaVA's convention); ``score_items`` gives per-item exact match
  (every answer token and ``</s>`` argmax-correct under teacher forcing, which is exactly "greedy decoding
  returns the answer and stops"; tested against ``generate``) and token accuracy; ``probe_encoder`` the
  information ceiling of the frozen tokens.

For a teacher and a student (Align-TI): two recipes with the same ``scenes``, vision sizes, ``encoder_steps``,
``batch_size`` and ``seed`` share the frozen encoder and the tokenizer (so the vocabulary), e.g.
``LabRecipe(spec=VLMSpec(hidden=128, layers=4), stage2_steps=3000, stage2_families=("object", "patch", "count"))``
for a cached teacher and ``LabRecipe(spec=VLMSpec(hidden=64, layers=1))`` for a student to distil from its
stage-1 checkpoint.

One torch thread by default on this machine (set by ``icml26 reproduce``). Needs the ``hf`` extra.

Example:
    >>> import numpy as np
    >>> spec = SceneSpec(grid=2)
    >>> attrs = sample_scenes(spec, np.random.default_rng(0), 3)
    >>> attrs.shape, render(spec, attrs, np.random.default_rng(0)).shape
    ((3, 4, 2, 2), (3, 3, 16, 16))
    >>> item = make_items(spec, attrs, np.random.default_rng(1), "object")[0]
    >>> item.prompt, item.answer
    ('describe the right object in patch 1', 'red square')
    >>> tok = vlm_tokenizer()
    >>> model = tiny_vlm(tok, VLMSpec(), spec, seed=0)
    >>> batch = encode(tok, [item], spec, attrs[:1], np.random.default_rng(0))
    >>> type(model).__name__, tuple(model(**batch).logits.shape)
    ('LlavaForConditionalGeneration', (1, 15, 66))
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .cache import cache_dir as cache_dir  # re-exported: the papers read their cache folder from here
from .cache import cached_entry
from .optional import requires
from .progress import progress

#: bump when a change to this module changes what a cached lab model would be
LAB_VERSION = 1

COLORS = ("red", "green", "blue", "yellow")
SHAPES = ("square", "circle", "triangle", "cross")
SIDES = ("left", "right")
ATTRIBUTES = ("color", "shape")
FAMILIES = ("attribute", "object", "patch", "count", "caption")
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>", "<image>")
IGNORE_INDEX = -100
MAX_PATCHES = 16
_WORDS = (*COLORS, *SHAPES, *SIDES, *ATTRIBUTES, *(str(i) for i in range(2 * MAX_PATCHES + 1)),
          "what", "is", "the", "object", "in", "patch", "describe", "and", "how", "many", "objects", "are", "there",
          "caption", "?", ".")

_RGB = np.array([[0.92, 0.12, 0.10], [0.10, 0.78, 0.22], [0.15, 0.30, 0.95], [0.95, 0.88, 0.10]], dtype=np.float32)
_SPRITES = np.array([
    [[1, 1, 1, 1], [1, 0, 0, 1], [1, 0, 0, 1], [1, 1, 1, 1]],   # square (hollow)
    [[0, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 0]],   # circle
    [[0, 0, 0, 1], [0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 1]],   # triangle
    [[1, 0, 0, 1], [0, 1, 1, 0], [0, 1, 1, 0], [1, 0, 0, 1]],   # cross
], dtype=np.float32)


def _quiet_transformers() -> Any:
    transformers = requires("transformers", extra="hf", purpose="the tiny vision-language lab")
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    return transformers


# ------------------------------------------------------------------------------------------------------ scenes
@dataclass(frozen=True)
class SceneSpec:
    """The scene family: ``grid`` x ``grid`` patches of ``patch`` pixels, two objects per patch."""

    grid: int = 3
    """patches per side (the image has ``grid**2`` visual tokens)"""
    patch: int = 8
    """pixels per patch side (>= 8: each object is a 4 x 4 sprite in one half of its patch)"""
    noise: float = 0.08
    """standard deviation of the Gaussian pixel noise"""
    jitter: bool = True
    """place each sprite at a random height inside its half-patch"""

    def __post_init__(self) -> None:
        if not 1 <= self.grid or self.grid**2 > MAX_PATCHES:
            raise ValueError(f"grid must be in 1..{int(MAX_PATCHES**0.5)}, got {self.grid}")
        if self.patch < 8 or self.patch % 2:
            raise ValueError(f"patch must be an even number >= 8, got {self.patch}")
        if self.noise < 0:
            raise ValueError(f"noise must be >= 0, got {self.noise}")

    @property
    def n_patches(self) -> int:
        return self.grid**2

    @property
    def image_size(self) -> int:
        return self.grid * self.patch


def sample_scenes(spec: SceneSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random scenes as attributes ``(n, patches, 2 sides, 2)`` int64: ``[..., 0]`` colour, ``[..., 1]`` shape."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return rng.integers(0, 4, size=(n, spec.n_patches, 2, 2))


def render(spec: SceneSpec, attrs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Images ``(n, 3, H, W)`` float32, centred (pixel - 0.5), of scenes ``attrs`` (vectorised sprite pasting)."""
    attrs = np.asarray(attrs)
    if attrs.ndim != 4 or attrs.shape[1:] != (spec.n_patches, 2, 2):
        raise ValueError(f"attrs must have shape (n, {spec.n_patches}, 2, 2), got {attrs.shape}")
    n, g, p = attrs.shape[0], spec.grid, spec.patch
    half = p // 2
    canvas = np.zeros((n, g * g, 2, p, half, 3), dtype=np.float32)          # (scene, patch, side, row, col, rgb)
    span = p - 4
    top = rng.integers(0, span + 1, size=(n, g * g, 2)) if spec.jitter else np.full((n, g * g, 2), span // 2)
    left = (half - 4) // 2
    sprite = _SPRITES[attrs[..., 1]][..., None] * _RGB[attrs[..., 0]][:, :, :, None, None, :]  # (n,P,2,4,4,3)
    rows = top[..., None] + np.arange(4)                                      # (n, P, 2, 4)
    i0, i1, i2 = np.meshgrid(np.arange(n), np.arange(g * g), np.arange(2), indexing="ij")
    canvas[i0[..., None, None], i1[..., None, None], i2[..., None, None], rows[..., :, None],
           left + np.arange(4)[None, None, None, None, :]] = sprite
    img = canvas.transpose(0, 1, 3, 2, 4, 5).reshape(n, g, g, p, p, 3)      # sides side by side in a patch
    img = img.transpose(0, 1, 3, 2, 4, 5).reshape(n, g * p, g * p, 3)
    if spec.noise:
        img = img + rng.normal(0.0, spec.noise, size=img.shape).astype(np.float32)
    return np.ascontiguousarray(img.transpose(0, 3, 1, 2) - 0.5, dtype=np.float32)


# --------------------------------------------------------------------------------------------------- questions
@dataclass(frozen=True)
class Item:
    """One question about one scene, with its answer and what it asks about."""

    prompt: str
    answer: str
    family: str
    patch: int = -1
    """the patch asked about (-1: none)"""
    side: int = -1
    """0 left, 1 right (-1: none)"""
    attribute: int = -1
    """0 colour, 1 shape (-1: none)"""
    entangled: bool = False
    """the other object in the same patch has a different value of the asked attribute"""


def _describe(attrs_obj: np.ndarray) -> str:
    return f"{COLORS[int(attrs_obj[0])]} {SHAPES[int(attrs_obj[1])]}"


def item_for(spec: SceneSpec, scene: np.ndarray, family: str, patch: int = 0, side: int = 0, attribute: int = 0,
             value: int = 0) -> Item:
    """The item of ``family`` about ``scene`` (attributes ``(patches, 2, 2)``) for the given choices.

    ``value`` is the colour counted by ``count``; ``patch``/``side``/``attribute`` pick what the other families ask.
    """
    if family == "attribute":
        word = ATTRIBUTES[attribute]
        answer_id = int(scene[patch, side, attribute])
        other = int(scene[patch, 1 - side, attribute])
        ans = (COLORS if attribute == 0 else SHAPES)[answer_id]
        return Item(f"what {word} is the {SIDES[side]} object in patch {patch}", ans, family, patch, side,
                    attribute, entangled=other != answer_id)
    if family == "object":
        return Item(f"describe the {SIDES[side]} object in patch {patch}", _describe(scene[patch, side]), family,
                    patch, side, entangled=bool((scene[patch, 0] != scene[patch, 1]).any()))
    if family == "patch":
        return Item(f"describe patch {patch}", f"{_describe(scene[patch, 0])} and {_describe(scene[patch, 1])}",
                    family, patch)
    if family == "count":
        count = int((scene[:, :, 0] == value).sum())
        return Item(f"how many {COLORS[value]} objects are there ?", str(count), family, attribute=0)
    if family == "caption":
        parts = [f"patch {p} {_describe(scene[p, 0])} {_describe(scene[p, 1])}" for p in range(spec.n_patches)]
        return Item("caption .", " ".join(parts), family)
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


def make_items(spec: SceneSpec, attrs: np.ndarray, rng: np.random.Generator, family: str | Sequence[str]
               ) -> list[Item]:
    """One random question per scene; ``family`` is a family name or a list to draw from uniformly."""
    families = [family] if isinstance(family, str) else list(family)
    bad = [f for f in families if f not in FAMILIES]
    if not families or bad:
        raise ValueError(f"family must be among {FAMILIES}, got {family!r}")
    n = len(attrs)
    fam = rng.integers(0, len(families), size=n)
    patch = rng.integers(0, spec.n_patches, size=n)
    side = rng.integers(0, 2, size=n)
    attribute = rng.integers(0, 2, size=n)
    value = rng.integers(0, 4, size=n)
    return [item_for(spec, attrs[i], families[fam[i]], int(patch[i]), int(side[i]), int(attribute[i]),
                     int(value[i])) for i in range(n)]


def item_id(scene: np.ndarray, prompt: str) -> str:
    """What a question is: a hash of its scene's attributes and its prompt (the same question about the same scene
    has the same id whatever the rendering noise; a different scene or question, a different id). The papers'
    ``SeedRun.unit_ids`` and ``held_out`` are these ids."""
    body = np.ascontiguousarray(scene, dtype=np.int64).tobytes() + prompt.encode()
    return hashlib.sha1(body).hexdigest()[:12]


def item_ids(attrs: np.ndarray, items: Sequence[Item]) -> list[str]:
    """``item_id`` of each question, ``items[i]`` about scene ``attrs[i]``."""
    return [item_id(a, it.prompt) for a, it in zip(attrs, items, strict=True)]


def mmvp_pairs(spec: SceneSpec, rng: np.random.Generator, n_pairs: int, family: str = "attribute"
               ) -> tuple[np.ndarray, list[Item]]:
    """MMVP-style pairs: scenes ``(2 n_pairs, ...)`` and items, pair ``k`` at rows ``2k`` and ``2k + 1``.

    The two scenes of a pair differ only in the asked attribute of the asked object (a different value drawn
    uniformly), the question is the same and the answers differ; ``family`` is ``"attribute"`` or ``"object"``.
    """
    if family not in ("attribute", "object"):
        raise ValueError(f"family must be 'attribute' or 'object', got {family!r}")
    base = sample_scenes(spec, rng, n_pairs)
    patch = rng.integers(0, spec.n_patches, size=n_pairs)
    side = rng.integers(0, 2, size=n_pairs)
    attribute = rng.integers(0, 2, size=n_pairs)
    shift = rng.integers(1, 4, size=n_pairs)
    twin = base.copy()
    k = np.arange(n_pairs)
    twin[k, patch, side, attribute] = (base[k, patch, side, attribute] + shift) % 4
    scenes = np.stack([base, twin], axis=1).reshape(2 * n_pairs, *base.shape[1:])
    items = [item_for(spec, scenes[i], family, int(patch[i // 2]), int(side[i // 2]), int(attribute[i // 2]))
             for i in range(2 * n_pairs)]
    return scenes, items


# ---------------------------------------------------------------------------------------------------- tokenizer
def vlm_tokenizer() -> Any:
    """A word-level ``PreTrainedTokenizerFast`` over the lab's words (whitespace split) with ``<image>``."""
    _quiet_transformers()
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *_WORDS])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>", extra_special_tokens={"image_token": "<image>"})
    return tok


def _ids(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.convert_tokens_to_ids(text.split())
    if tokenizer.unk_token_id in ids:
        raise ValueError(f"text has words outside the lab vocabulary: {text!r}")
    return ids


# -------------------------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class VLMSpec:
    """Sizes of a lab VLM (vision tower, projector, language model)."""

    hidden: int = 64
    """width of the language model (and of the projector's output)"""
    layers: int = 2
    """language-model layers"""
    heads: int = 4
    """language-model attention heads"""
    intermediate: int = 128
    """language-model MLP width"""
    vision_hidden: int = 32
    """width of the vision tower (its tokens are the projector's input)"""
    vision_layers: int = 1
    """vision-tower layers"""
    vision_heads: int = 2
    """vision-tower attention heads"""
    attn_implementation: str = "eager"
    """``"eager"`` (attention maps available, e.g. for Align-TI) or ``"sdpa"``"""


def tiny_vlm(tokenizer: Any, spec: VLMSpec, scenes: SceneSpec, *, seed: int = 0) -> Any:
    """A randomly initialised ``LlavaForConditionalGeneration`` (SigLIP tower, LLaVA projector, Llama), seeded."""
    tf = _quiet_transformers()
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    vision = tf.SiglipVisionConfig(hidden_size=spec.vision_hidden, intermediate_size=2 * spec.vision_hidden,
                                   num_hidden_layers=spec.vision_layers, num_attention_heads=spec.vision_heads,
                                   image_size=scenes.image_size, patch_size=scenes.patch, num_channels=3,
                                   vision_use_head=False)
    text = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=spec.hidden, intermediate_size=spec.intermediate,
                          num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                          num_key_value_heads=spec.heads, max_position_embeddings=128,
                          pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                          eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    config = tf.LlavaConfig(vision_config=vision, text_config=text, image_token_id=image_id,
                            image_seq_length=scenes.n_patches, vision_feature_layer=-1,
                            vision_feature_select_strategy="full", projector_hidden_act="gelu",
                            tie_word_embeddings=False)
    config._attn_implementation = spec.attn_implementation
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tf.LlavaForConditionalGeneration(config)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


# ------------------------------------------------------------------------------------------------------ batches
def encode(tokenizer: Any, items: Sequence[Item], spec: SceneSpec, attrs: np.ndarray | None,
           rng: np.random.Generator | None = None, *, images: np.ndarray | None = None,
           with_answer: bool = True) -> dict[str, torch.Tensor]:
    """LLaVA inputs for ``items`` on scenes ``attrs`` (rendered with ``rng``) or on ready ``images``.

    Layout per row: ``<s> <image> x N prompt answer </s>``, right-padded; ``labels`` is -100 everywhere but on the
    answer and ``</s>`` (LLaVA's convention: the prompt side is -100). ``with_answer=False`` leaves the answer
    out (generation prompts) and returns no labels.
    """
    if images is None:
        if attrs is None or rng is None:
            raise ValueError("give attrs and rng, or images")
        images = render(spec, attrs, rng)
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    visual = [[image_id] * spec.n_patches] * len(images)
    if len(visual) != len(items):
        raise ValueError(f"{len(items)} items but {len(visual)} images")
    rows, labels = [], []
    for it, vis in zip(items, visual, strict=True):
        prompt = [tokenizer.bos_token_id, *vis, *_ids(tokenizer, it.prompt)]
        answer = [*_ids(tokenizer, it.answer), tokenizer.eos_token_id] if with_answer else []
        rows.append(prompt + answer)
        labels.append([IGNORE_INDEX] * len(prompt) + answer)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(lb)] = torch.tensor(lb)
        att[i, : len(r)] = 1
    out = {"input_ids": ids, "attention_mask": att, "pixel_values": torch.from_numpy(images)}
    if with_answer:
        out["labels"] = lab
    return out


def answer_mask(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(B, T-1)`` bool: positions whose next token is an answer token (or ``</s>``)."""
    return batch["labels"][:, 1:] != IGNORE_INDEX


def segment_masks(tokenizer: Any, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``(B, T)`` bool masks of each row's segments: ``image`` (the visual tokens), ``instruction`` (the prompt
    words), ``answer`` (answer tokens and ``</s>``, when the batch has labels) and ``pad``."""
    ids = batch["input_ids"]
    image = ids == tokenizer.convert_tokens_to_ids("<image>")
    pad = batch["attention_mask"] == 0
    answer = batch["labels"] != IGNORE_INDEX if "labels" in batch else torch.zeros_like(image)
    instruction = ~(image | pad | answer | (ids == tokenizer.bos_token_id))
    return {"image": image, "instruction": instruction, "answer": answer, "pad": pad}


@torch.no_grad()
def score_items(model: Any, batch: dict[str, torch.Tensor]) -> tuple[np.ndarray, np.ndarray]:
    """Per-item exact match and token accuracy of the answer (incl. ``</s>``) under teacher forcing.

    Exact match (every answer token argmax-correct given the true prefix) equals "greedy decoding returns exactly
    the answer and stops": greedy decoding follows the true prefix as long as each argmax is right.
    """
    model.eval()
    # labels go in too: an adapter that reads the instruction (MoDA) must see which tokens are the prompt
    logits = model(**batch).logits[:, :-1]
    target = batch["labels"][:, 1:]
    mask = target != IGNORE_INDEX
    right = (logits.argmax(-1) == target) & mask
    n = mask.sum(-1)
    exact = (right.sum(-1) == n).double().numpy()
    token = (right.sum(-1).double() / n.clamp(min=1)).numpy()
    return exact, token


# ------------------------------------------------------------------------------------------------------ training
def trainable_parameters(model: Any, trainable: str, extra: Iterable[torch.nn.Parameter] = ()) -> list[Any]:
    """Set ``requires_grad`` for a LLaVA stage and return the trained parameters.

    ``trainable``: ``"projector"`` (LLaVA stage 1), ``"projector+lm"`` (stage 2: projector, LM and LM head), or
    ``"lm"``; the vision tower is always frozen. ``extra``: parameters of modules attached to the model (adapters)
    that are trained too.
    """
    if trainable not in ("projector", "projector+lm", "lm"):
        raise ValueError(f"trainable must be 'projector', 'projector+lm' or 'lm', got {trainable!r}")
    for p in model.parameters():
        p.requires_grad_(False)
    groups = {"projector": [model.model.multi_modal_projector],
              "lm": [model.model.language_model, model.lm_head],
              "projector+lm": [model.model.multi_modal_projector, model.model.language_model, model.lm_head]}
    params = [p for m in groups[trainable] for p in m.parameters()]
    extra = list(extra)
    seen = {id(p) for p in params}
    params += [p for p in extra if id(p) not in seen]
    for p in params:
        p.requires_grad_(True)
    return params


def train_vlm(model: Any, sample: Callable[[np.random.Generator], dict[str, torch.Tensor]], *, steps: int,
              trainable: str = "projector+lm", extra_params: Iterable[torch.nn.Parameter] = (), lr: float = 2e-3,
              warmup: float = 0.03, seed: int = 0, desc: str | None = "train",
              extra_loss: Callable[[], torch.Tensor] | None = None,
              loss_fn: Callable[[Any, dict[str, torch.Tensor]], torch.Tensor] | None = None,
              callback: Callable[[int], None] | None = None) -> Any:
    """Next-token cross-entropy on the labelled tokens, AdamW with warm-up and cosine decay (LLaVA's schedule).

    Args:
        model: a lab ``LlavaForConditionalGeneration`` (possibly with an adapter attached).
        sample: ``sample(rng) -> batch`` (``encode`` output with labels); called once per step with a generator
            seeded by ``seed``, so the data stream is the same for every model trained with the same seed.
        steps: optimiser steps.
        trainable: which LLaVA parts train (``trainable_parameters``); the vision tower stays frozen.
        extra_params: further trained parameters (an adapter's).
        lr: peak learning rate.
        warmup: share of the steps spent in linear warm-up.
        seed: seeds the data stream and dropout.
        desc: progress-bar label (``None``: no bar).
        extra_loss: an additional term added to the loss each step (e.g. an adapter's auxiliary loss).
        loss_fn: ``loss_fn(model, batch) -> loss`` replacing the next-token loss (e.g. a distillation objective
            with a frozen teacher); ``None``: ``model(**batch).loss``.
        callback: called with the step number after each step (evaluation curves).
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    params = trainable_parameters(model, trainable, extra_params)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    n_warm = max(1, round(warmup * steps))

    def schedule(step: int) -> float:
        if step < n_warm:
            return (step + 1) / n_warm
        return 0.5 * (1.0 + np.cos(np.pi * (step - n_warm) / max(1, steps - n_warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    rng = np.random.default_rng(seed)
    model.train()
    model.model.vision_tower.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in progress(range(steps), desc=desc) if desc else range(steps):
            batch = sample(rng)
            loss = model(**batch).loss if loss_fn is None else loss_fn(model, batch)
            if extra_loss is not None:
                loss = loss + extra_loss()
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss is {float(loss)} at step {step}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            if callback is not None:
                callback(step + 1)
                model.train()
                model.model.vision_tower.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def pretrain_encoder(model: Any, scenes: SceneSpec, *, steps: int = 300, batch_size: int = 64, lr: float = 3e-3,
                     seed: int = 0) -> Any:
    """Briefly pretrain the vision tower on per-patch attribute recognition, then freeze it.

    Linear heads read, from each patch token, the colour and shape of its left and right object and the patch's
    index (cross entropy; CLIP-like encoders know where a patch is); the heads are thrown away. The tokens end up
    holding both objects of their patch (entangled) and their position.
    """
    tower = model.model.vision_tower
    width = tower.config.hidden_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # built inside the seeded block: its bias draw is the seed's, not the process's RNG history
        heads = torch.nn.Linear(width, 16 + scenes.n_patches)
        torch.nn.init.normal_(heads.weight, std=width**-0.5)
        params = [*tower.parameters(), *heads.parameters()]
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        rng = np.random.default_rng(seed)
        tower.train()
        for _ in range(steps):
            attrs = sample_scenes(scenes, rng, batch_size)
            x = torch.from_numpy(render(scenes, attrs, rng))
            h = tower(x, output_hidden_states=True).hidden_states[-1]           # what LLaVA reads (layer -1)
            out = heads(h)
            logits = out[..., :16].reshape(batch_size, scenes.n_patches, 4, 4)  # (side, attribute) x 4 values
            target = torch.from_numpy(attrs).view(batch_size, scenes.n_patches, 4)
            where = torch.arange(scenes.n_patches).repeat(batch_size)
            loss = (torch.nn.functional.cross_entropy(logits.reshape(-1, 4), target.reshape(-1))
                    + torch.nn.functional.cross_entropy(out[..., 16:].reshape(-1, scenes.n_patches), where))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    for p in tower.parameters():
        p.requires_grad_(False)
    tower.eval()
    return model


@torch.no_grad()
def probe_encoder(model: Any, scenes: SceneSpec, *, n_train: int = 2000, n_test: int = 1000, seed: int = 0
                  ) -> float:
    """Information ceiling of the frozen tokens: accuracy of a least-squares linear probe that reads each patch's
    four attributes from its own token (chance 0.25)."""
    rng = np.random.default_rng(seed)
    tower = model.model.vision_tower.eval()

    def feats(n: int) -> tuple[np.ndarray, np.ndarray]:
        attrs = sample_scenes(scenes, rng, n)
        h = tower(torch.from_numpy(render(scenes, attrs, rng)), output_hidden_states=True).hidden_states[-1]
        x = h.reshape(-1, h.shape[-1]).double().numpy()
        return np.hstack([x, np.ones((len(x), 1))]), attrs.reshape(-1, 4)

    xtr, ytr = feats(n_train)
    xte, yte = feats(n_test)
    correct = []
    for j in range(4):
        onehot = np.eye(4)[ytr[:, j]]
        w, *_ = np.linalg.lstsq(xtr, onehot, rcond=None)
        correct.append((xte @ w).argmax(1) == yte[:, j])
    return float(np.mean(correct))


def instruction_sampler(tokenizer: Any, scenes: SceneSpec, families: str | Sequence[str], batch_size: int
                        ) -> Callable[[np.random.Generator], dict[str, torch.Tensor]]:
    """``sample(rng) -> batch``: fresh scenes and one question each from ``families`` (for ``train_vlm``)."""
    def sample(rng: np.random.Generator) -> dict[str, torch.Tensor]:
        attrs = sample_scenes(scenes, rng, batch_size)
        return encode(tokenizer, make_items(scenes, attrs, rng, families), scenes, attrs, rng)

    return sample


def recording_sampler(tokenizer: Any, scenes: SceneSpec, families: str | Sequence[str], batch_size: int,
                      record: set[str] | None = None) -> Callable[[np.random.Generator], dict[str, torch.Tensor]]:
    """``instruction_sampler(tokenizer, scenes, families, batch_size)`` (the same draws in the same order), adding
    the ``item_id`` of every question it serves to ``record`` when given (a run's training questions, for its
    ``held_out`` split)."""
    if record is None:
        return instruction_sampler(tokenizer, scenes, families, batch_size)

    def sample(rng: np.random.Generator) -> dict[str, torch.Tensor]:
        attrs = sample_scenes(scenes, rng, batch_size)
        items = make_items(scenes, attrs, rng, families)
        record.update(item_ids(attrs, items))
        return encode(tokenizer, items, scenes, attrs, rng)

    return sample


# -------------------------------------------------------------------------------------------------------- recipe
@dataclass(frozen=True)
class LabRecipe:
    """Everything that determines a lab VLM: scenes, sizes, the stages' budgets, learning rates and seed."""

    scenes: SceneSpec = field(default_factory=SceneSpec)
    spec: VLMSpec = field(default_factory=VLMSpec)
    encoder_steps: int = 300
    """stage 0: per-patch pretraining of the vision tower (then frozen for good)"""
    stage1_steps: int = 800
    """LLaVA stage 1 (alignment) on ``stage1_families``"""
    stage1_families: tuple[str, ...] = ("patch",)
    """stage-1 data: patch descriptions, the lab's captions"""
    stage1_trainable: str = "projector+lm"
    """what stage 1 trains: ``"projector"`` is LLaVA's rule for a *pretrained* LLM; the lab's LM has never read
    anything, so by default it learns to read alongside the projector (see the module docstring)"""
    stage1_lr: float = 3e-3
    """stage-1 peak learning rate"""
    stage2_steps: int = 0
    """LLaVA stage 2 (instruction tuning, projector + LM) on ``stage2_families``; 0: stop after stage 1, e.g. to
    compare stage-2 variants (adapters, distillation losses) from one checkpoint"""
    stage2_families: tuple[str, ...] = ("attribute",)
    """stage-2 data"""
    stage2_lr: float = 2e-3
    """stage-2 peak learning rate"""
    batch_size: int = 64
    """scenes per step in every stage"""
    seed: int = 0
    """seed of the initialisation and of every stage's data stream"""

    def key(self) -> dict[str, Any]:
        """The cache key: every field, the lab version."""
        return {"lab": "tiny_vlm", "version": LAB_VERSION, **asdict(self)}


def grid_recipe(grid: int, hidden: int, layers: int, **fields: Any) -> LabRecipe:
    """The papers' lab recipe: ``grid x grid`` patches, a Llama of width ``hidden`` with ``layers`` layers, 4 heads
    and MLP width ``2 * hidden``; ``fields`` set the other ``LabRecipe`` fields (and ``attn_implementation``, the
    ``VLMSpec``'s)."""
    attn = fields.pop("attn_implementation", VLMSpec.attn_implementation)
    spec = VLMSpec(hidden=hidden, layers=layers, heads=4, intermediate=2 * hidden, attn_implementation=attn)
    return LabRecipe(scenes=SceneSpec(grid=grid), spec=spec, **fields)


def lab_vlm(recipe: LabRecipe, *, cache: bool = True, desc: str | None = "lab") -> tuple[Any, Any]:
    """``(model, tokenizer)`` after the recipe's stages, from the cache when it was built before.

    The frozen encoder depends only on the scenes, the vision sizes, ``encoder_steps``, ``batch_size`` and
    ``seed`` (``encoder_for``), so a teacher and a student with the same vision settings share it.
    """
    def build() -> tuple[Any, Any]:
        tok = vlm_tokenizer()
        model = tiny_vlm(tok, recipe.spec, recipe.scenes, seed=recipe.seed)
        model.model.vision_tower.load_state_dict(encoder_for(recipe, cache=cache))
        for p in model.model.vision_tower.parameters():
            p.requires_grad_(False)
        train_vlm(model, instruction_sampler(tok, recipe.scenes, recipe.stage1_families, recipe.batch_size),
                  steps=recipe.stage1_steps, trainable=recipe.stage1_trainable, lr=recipe.stage1_lr,
                  seed=recipe.seed + 1, desc=f"{desc} stage 1" if desc else None)
        if recipe.stage2_steps:
            train_vlm(model, instruction_sampler(tok, recipe.scenes, recipe.stage2_families, recipe.batch_size),
                      steps=recipe.stage2_steps, trainable="projector+lm", lr=recipe.stage2_lr,
                      seed=recipe.seed + 2, desc=f"{desc} stage 2" if desc else None)
        return model, tok

    if not cache:
        return build()
    return cached_vlm(recipe.key(), build)


def encoder_for(recipe: LabRecipe, *, cache: bool = True) -> dict[str, torch.Tensor]:
    """The state dict of the recipe's pretrained, frozen vision tower (stage 0), cached on its own."""
    spec = VLMSpec(vision_hidden=recipe.spec.vision_hidden, vision_layers=recipe.spec.vision_layers,
                   vision_heads=recipe.spec.vision_heads)
    key = {"lab": "tiny_vlm_encoder", "version": LAB_VERSION, "scenes": asdict(recipe.scenes),
           "vision": [spec.vision_hidden, spec.vision_layers, spec.vision_heads], "steps": recipe.encoder_steps,
           "batch_size": recipe.batch_size, "seed": recipe.seed}

    def build() -> tuple[Any, Any]:
        tok = vlm_tokenizer()
        model = tiny_vlm(tok, spec, recipe.scenes, seed=recipe.seed)
        pretrain_encoder(model, recipe.scenes, steps=recipe.encoder_steps, batch_size=recipe.batch_size,
                         seed=recipe.seed)
        return model, tok

    model, _ = cached_vlm(key, build) if cache else build()
    return copy.deepcopy(model.model.vision_tower.state_dict())


# --------------------------------------------------------------------------------------------------------- cache
def save_vlm(model: Any, tokenizer: Any, path: str | os.PathLike[str]) -> Path:
    """``save_pretrained`` model and tokenizer into the directory ``path`` (``tiny_lm.save_lab_model``)."""
    from .tiny_lm import save_lab_model

    return save_lab_model(model, tokenizer, path)


def load_vlm(path: str | os.PathLike[str]) -> tuple[Any, Any]:
    """Load a saved lab VLM with ``from_pretrained(path, local_files_only=True)`` (never the hub)."""
    _quiet_transformers()
    from transformers import AutoTokenizer, LlavaForConditionalGeneration

    if not Path(path, "config.json").is_file():
        raise FileNotFoundError(f"{path} holds no saved model (config.json missing)")
    model = LlavaForConditionalGeneration.from_pretrained(path, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval(), tokenizer


def cached_vlm(key: dict[str, Any], build: Callable[[], tuple[Any, Any]]) -> tuple[Any, Any]:
    """``load_vlm`` of the directory keyed by ``key``, building and saving it atomically on a miss.

    ``key`` must hold everything that determines the model (recipe, sizes, steps, seeds, lab version). Faults
    (a corrupt entry healed, a read-only cache run uncached, ...) are ``common.cache.cached_entry``'s.
    """
    return cached_entry("tiny_vlm", key, build, save=lambda pair, path: save_vlm(*pair, path), load=load_vlm)
