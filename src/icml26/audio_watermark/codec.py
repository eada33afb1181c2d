"""A small frame codec trained here (no pretrained codec can be downloaded), behind the ``Codec`` protocol.

640-sample Hann frames with hop 320 at 16 kHz (50 tokens per second); an MLP encoder from the frame's log-magnitude
spectrum to a d-dimensional latent, ``vector_quantize_pytorch.VectorQuantize`` (EMA codebook, k-means init), an MLP
decoder to waveform frames and Hann overlap-add. Trained on waveform L1 + multi-resolution log-magnitude STFT +
commitment with a cosine learning-rate decay, then a consistency phase (codebook and encoder frozen, the decoder
fine-tuned so that encode(decode(q)) returns q, ``train_codec``): trained on reconstruction alone the round trip
kept almost no token, where real codecs keep about 0.4. Overlap-add still makes encode(decode(q)) != q in a
structured way, the phenomenon the watermark paper is about. (The encoder reads magnitudes because a 7-bit-per-frame decoder cannot
reproduce phase: a waveform encoder maps every decoded frame to one token, r = 0.) A real codec (EnCodec, Mimi, ...) plugs in through
the same protocol where its weights exist.

Example:
    >>> import numpy as np
    >>> codec = FrameCodec(codebook_size=32, dim=8, seed=0)
    >>> tokens = codec.encode(np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32))
    >>> tokens.shape, codec.decode(tokens).shape
    ((49,), (16000,))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from ..common.optional import requires
from ..common.progress import progress

FRAME, HOP = 640, 320


@runtime_checkable
class Codec(Protocol):
    """What the watermark's pipeline needs of a codec (``FrameCodec`` and ``EncodecCodec`` satisfy it):
    ``encode(wave) -> tokens (T,)`` (or ``(levels, T)`` for RVQ) from 16 kHz mono audio; ``decode(tokens) -> wave``;
    ``codebook_size`` (V per level); ``levels``; ``fingerprint`` (ties cluster maps and caches to the codec);
    ``codebook() -> (levels * V, d)`` (the k-means baseline)."""

    codebook_size: int
    levels: int
    fingerprint: str

    def encode(self, wave: np.ndarray) -> np.ndarray: ...

    def decode(self, tokens: np.ndarray) -> np.ndarray: ...

    def codebook(self) -> np.ndarray: ...


def check_wave(
    wave: np.ndarray, sample_rate: int = 16_000, *, expected_rate: int = 16_000, min_seconds: float = 0.1
) -> np.ndarray:
    """A mono float waveform at the codec's rate, long enough and not silent; ``ValueError`` otherwise."""
    x = np.asarray(wave)
    if sample_rate != expected_rate:
        raise ValueError(
            f"audio must be sampled at {expected_rate} Hz, got {sample_rate} Hz (resample it first)"
        )
    if x.ndim != 1:
        raise ValueError(f"audio must be mono, shape (samples,), got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"audio must be float samples in [-1, 1], got dtype {x.dtype}")
    if not np.isfinite(x).all():
        raise ValueError("audio contains NaN or infinity")
    if len(x) < max(FRAME, int(min_seconds * expected_rate)):
        raise ValueError(
            f"audio is too short: {len(x)} samples, need at least {max(FRAME, int(min_seconds * expected_rate))}"
        )
    if not np.abs(x).max() > 0:
        raise ValueError("audio is silent (all samples are zero): there is nothing to encode or detect")
    return x.astype(np.float32)


class FrameCodec(nn.Module):
    """The frame codec (see the module docstring)."""

    levels: int = 1
    """RVQ levels (a class default, so codecs pickled before RVQ existed load as one level)"""

    def __init__(
        self, codebook_size: int = 128, dim: int = 16, hidden: int = 512, seed: int = 0, levels: int = 1
    ):
        super().__init__()
        if isinstance(levels, bool) or not isinstance(levels, int) or levels < 1:
            raise ValueError(f"levels must be a positive integer, got {levels!r}")
        vq = requires("vector_quantize_pytorch", extra="audio", purpose="the frame codec's quantiser")
        g = torch.random.fork_rng(devices=[])
        with g:
            torch.manual_seed(seed)
            self.enc = nn.Sequential(nn.Linear(FRAME // 2 + 1, hidden), nn.GELU(), nn.Linear(hidden, dim))
            self.dec = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, FRAME))
            opts = dict(
                decay=0.9,
                commitment_weight=0.25,
                kmeans_init=True,
                kmeans_iters=10,
                threshold_ema_dead_code=2,
            )
            if levels == 1:
                self.vq = vq.VectorQuantize(dim=dim, codebook_size=codebook_size, **opts)
            else:  # residual VQ: level l quantises what levels < l left over
                self.vq = vq.ResidualVQ(dim=dim, num_quantizers=levels, codebook_size=codebook_size, **opts)
        self.codebook_size, self.seed, self.levels = codebook_size, seed, levels
        self.register_buffer("window", torch.hann_window(FRAME, periodic=True))
        level_tag = "" if levels == 1 else f"-L{levels}"
        self.fingerprint = f"framecodec2-K{codebook_size}-d{dim}{level_tag}-s{seed}"

    def frames(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S) -> (B, T, FRAME) windowed frames (no padding: T = (S - FRAME) // HOP + 1)."""
        return x.unfold(-1, FRAME, HOP) * self.window

    def latents(self, x: torch.Tensor) -> torch.Tensor:
        """(B, S) -> (B, T, d): the encoder on each frame's log-magnitude spectrum."""
        return self.enc(torch.log(torch.fft.rfft(self.frames(x)).abs() + 1e-3))

    def overlap_add(self, frames: torch.Tensor, length: int) -> torch.Tensor:
        b, t, _ = frames.shape
        out = torch.nn.functional.fold(
            (frames * self.window).transpose(1, 2),
            output_size=(1, length),
            kernel_size=(1, FRAME),
            stride=(1, HOP),
        )
        norm = torch.nn.functional.fold(
            (self.window**2).expand(b, t, FRAME).transpose(1, 2),
            output_size=(1, length),
            kernel_size=(1, FRAME),
            stride=(1, HOP),
        )
        return (out / norm.clamp(min=1e-3))[:, 0, 0]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, idx, commit = self.vq(self.latents(x))
        return self.overlap_add(self.dec(q), x.shape[-1]), idx, commit.sum()

    def code_logits(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """(B, S) audio and its (B, T[, levels]) codes -> (B, T, levels, K) logits of re-encoding ``x``.

        Level l's logits are minus the squared distances of the teacher-forced residual (the latent of ``x`` minus
        the code vectors of ``idx`` at levels < l) to level l's codebook, so the argmax at every level is the code
        the quantiser would pick when the earlier levels agree with ``idx``.
        """
        z = self.latents(x)
        books = self.vq.codebook.reshape(1, self.codebook_size, -1) if self.levels == 1 else self.vq.codebooks
        books = books.detach()
        codes = idx.reshape(*idx.shape[:2], self.levels)
        out, residual = [], z
        for level in range(self.levels):
            # logit_l(k) = -||z - sum_{j<l} c_j[q_j] - c_l[k]||^2
            out.append(-((residual[..., None, :] - books[level]) ** 2).sum(-1))
            residual = residual - books[level][codes[..., level]]
        return torch.stack(out, dim=-2)

    @torch.no_grad()
    def encode(self, wave: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(check_wave(wave))[None]
        self.eval()
        _, idx, _ = self.vq(self.latents(x))
        out = idx[0].numpy().astype(np.int64)
        return out if self.levels == 1 else np.ascontiguousarray(out.T)  # (levels, T) for RVQ

    @torch.no_grad()
    def decode(self, tokens: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        want = "a non-empty 1-D sequence" if self.levels == 1 else f"shape ({self.levels}, T) with T >= 1"
        if (
            t.ndim != (1 if self.levels == 1 else 2)
            or t.shape[-1] == 0
            or (self.levels > 1 and t.shape[0] != self.levels)
        ):
            raise ValueError(f"tokens must be {want}, got shape {tuple(t.shape)}")
        if int(t.min()) < 0 or int(t.max()) >= self.codebook_size:
            raise ValueError(f"tokens must be in [0, {self.codebook_size})")
        self.eval()
        if self.levels == 1:
            q = self.vq.get_codes_from_indices(t[None])
        else:  # the sum of the levels' code vectors
            q = self.vq.get_output_from_indices(t.T[None])
        length = (t.shape[-1] - 1) * HOP + FRAME
        return self.overlap_add(self.dec(q), length)[0].numpy()

    def codebook(self) -> np.ndarray:
        """(K, d) codebook vectors ((levels, K, d) for RVQ)."""
        if self.levels > 1:
            return self.vq.codebooks.detach().numpy()
        return self.vq.codebook.detach().numpy().reshape(self.codebook_size, -1)


def stft_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = torch.zeros(())
    for n in (256, 512, 1024):
        w = torch.hann_window(n)
        sx = torch.stft(x, n, n // 4, window=w, return_complex=True).abs()
        sy = torch.stft(y, n, n // 4, window=w, return_complex=True).abs()
        loss = loss + (torch.log(sx + 1e-5) - torch.log(sy + 1e-5)).abs().mean()
    return loss


def train_codec(
    utterances: Sequence[np.ndarray],
    *,
    codebook_size: int = 128,
    dim: int = 16,
    steps: int = 600,
    batch: int = 16,
    seconds: float = 1.0,
    lr: float = 1e-3,
    seed: int = 0,
    desc: str | None = "codec",
    levels: int = 1,
    consistency: float = 1.0,
    consistency_steps: int | None = None,
) -> FrameCodec:
    """Train a :class:`FrameCodec` on random 1 s crops of ``utterances`` (Adam, cosine decay of ``lr`` to 0).

    Two phases. First ``steps`` steps of waveform L1 + multi-resolution log-magnitude STFT + commitment (the EMA
    codebook and both MLPs learn). Then ``consistency_steps`` steps (default ``steps // 2``; 0: the training of the
    first versions, whose round trip kept almost no token) with the codebook and the encoder frozen, fine-tuning
    the decoder on the same loss plus ``consistency`` times the re-encoding cross-entropy: the decoded audio of a
    crop's codes ``q`` must encode back to ``q``, at every RVQ level with the earlier levels teacher-forced
    (logits at temperature 0.1; the gradient reaches the decoder through the audio, so it learns to reproduce the
    log-magnitude features the encoder reads),

        L_cons = - sum_l log softmax_k(-10 ||z(decode(q)) - sum_{j<l} c_j[q_j] - c_l[k]||^2)[q_l]

    as codecs trained with a consistency loss do. Measured on the experiment's codec (README Deviations 1): added
    while the EMA codebook still moves, the term cannot hold (the codes it targets change every step); letting the
    encoder learn it instead makes the round trip lossless (the encoder learns to recognise the toy decoder's
    outputs, even after MP3 or noise), which no real codec does; the decoder-only phase keeps the real encoder's
    sensitivity, and residual levels keep less than the first, as in real RVQ codecs.

    Args:
        utterances: 16 kHz float waveforms (only these train the codec: pass the held-in ones).
        codebook_size, dim, levels: the codec's vocabulary per level, latent size and RVQ levels.
        steps, batch, seconds, lr, seed: the first phase (1 s crops, Adam, cosine decay of ``lr`` to 0).
        consistency: weight of L_cons (>= 0).
        consistency_steps: steps of the second phase (same batch, constant ``lr``); None: ``steps // 2``.

    Returns:
        The trained :class:`FrameCodec` in eval mode.
    """
    if steps < 1 or batch < 1:
        raise ValueError(f"steps and batch must be >= 1, got steps={steps}, batch={batch}")
    if not (np.isfinite(consistency) and consistency >= 0):
        raise ValueError(f"consistency must be a finite weight >= 0, got {consistency!r}")
    if consistency_steps is None:
        consistency_steps = steps // 2
    if isinstance(consistency_steps, bool) or not isinstance(consistency_steps, int) or consistency_steps < 0:
        raise ValueError(f"consistency_steps must be an integer >= 0, got {consistency_steps!r}")
    codec = FrameCodec(codebook_size, dim, seed=seed, levels=levels)
    opt = torch.optim.Adam([p for n, p in codec.named_parameters() if not n.startswith("vq")], lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.5 * (1 + np.cos(np.pi * min(i, steps) / steps))
    )
    rng = np.random.default_rng(seed)
    n = int(seconds * 16_000)
    pool = [u for u in utterances if len(u) > n]
    if not pool:
        raise ValueError("no utterance is longer than the training crop")
    codec.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the quantiser's k-means init and dead-code resets
        for _ in progress(range(steps), desc=desc) if desc else range(steps):
            _train_step(codec, opt, pool, rng, n, batch)
            sched.step()
        if consistency_steps and consistency > 0:
            # phase 2: codebook (eval mode: no EMA update, no dead-code reset) and encoder frozen; the decoder is
            # fine-tuned with the re-encoding consistency term added
            opt = torch.optim.Adam(codec.dec.parameters(), lr=lr)
            codec.vq.eval()
            it = range(consistency_steps)
            for _ in progress(it, desc=f"{desc} consistency") if desc else it:
                _train_step(codec, opt, pool, rng, n, batch, consistency)
    codec.zero_grad(set_to_none=True)  # the frozen encoder's unused gradients
    return codec.eval()


def _train_step(
    codec: FrameCodec,
    opt: torch.optim.Optimizer,
    pool: list[np.ndarray],
    rng: np.random.Generator,
    n: int,
    batch: int,
    consistency: float = 0.0,
) -> None:
    """One Adam step on a batch of random crops."""
    crops = []
    for _ in range(batch):
        u = pool[int(rng.integers(len(pool)))]
        s = int(rng.integers(0, len(u) - n))
        crops.append(u[s : s + n])
    x = torch.from_numpy(np.stack(crops))
    y, idx, commit = codec(x)
    edge = FRAME  # the ends are covered by one frame only
    loss = (y - x)[:, edge:-edge].abs().mean() + stft_loss(x[:, edge:-edge], y[:, edge:-edge]) + commit
    if consistency > 0:
        # L_cons: encode(decode(q)) should return q (every level, earlier levels teacher-forced; the gradient
        # reaches the decoder through the decoded audio)
        logits = 10.0 * codec.code_logits(y, idx)
        target = idx.reshape(*idx.shape[:2], codec.levels)
        loss = loss + consistency * torch.nn.functional.cross_entropy(
            logits.reshape(-1, codec.codebook_size), target.reshape(-1)
        )
    if not torch.isfinite(loss):
        raise FloatingPointError("codec loss is not finite")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


class EncodecCodec:
    """A ``transformers`` ``EncodecModel`` behind the ``Codec`` protocol (the paper's setting: an off-the-shelf RVQ
    codec, not trained for round trips).

    ``encode`` resamples 16 kHz mono audio to the model's rate and returns its ``(levels, T)`` RVQ codes at
    ``bandwidth`` (levels = the quantizers that bandwidth uses); ``decode`` inverts it back to 16 kHz; ``codebook``
    stacks the levels' codebooks ``(levels * V, d)`` as ``FrameCodec.codebook`` does. Pretrained weights load with
    ``EncodecCodec.from_pretrained(path_or_name)`` where the user has them (nothing is downloaded in tests).

    Args:
        model: an ``EncodecModel`` with one audio channel.
        bandwidth: target bandwidth in kbit/s (default: the model's smallest).
        name: a tag for the fingerprint (default: the model's ``name_or_path``).

    Example:
        >>> import numpy as np, torch
        >>> from transformers import EncodecConfig, EncodecModel
        >>> _ = torch.manual_seed(0)
        >>> cfg = EncodecConfig(target_bandwidths=[1.0], sampling_rate=16000, num_filters=4, hidden_size=16,
        ...                     codebook_size=32, codebook_dim=16, upsampling_ratios=[8, 5, 4, 2],
        ...                     num_residual_layers=1, num_lstm_layers=1)
        >>> codec = EncodecCodec(EncodecModel(cfg))
        >>> q = codec.encode(np.random.default_rng(0).normal(0, 0.1, 16000).astype(np.float32))
        >>> q.shape, codec.decode(q).shape, codec.codebook().shape
        ((4, 50), (16000,), (128, 16))

    Reference: Défossez et al., "High Fidelity Neural Audio Compression" (EnCodec), TMLR 2023.
    """

    def __init__(self, model: nn.Module, *, bandwidth: float | None = None, name: str | None = None):
        if getattr(model.config, "audio_channels", 1) != 1:
            raise ValueError(f"model must be mono (audio_channels = 1), got {model.config.audio_channels}")
        self.model = model.eval()
        self.bandwidth = float(bandwidth if bandwidth is not None else min(model.config.target_bandwidths))
        if self.bandwidth not in [float(b) for b in model.config.target_bandwidths]:
            raise ValueError(f"bandwidth must be one of {model.config.target_bandwidths}, got {bandwidth}")
        self.levels = int(model.quantizer.get_num_quantizers_for_bandwidth(self.bandwidth))
        self.codebook_size = int(model.config.codebook_size)
        self.rate = int(model.config.sampling_rate)
        tag = name or getattr(model.config, "name_or_path", "") or "random"
        self.fingerprint = f"encodec-K{self.codebook_size}-L{self.levels}-bw{self.bandwidth:g}-{tag}"

    @classmethod
    def from_pretrained(cls, path: str, *, bandwidth: float | None = None, **kwargs: object) -> EncodecCodec:
        """Load an ``EncodecModel`` (a local folder, or a hub name where the user has network access)."""
        requires("transformers", extra="hf", purpose="the EnCodec adapter")
        from transformers import EncodecModel

        return cls(EncodecModel.from_pretrained(path, **kwargs), bandwidth=bandwidth, name=str(path))

    def _resample(self, x: np.ndarray, up: int, down: int) -> np.ndarray:
        from math import gcd

        from scipy.signal import resample_poly

        g = gcd(up, down)
        return x if up == down else resample_poly(x, up // g, down // g).astype(np.float32)

    @torch.no_grad()
    def encode(self, wave: np.ndarray) -> np.ndarray:
        x = self._resample(check_wave(wave), self.rate, 16_000)
        out = self.model.encode(torch.from_numpy(np.ascontiguousarray(x))[None, None], bandwidth=self.bandwidth)
        codes = out.audio_codes  # (chunks, B, levels, T); one chunk without chunking
        return codes[:, 0].permute(1, 0, 2).reshape(self.levels, -1).numpy().astype(np.int64)

    @torch.no_grad()
    def decode(self, tokens: np.ndarray) -> np.ndarray:
        q = torch.as_tensor(np.asarray(tokens), dtype=torch.long).reshape(self.levels, -1)
        y = self.model.decode(q[None, None], [None]).audio_values[0, 0].numpy()
        return self._resample(y.astype(np.float32), 16_000, self.rate)

    def codebook(self) -> np.ndarray:
        return torch.cat([layer.codebook.embed for layer in self.model.quantizer.layers[: self.levels]]).numpy()
