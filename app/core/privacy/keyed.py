"""Keyed randomness: every random draw of a run is a function of the secret seed and a public index.

A distributed trainer splits users and items over workers in any way; for it to publish exactly
what the in-process trainer publishes (docs/algorithms.md §7), no draw may depend on a chunk, a
bucket or a partition, nor on the order in which draws happen. So:

* **keys** — the secret seed never leaves :class:`KeyedRandomness`; each purpose (a release, the
  sampling of ratings, V's initialisation) gets a 128-bit key from ``SeedSequence(seed,
  spawn_key=(purpose, ...))`` (numpy's hash of the whole seed, so every bit of it counts).
* **sampling keys** — the uniform key of rating (user, item) is a keyed 64-bit hash
  (SplitMix64's finaliser, twice) of the user's external id and the item's catalogue position:
  the same whatever other users a partition holds.
* **noise** — the noise of release r at public index j (an item's catalogue position; 0 for a
  release drawn whole) comes from its own SFC64 stream, seeded with three keyed hashes of
  (key_r, j) and warmed up as numpy seeds SFC64 (12 outputs discarded). Draws are exact discrete
  Gaussians (:mod:`app.core.privacy.discrete_noise`, CKS 2020 Algorithm 3, arXiv:2004.00010):
  :func:`keyed_discrete_gaussian` draws many indices in one compiled pass; an index whose proposals
  leave a float decision open (~10⁻⁷ of them) or run short is drawn again by the reference
  :func:`stream_discrete_gaussian`, which settles it exactly; the draws are the reference's in every
  case (``tests/unit/test_keyed_randomness.py``). A task recomputed by a scheduler therefore draws
  the same noise and releases nothing new.

These generators are statistical, not cryptographic (as numpy's default PCG64/SFC64 streams the
releases used before); the seed is 128 secret bits and is never in a key, a log or a config.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from app.core.privacy.discrete_noise import _LN_CELLS, _MARGIN, _settle, noise_is_off

__all__ = [
    "IndexedNoise",
    "KeyedRandomness",
    "NoiseKey",
    "SamplingKeys",
    "keyed_discrete_gaussian",
    "stream_discrete_gaussian",
    "stream_state",
    "mix64",
    "user_hashes",
]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_SAMPLING, _INIT, _NOISE = 1, 2, 3  # purposes (the first word of the spawn key)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection of uint64 with full avalanche), elementwise."""
    z = np.asarray(x, dtype=np.uint64).copy()
    z ^= z >> np.uint64(30)
    z *= _MIX1
    z ^= z >> np.uint64(27)
    z *= _MIX2
    z ^= z >> np.uint64(31)
    return z


