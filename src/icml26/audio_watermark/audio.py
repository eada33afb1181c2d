"""The embedded audio: speech synthesised offline with espeak-ng, procedural music, and the audio edits (attacks).

``speech_corpus`` renders sentences x voices x speeds x pitches with ``espeak-ng --stdout`` (a system package,
installed by the Makefile; a clear error where it is missing), resampled to 16 kHz, peak-normalised, cached.
``music_corpus`` synthesises clips from a seed: a melody on a random scale with a per-clip harmonic timbre, a bass
line, a kick on the beats and noise hi-hats on the off-beats.

Attacks (numpy/scipy and ``lame``; no torchaudio): identity, white noise at a given SNR, FFT low-pass, moving-average
smoothing, resampling 16k -> 8k -> 16k, speed change without pitch correction, time crop (drops the first 0.3 s, which
shifts the frame grid), amplitude scaling, 8-bit requantisation, MP3 through ``lame`` (encode and decode).

Example:
    >>> import numpy as np
    >>> x = np.sin(np.linspace(0, 200, 16000)).astype(np.float32)
    >>> sorted(ATTACKS)[:4]
    ['amplitude', 'crop', 'identity', 'lowpass']
    >>> apply_attack("crop", x, np.random.default_rng(0)).shape
    (11200,)
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy.signal import resample_poly

from ..common.io import atomic_write_with
from ..common.optional import require_program

SR = 16_000
SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "A large number of old books were stacked against the wall of the library.",
    "We will meet at the station at half past seven tomorrow morning.",
    "The weather today is cloudy with a chance of light rain in the evening.",
    "Scientists discovered a new species of frog in the tropical forest.",
    "Turn left at the second traffic light and park behind the blue building.",
    "Music filled the hall as the orchestra began the final movement.",
    "Every morning she walks her dog along the quiet streets of the town.",
    "The committee will announce its decision after the long meeting ends.",
)
VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-029", "en-gb-x-rp")


def _espeak(text: str, voice: str, speed: int, pitch: int) -> np.ndarray:
    exe = require_program("espeak-ng", apt="espeak-ng", purpose="the embedded speech corpus")
    raw = subprocess.run(
        [exe, "-v", voice, "-s", str(speed), "-p", str(pitch), "--stdout", text],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    if raw[:4] != b"RIFF" or len(raw) < 46:
        raise RuntimeError(f"espeak-ng returned no WAV data for voice {voice!r}")
    pcm = np.frombuffer(raw[44 : len(raw) - (len(raw) - 44) % 2], dtype="<i2").astype(np.float32) / 32768.0
    return resample_poly(pcm, 160, 221).astype(np.float32)  # 22050 Hz -> 16 kHz


def speech_corpus(n: int = 60, *, cache: Path | None = None) -> list[np.ndarray]:
    """``n`` utterances (float32, 16 kHz, peak 0.9): sentences x voices x speed {140, 175} x pitch {35, 60}."""
    combos = [(s, v, sp, pi) for sp in (140, 175) for pi in (35, 60) for v in VOICES for s in SENTENCES]
    if not 1 <= n <= len(combos):
        raise ValueError(f"n must be in [1, {len(combos)}], got {n}")
    rng = np.random.default_rng(7)
    chosen = [combos[i] for i in rng.permutation(len(combos))[:n]]
    key = hashlib.sha256(repr(chosen).encode()).hexdigest()[:16]
    path = (cache / f"speech_{key}.npz") if cache is not None else None
    if path is not None and path.is_file():
        data = np.load(path)
        return [data[f"u{i}"] for i in range(n)]
    out = []
    for s, v, sp, pi in chosen:
        x = _espeak(s, v, sp, pi)
        out.append((0.9 * x / max(float(np.abs(x).max()), 1e-6)).astype(np.float32))
    if path is not None:
        atomic_write_with(path, lambda tmp: np.savez(tmp, **{f"u{i}": x for i, x in enumerate(out)}))
    return out


def _tone(freq: float, n: int, harmonics: np.ndarray, decay: float) -> np.ndarray:
    t = np.arange(n) / SR
    wave = sum(
        a * np.sin(2 * np.pi * freq * (k + 1) * t) for k, a in enumerate(harmonics) if freq * (k + 1) < SR / 2
    )
    attack = min(n, int(0.01 * SR))
    env = np.exp(-decay * t)
    env[:attack] *= np.linspace(0.0, 1.0, attack)
    return np.asarray(wave) * env


def music_corpus(n: int = 20, *, seconds: float = 5.0, seed: int = 0) -> list[np.ndarray]:
    """``n`` procedurally generated music clips (float32, 16 kHz, peak 0.9), reproducible from ``seed``.

    Each clip: tempo 80-150 bpm, a major or minor pentatonic scale on a random root, a melody of eighth and quarter
    notes with a random harmonic timbre, a bass note on every beat, a decaying-sine kick on the beats and high-passed
    noise hi-hats on the off-beats.
    """
    if n < 1 or seconds < 0.5:
        raise ValueError(f"n must be >= 1 and seconds >= 0.5, got n={n}, seconds={seconds}")
    rng = np.random.default_rng([seed, 11])
    total = int(seconds * SR)
    out = []
    for _ in range(n):
        beat = int(SR * 60.0 / rng.uniform(80, 150))
        root = rng.integers(52, 65)
        scale = np.array([0, 2, 4, 7, 9] if rng.random() < 0.5 else [0, 3, 5, 7, 10])
        harmonics = rng.uniform(0.1, 1.0, int(rng.integers(2, 8)))
        harmonics = harmonics / np.arange(1, len(harmonics) + 1)
        decay = rng.uniform(2.0, 8.0)
        x = np.zeros(total + 2 * SR)
        pos = 0
        while pos < total:  # melody
            length = beat // 2 if rng.random() < 0.6 else beat
            midi = root + 12 + scale[rng.integers(len(scale))] + 12 * int(rng.integers(0, 2))
            x[pos : pos + length] += 0.5 * _tone(440.0 * 2 ** ((midi - 69) / 12), length, harmonics, decay)
            pos += length
        for b, pos in enumerate(range(0, total, beat)):  # bass, kick, hi-hat
            midi = root - 12 + scale[[0, 0, 3, 2][b % 4]]
            x[pos : pos + beat] += 0.4 * _tone(
                440.0 * 2 ** ((midi - 69) / 12), beat, np.array([1.0, 0.3]), 3.0
            )
            k = np.arange(min(beat, int(0.15 * SR))) / SR
            x[pos : pos + len(k)] += (
                0.6 * np.sin(2 * np.pi * (50 * k + 250 * (1 - np.exp(-k * 30)) / 30)) * np.exp(-k * 25)
            )
            h = rng.normal(0, 1, int(0.03 * SR))
            h = np.diff(h, prepend=0.0) * np.exp(-np.arange(len(h)) / (0.008 * SR))
            x[pos + beat // 2 : pos + beat // 2 + len(h)] += 0.15 * h
        x = x[:total]
        out.append((0.9 * x / max(float(np.abs(x).max()), 1e-6)).astype(np.float32))
    return out


# ------------------------------------------------------------------------------------------------- attacks
def _noise(x: np.ndarray, rng: np.random.Generator, snr_db: float = 20.0) -> np.ndarray:
    p = float(np.mean(x**2)) + 1e-12
    return (x + rng.normal(0, np.sqrt(p / 10 ** (snr_db / 10)), x.shape)).astype(np.float32)


def _lowpass(x: np.ndarray, rng: np.random.Generator, cutoff: float = 4000.0) -> np.ndarray:
    spec = np.fft.rfft(x)
    spec[np.fft.rfftfreq(len(x), 1 / SR) > cutoff] = 0
    return np.fft.irfft(spec, len(x)).astype(np.float32)


def _smooth(x: np.ndarray, rng: np.random.Generator, width: int = 5) -> np.ndarray:
    return np.convolve(x, np.ones(width) / width, mode="same").astype(np.float32)


def _resample(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return resample_poly(resample_poly(x, 1, 2), 2, 1)[: len(x)].astype(np.float32)


def _speed(x: np.ndarray, rng: np.random.Generator, factor: float = 1.1) -> np.ndarray:
    return resample_poly(x, 10, round(10 * factor)).astype(np.float32)


def _crop(x: np.ndarray, rng: np.random.Generator, seconds: float = 0.3) -> np.ndarray:
    return x[int(seconds * SR) :].copy()


def _amplitude(x: np.ndarray, rng: np.random.Generator, gain: float = 0.5) -> np.ndarray:
    return (x * gain).astype(np.float32)


def _requantise(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return (np.round(np.clip(x, -1, 1) * 127) / 127).astype(np.float32)


def _mp3(x: np.ndarray, rng: np.random.Generator, bitrate: int = 64) -> np.ndarray:
    import soundfile as sf

    exe = require_program("lame", apt="lame", purpose="the MP3 attack")
    with tempfile.TemporaryDirectory() as d:
        wav, mp3, back = Path(d, "a.wav"), Path(d, "a.mp3"), Path(d, "b.wav")
        sf.write(wav, x, SR, subtype="PCM_16")
        subprocess.run([exe, "--quiet", "-b", str(bitrate), str(wav), str(mp3)], check=True, timeout=60)
        subprocess.run([exe, "--quiet", "--decode", str(mp3), str(back)], check=True, timeout=60)
        y, sr = sf.read(back, dtype="float32")
    if sr != SR:
        y = resample_poly(y, SR, sr).astype(np.float32)
    return y if y.ndim == 1 else y.mean(1)


ATTACKS: dict[str, Callable[[np.ndarray, np.random.Generator], np.ndarray]] = {
    "identity": lambda x, rng: x.copy(),
    "noise": _noise,
    "lowpass": _lowpass,
    "smooth": _smooth,
    "resample": _resample,
    "speed": _speed,
    "crop": _crop,
    "amplitude": _amplitude,
    "requantise": _requantise,
    "mp3": _mp3,
}


def apply_attack(name: str, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Apply the attack ``name`` to a 16 kHz waveform."""
    if name not in ATTACKS:
        raise ValueError(f"unknown attack {name!r}; known: {sorted(ATTACKS)}")
    return ATTACKS[name](np.asarray(x, dtype=np.float32), rng)
