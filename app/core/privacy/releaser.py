"""The Gaussian releases every algorithm makes, and the record the run's event is rebuilt from.

Each release is a Gaussian mechanism (Dwork & Roth 2014, Thm A.1) drawn as an exact discrete
Gaussian on a grid (Canonne, Kamath & Steinke 2020, arXiv:2004.00010, Thm 14; see
:mod:`app.core.privacy.discrete_noise`) and charged as one ``GaussianDpEvent`` whose noise multiplier
is noise std / L2 sensitivity.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field

import numpy as np
from dp_accounting import dp_event
from numpy.typing import ArrayLike

from app.core.arrays import FloatArray
from app.core.privacy import accounting
from app.core.privacy.discrete_noise import GridGaussian, NoiseSource, grid_gaussian, mirror_upper, noise_switched_off
from app.core.privacy.keyed import KeyedRandomness, NoiseKey

__all__ = ["AuditTap", "GaussianReleaser", "audit_tap", "symmetric_noise", "tap_grid_release", "tap_release"]


# ----------------------------------------------------------------------------- test-only audit hook
@dataclass
class AuditTap:
    """Tests/benchmarks only: one run's releases as a white-box one-run audit reads them (Steinke,
    Nasr & Jagielski 2023, arXiv:2305.08846), and the one release whose noise is switched off
    (the audit's negative control). ``outputs[name]``: that release's outputs in release order;
    ``rows[name]``: (positions, released rows) of releases drawn chunk by chunk; ``grids[name]``:
    its grid step."""

    noise_off: str | None = None
    outputs: dict[str, list[np.ndarray]] = field(default_factory=dict)
    rows: dict[str, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    grids: dict[str, float] = field(default_factory=dict)
    switched_off: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def keep(self, name: str, value: np.ndarray) -> None:
        with self._lock:
            self.outputs.setdefault(name, []).append(np.array(value, copy=True))

    def keep_rows(self, name: str, positions: np.ndarray, value: np.ndarray) -> None:
        with self._lock:
            self.rows.setdefault(name, []).append((np.array(positions, copy=True), np.array(value, copy=True)))


_TAP: ContextVar[AuditTap | None] = ContextVar("privrec_audit_tap", default=None)


@contextmanager
def audit_tap(noise_off: str | None = None) -> Iterator[AuditTap]:
    """Tests/benchmarks only: record every release of the runs started inside, and draw the release
    named ``noise_off`` (if any) without noise. A context variable, never a parameter: no API
    request, setting or stored config can reach it."""
    tap = AuditTap(noise_off=noise_off)
    token = _TAP.set(tap)
    try:
        yield tap
    finally:
        _TAP.reset(token)


def tap_release(name: str, released: np.ndarray, noiseless: np.ndarray, positions: np.ndarray | None = None
                ) -> np.ndarray:
    """A release drawn outside :class:`GaussianReleaser` (one-bit's): ``released`` as drawn; inside
    the test-only :func:`audit_tap`, recorded (with its ``positions``, e.g. item columns, if given),
    and ``noiseless`` instead when the audit switched this release's noise off."""
    tap = _TAP.get()
    if tap is None:
        return released
    if name == tap.noise_off:
        tap.switched_off, released = True, noiseless
    if positions is None:
        tap.keep(name, released)
    else:
        tap.keep_rows(name, positions, released)
    return released


def tap_grid_release(name: str, grid: GridGaussian, rng: np.random.Generator, value: np.ndarray) -> np.ndarray:
    """``grid.release(rng, value)`` for a grid release made outside :class:`GaussianReleaser`, seen
    by the test-only :func:`audit_tap` as :meth:`GaussianReleaser.vector` releases are."""
    tap = _TAP.get()
    if tap is None:
        return grid.release(rng, value)
    tap.grids[name] = grid.grid
    if name == tap.noise_off:
        tap.switched_off, grid = True, _NoiseOffGrid(**asdict(grid))
    released = grid.release(rng, value)
    tap.keep(name, released)
    return released


@dataclass(frozen=True)
class _NoiseOffGrid(GridGaussian):
    """A grid release drawn with its noise switched off (the audit's negative control only)."""

    def release(self, rng: NoiseSource, value: np.ndarray) -> np.ndarray:
        with noise_switched_off():
            return super().release(rng, value)

    def release_symmetric(self, rng: NoiseSource, value: np.ndarray, out: np.ndarray | None = None,
                          mirror: bool = True) -> np.ndarray:
        with noise_switched_off():
            return super().release_symmetric(rng, value, out=out, mirror=mirror)


class GaussianReleaser:
    """Adds calibrated Gaussian noise and records one ``GaussianDpEvent`` per release.

    The run's event is rebuilt from this record and must equal the reserved event, so a noise
    draw that is missing (or extra) cannot go unnoticed.
    """

    def __init__(self, rng: np.random.Generator | None, keyed: KeyedRandomness | None = None) -> None:
        self._rng = rng
        self._keyed = keyed  # keyed mode: release n's noise from streams keyed by (seed, n, index)
        self.releases: list[tuple[str, float, float]] = []  # (name, sensitivity, multiplier)
        self._tap = _TAP.get()  # None outside tests' audit_tap

    def _source(self, indices: np.ndarray | None = None) -> NoiseSource:
        """The noise of the release just recorded: the generator, or (keyed mode) the streams of
        its ``indices`` (one row each; None: the release drawn whole, index 0)."""
        if self._keyed is None:
            return self.rng
        rows = np.zeros(1, dtype=np.int64) if indices is None else indices
        return self._keyed.noise(len(self.releases) - 1).at(rows)

    def noise_key(self) -> NoiseKey:
        """Keyed mode only: the noise streams of the last recorded release, to draw its rows by
        public index (``.at(indices)``) wherever each row's statistic is complete."""
        if self._keyed is None:
            raise RuntimeError("indexed noise needs a keyed releaser")
        return self._keyed.noise(len(self.releases) - 1)

    @property
    def rng(self) -> np.random.Generator:
        if self._rng is None:
            raise RuntimeError("a keyed releaser has no sequential generator")
        return self._rng

    def noise_streams(self, n: int) -> list[np.random.Generator]:
        """n independent generators for noise drawn in parallel, seed-deterministic: the children
        ``Generator.spawn`` would make (the same ``SeedSequence.spawn``), each driving numpy's
        SFC64 bit generator instead of PCG64 (raw words ≈ 25 % cheaper, a tenth of a grid
        release's time; the same class of generator: statistical, not cryptographic). A
        generator without a seed sequence (a test double) spawns its own children."""
        seed_seq = getattr(getattr(self.rng, "bit_generator", None), "seed_seq", None)
        if not isinstance(seed_seq, np.random.SeedSequence):
            return list(self.rng.spawn(n))
        return [np.random.Generator(np.random.SFC64(child)) for child in seed_seq.spawn(n)]

    def record(self, name: str, sensitivity: float, multiplier: float) -> float:
        """Record one release and return its noise std (= sensitivity x multiplier)."""
        if not (sensitivity > 0 and multiplier > 0):
            raise ValueError("sensitivity and noise multiplier must be > 0")
        self.releases.append((name, float(sensitivity), float(multiplier)))
        return sensitivity * multiplier

    def record_grid(self, name: str, sensitivity: float, multiplier: float, changed: int) -> GridGaussian:
        """Record one release drawn on a grid (exact discrete Gaussian, ``app.core.privacy.discrete_noise``);
        ``changed`` bounds the coordinates one user can change."""
        self.record(name, sensitivity, multiplier)
        grid = grid_gaussian(sensitivity, multiplier, changed)
        if self._tap is None:
            return grid
        self._tap.grids[name] = grid.grid
        if name != self._tap.noise_off:
            return grid
        self._tap.switched_off = True
        return _NoiseOffGrid(**asdict(grid))

    def observe(self, name: str, positions: np.ndarray, released: np.ndarray) -> None:
        """Hand a chunk of release ``name`` (rows ``positions``) to the test-only audit tap, if any."""
        if self._tap is not None:
            self._tap.keep_rows(name, positions, released)

    def _kept(self, name: str, released: FloatArray) -> FloatArray:
        if self._tap is not None:
            self._tap.keep(name, released)
        return released

    def vector(self, name: str, value: ArrayLike, sensitivity: float, multiplier: float) -> FloatArray:
        """round(value/g)·g plus exact discrete Gaussian noise on the grid (charged GaussianDpEvent)."""
        statistic = np.asarray(value)
        grid = self.record_grid(name, sensitivity, multiplier, max(statistic.size, 1))
        return self._kept(name, grid.release(self._source(), statistic))

    def symmetric(self, name: str, value: FloatArray, sensitivity: float, multiplier: float) -> FloatArray:
        """Noise on a (batch of) symmetric matrices: i.i.d. upper triangle, mirrored."""
        rank = value.shape[-1]
        changed = max(value.size // (rank * rank), 1) * rank * (rank + 1) // 2
        grid = self.record_grid(name, sensitivity, multiplier, changed)
        return self._kept(name, grid.release_symmetric(self._source(), value))

    def event(self, n_steps: int, per_step: int) -> dp_event.DpEvent:
        """Rebuild the event from the record (pre-processing releases, then T identical steps)."""
        n_pre = len(self.releases) - n_steps * per_step
        pre = [accounting.gaussian(m) for _, _, m in self.releases[:n_pre]]
        steps = [self.releases[n_pre + t * per_step : n_pre + (t + 1) * per_step] for t in range(n_steps)]
        if any([m for _, _, m in s] != [m for _, _, m in steps[0]] for s in steps):
            raise RuntimeError("training steps released with different noise")
        one_step = accounting.compose([accounting.gaussian(m) for _, _, m in steps[0]])
        return accounting.compose(pre + [dp_event.SelfComposedDpEvent(one_step, n_steps)])


def symmetric_noise(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> FloatArray:
    """Symmetric noise: i.i.d. N(0, std²) on the upper triangle (diagonal included), mirrored."""
    rank = shape[-1]
    upper = rng.normal(0.0, std, size=tuple(shape[:-2]) + (rank * (rank + 1) // 2,))
    return mirror_upper(upper, rank)