def user_hashes(user_ids: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each external user id (not yet keyed): integer ids by their value (the
    service's ids), any other id by BLAKE2b of its text. The same user gets the same hash in any
    partition of the data."""
    ids = np.asarray(user_ids)
    if ids.dtype.kind in "iu":
        return mix64(ids.astype(np.int64).view(np.uint64) + _GOLDEN)
    digests = [hashlib.blake2b(str(x).encode(), digest_size=8).digest() for x in ids.tolist()]
    return np.frombuffer(b"".join(digests), dtype="<u8").astype(np.uint64) if digests else np.zeros(0, np.uint64)


def _keyed_hash(key: np.ndarray, first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Keyed 64-bit hash of (first, second) (uint64 arrays): mix(mix(first ^ k0) + second·φ ^ k1)."""
    inner = mix64(np.asarray(first, dtype=np.uint64) ^ key[0])
    return mix64((inner + np.asarray(second, dtype=np.uint64) * _GOLDEN) ^ key[1])


def _uniforms(key: np.ndarray, users: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) keys (53 bits) of the keyed hashes of (user hash, item position)."""
    bits = _keyed_hash(key, users, np.asarray(items, dtype=np.int64).view(np.uint64))
    return np.asarray((bits >> np.uint64(11)).astype(np.float64) * 2.0**-53)


class KeyedRandomness:
    """The run's randomness from its secret seed (module doc). Holds the seed; exposes only
    keyed draws."""

    def __init__(self, seed: int) -> None:
        self._seed = int(seed)

    def __repr__(self) -> str:  # never the seed
        return "KeyedRandomness(<secret>)"

    def key(self, *path: int) -> np.ndarray:
        """The 128-bit key (two uint64) of one purpose: ``SeedSequence(seed, spawn_key=path)``."""
        return np.random.SeedSequence(self._seed, spawn_key=tuple(int(p) for p in path)).generate_state(2, np.uint64)

    def rating_uniforms(self, stage: int, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        """Uniform [0, 1) keys (53 bits) of ratings (user hash, catalogue item position) for the
        sampling ``stage`` (0: the first ≤ k sample, 1: the contribution bound)."""
        return _uniforms(self.key(_SAMPLING, stage), users, items)

    def sampling_keys(self) -> SamplingKeys:
        """The sampling stages' keys alone (what a cluster's workers need; the noise keys and the
        seed stay with the driver)."""
        return SamplingKeys((self.key(_SAMPLING, 0), self.key(_SAMPLING, 1)))

    def init_generator(self) -> np.random.Generator:
        """The generator of V's data-free initialisation (drawn whole, by the driver)."""
        return np.random.Generator(np.random.SFC64(np.random.SeedSequence(self._seed, spawn_key=(_INIT,))))

    def noise(self, release: int) -> NoiseKey:
        """The noise of release number ``release`` of the run (its place in the releaser's record)."""
        return NoiseKey(self.key(_NOISE, release))


class SamplingKeys:
    """The keys of the sampling stages 0 and 1 only: :meth:`KeyedRandomness.rating_uniforms`'s
    draws, value for value, without the seed (nothing else can be derived from them)."""

    def __init__(self, keys: tuple[np.ndarray, np.ndarray]) -> None:
        self._keys = keys

    def __repr__(self) -> str:
        return "SamplingKeys(<secret>)"

    def rating_uniforms(self, stage: int, users: np.ndarray, items: np.ndarray) -> np.ndarray:
        return _uniforms(self._keys[stage], users, items)


class NoiseKey:
    """The noise streams of one release: index j's stream is a function of the key and j only."""

    def __init__(self, key: np.ndarray) -> None:
        self._key = key

    def __repr__(self) -> str:
        return "NoiseKey(<secret>)"

    def at(self, indices: np.ndarray) -> IndexedNoise:
        """The streams of ``indices`` (one row of a release each), to hand to a grid release."""
        return IndexedNoise(self._key, np.asarray(indices, dtype=np.int64))


class IndexedNoise:
    """Noise source of a grid release (``GridGaussian.release(noise, value)``) whose value has one
    row per public index: row i's draws come from index i's stream, whatever else is released
    with it. A release drawn whole is the one index 0."""

    def __init__(self, key: np.ndarray, indices: np.ndarray) -> None:
        self._key, self.indices = key, indices

    def __repr__(self) -> str:
        return f"IndexedNoise(<secret>, {len(self.indices)} indices)"

    def discrete_gaussian(self, sigma: int, shape: tuple[int, ...]) -> np.ndarray:
        """int64 N_Z(0, σ²) draws of ``shape`` (leading dimension: the indices; a 0-d or 1-d shape
        with one index is that index's draws)."""
        size = int(np.prod(shape))
        rows = len(self.indices)
        if rows == 0 or size % rows:
            raise ValueError("the release's rows do not match its indices")
        return keyed_discrete_gaussian(self._key, int(sigma), self.indices, size // rows).reshape(shape)


def stream_state(key: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """(n, 4) uint64 SFC64 states of the indices' streams: three keyed hashes of (key, j) as the
    seed words, counter 1, 12 outputs discarded (numpy's SFC64 seeding)."""
    idx = np.ascontiguousarray(indices, dtype=np.int64).view(np.uint64)
    state = np.empty((len(idx), 4), dtype=np.uint64)
    if len(idx):
        _kernels()[0](np.asarray(key, dtype=np.uint64), idx, state)
    return state


def _proposal_budget(n: int) -> int:
    """Proposals of an index's first block: its accepted draws (≈ 0.76 each) reach n but for a
    ~10⁻⁶ chance (mean n + 2.3√n + 12, sd ≈ 0.43√n); the rest is drawn by the reference."""
    return int(n / 0.76 + 3.0 * math.sqrt(n) + 16)


def stream_discrete_gaussian(key: np.ndarray, sigma: int, index: int, n: int, margin: float = _MARGIN) -> np.ndarray:
    """The reference: index's n draws from its own SFC64 stream. Blocks of proposals, each
    (U₁ cell, U₂ cell with the sign bit) from two consecutive raw words, settled exactly by
    :func:`app.core.privacy.discrete_noise._settle` (extra bits drawn after the block, in order)."""
    if noise_is_off():
        return np.zeros(n, dtype=np.int64)
    bit_generator = np.random.SFC64()
    state = stream_state(key, np.array([index]))[0]
    bit_generator.state = {"bit_generator": "SFC64", "state": {"state": state}, "has_uint32": 0, "uinteger": 0}
    rng = np.random.Generator(bit_generator)
    out: list[np.ndarray] = []
    have, size = 0, _proposal_budget(n)
    while have < n:
        raw = np.asarray(bit_generator.random_raw(2 * size), dtype=np.uint64)
        first = (raw[0::2] >> np.uint64(11)).view(np.int64)
        second = (raw[1::2] >> np.uint64(10)).view(np.int64)
        log_first = np.log(first.astype(np.float64) + 0.5)
        log_second = np.log((second >> 1).astype(np.float64) + 0.5)
        accepted = _settle(rng, sigma, first.copy(), log_first, second.copy(), log_second, margin)[: n - have]
        out.append(accepted)
        have += len(accepted)
        size = _proposal_budget(n - have)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def keyed_discrete_gaussian(key: np.ndarray, sigma: int, indices: np.ndarray, n: int) -> np.ndarray:
    """(len(indices), n) draws, row i equal to ``stream_discrete_gaussian(key, sigma, indices[i], n)``:
    batches of indices, each in three passes (compiled: every stream's first block of raw words,
    split into cells; numpy's vectorised log of the cell centres, as the reference takes it;
    compiled: the reference's fast-path decisions in order), no Python per index; the reference
    redraws only the rare index whose first block leaves a decision open or runs short."""
    indices = np.asarray(indices, dtype=np.int64)
    out = np.zeros((len(indices), n), dtype=np.int64)
    if noise_is_off() or n == 0 or len(indices) == 0:
        return out
    if not isinstance(sigma, (int, np.integer)) or not 1 <= sigma < (1 << 40):
        raise ValueError("sigma must be an integer in [1, 2^40)")
    budget = _proposal_budget(n)
    states = stream_state(key, indices)
    done = np.zeros(len(indices), dtype=np.bool_)
    _, fill, decide = _kernels()
    batch = max(1, min(len(indices), _BATCH_WORDS // (2 * budget)))
    cells = np.empty((batch, 2 * budget), dtype=np.int64)
    logs = np.empty((batch, 2 * budget))
    for first in range(0, len(indices), batch):
        rows = slice(first, min(first + batch, len(indices)))
        size = rows.stop - rows.start
        fill(states[rows], cells[:size], logs[:size])
        np.log(logs[:size], out=logs[:size])
        decide(cells[:size], logs[:size], float(sigma), _MARGIN, _LN_CELLS, out[rows], done[rows])
    for row in np.flatnonzero(~done):
        out[row] = stream_discrete_gaussian(key, int(sigma), int(indices[row]), n)
    return out


_BATCH_WORDS = 1 << 16  # raw words per batch of streams (512 KiB of cells, 512 KiB of logs)


# ----------------------------------------------------------------------------- compiled kernels
def _sfc64_next(state: np.ndarray) -> Any:
    """numpy's ``sfc64_next`` on one stream's state (a, b, c, counter), in place."""
    a, b, c, w = state[0], state[1], state[2], state[3]
    tmp = a + b + w
    state[3] = w + np.uint64(1)
    state[0] = b ^ (b >> np.uint64(11))
    state[1] = c + (c << np.uint64(3))
    state[2] = ((c << np.uint64(24)) | (c >> np.uint64(40))) + tmp
    return tmp


def _mix64(z: Any) -> Any:
    """:func:`mix64` on one uint64 (compiled)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _states_loop(key: np.ndarray, indices: np.ndarray, states: np.ndarray) -> None:
    """:func:`stream_state` compiled: word w of index j's seed is :func:`_keyed_hash` (key, j, w + 1)."""
    golden = np.uint64(0x9E3779B97F4A7C15)
    for i in range(indices.shape[0]):
        inner = _mix64(indices[i] ^ key[0])
        for word in range(3):
            states[i, word] = _mix64((inner + np.uint64(word + 1) * golden) ^ key[1])
        states[i, 3] = np.uint64(1)
        for _ in range(12):
            _sfc64_next(states[i])


def _fill_loop(states: np.ndarray, cells: np.ndarray, centres: np.ndarray) -> None:
    """Each stream's first block, as :func:`stream_discrete_gaussian` splits it: raw words in
    pairs, U₁'s 53-bit cell from the first (word >> 11), U₂'s cell and sign bit from the second
    (word >> 10); ``centres`` the float64 cell + ½ of each (U₂'s without the sign bit), whose
    log the caller takes. The SFC64 step of numpy's ``sfc64_next``, in registers."""
    one, r11, r10, r3, r24, r40 = (np.uint64(1), np.uint64(11), np.uint64(10), np.uint64(3), np.uint64(24),
                                   np.uint64(40))
    for i in range(cells.shape[0]):
        a, b, c, w = states[i, 0], states[i, 1], states[i, 2], states[i, 3]
        for k in range(0, cells.shape[1], 2):
            tmp = a + b + w  # U₁'s word
            a, b, c, w = b ^ (b >> r11), c + (c << r3), ((c << r24) | (c >> r40)) + tmp, w + one
            cell = np.int64(tmp >> r11)
            cells[i, k] = cell
            centres[i, k] = np.float64(cell) + 0.5
            tmp = a + b + w  # U₂'s word
            a, b, c, w = b ^ (b >> r11), c + (c << r3), ((c << r24) | (c >> r40)) + tmp, w + one
            cell = np.int64(tmp >> r10)
            cells[i, k + 1] = cell
            centres[i, k + 1] = np.float64(cell >> 1) + 0.5


def _decide_loop(cells: np.ndarray, logs: np.ndarray, sigma: float, margin: float, ln_cells: float,
                 out: np.ndarray, done: np.ndarray) -> None:
    """Each stream's proposals in order through the fast path of
    ``discrete_noise._gaussian_fast_path`` (the same float64 arithmetic on the same numpy logs).
    A stream is done when n proposals are accepted with every decision up to the last of them
    settled by the float bounds; otherwise the caller redraws it by the reference."""
    n = out.shape[1]
    inv = 1.0 / (sigma * math.sqrt(2.0))
    for i in range(cells.shape[0]):
        have = 0
        for p in range(cells.shape[1] // 2):
            first, second = cells[i, 2 * p], cells[i, 2 * p + 1]
            x = sigma * (ln_cells - logs[i, 2 * p])
            magnitude = np.floor(x)
            slack = sigma * (1.0 / first) + (x + 64.0 * sigma) * margin
            scaled_gap = (magnitude - sigma) * inv
            gamma = scaled_gap * scaled_gap
            y2 = ln_cells - logs[i, 2 * p + 1]
            gap = y2 - gamma
            sure = ((x - magnitude > slack) & (magnitude + 1.0 - x > slack)
                    & (abs(gap) > (1.0 / (second >> 1)) + (y2 + gamma + 64.0) * margin))
            if not sure:
                break
            value = np.int64(magnitude)
            negative = (second & 1) == 1
            out[i, min(have, n - 1)] = (1 - 2 * (second & 1)) * value
            have += int((gap > 0) & ~(negative & (value == 0)))
            if have == n:
                done[i] = True
                break


@functools.cache
def _kernels() -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    from numba import njit  # pylint: disable=import-outside-toplevel

    def compile_(fn: Callable[..., Any]) -> Any:
        return njit(cache=True, nogil=True, error_model="numpy")(fn)

    for helper in (_sfc64_next, _mix64):
        globals()[helper.__name__] = compile_(getattr(helper, "py_func", helper))
    return cast(tuple[Callable[..., None], Callable[..., None], Callable[..., None]],
                (compile_(_states_loop), compile_(_fill_loop), compile_(_decide_loop)))
