"""Batched dense kernels of the ALS-type solvers: Gram formation, symmetric noise layout, solves.

Chien et al. 2021 (arXiv:2107.09802), Algorithm 1: every trained item j solves
    v_j = (Π_PSD(Ã_j) + λ0 K̃ + λ r_j I)⁻¹ b̃_j
with Ã_j the noisy Gram matrix. An r × r eigen-decomposition per item is the slow part of that
step; :func:`solve_noisy_systems` replaces it by one Cholesky factorisation and solve of each
item's whole (diagonally shifted) system, keeping the exact projection (its non-positive
eigenpairs only) for the items whose system has no Cholesky factor without it. Which system is
solved depends only on released quantities (Ã_j, b̃_j, the DP recounts behind r_j) and public
terms, so the choice is post-processing and costs no privacy.

Gram matrices are formed as one batched matrix product per bucket of padded rows; the gathered
factors are multiplied through a transposed view (no copy: BLAS reads it column-major). The DP
item Grams, whose release reads one triangle, and their right-hand sides are exact sums of
quantised rows and targets instead (:func:`exact_upper_gram_and_rhs`): float32 BLAS ``ssyrk`` on integer-valued rows in runs short
enough that no partial sum can round, accumulated in float64 -- the exact Gram the sensitivity
argument is about, at two thirds of the cost of float64 products.

The per-item Cholesky factorisations and solves, and the partial eigen-decompositions of the projection,
call LAPACK's ``dpotrf``/``dpotrs``/``dsyevr`` (scipy's, through
``scipy.linalg.cython_lapack``) from one compiled (numba) loop over the batch that releases the GIL:
scipy's Python wrappers hold it, which serialised the solver threads, and cost a wrapper call
(and a copy) per item. The calls and their arguments are the wrappers' (the triangle they read, copied
column-major), so the results are the same, bit for bit.
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections.abc import Callable, Iterator
from functools import lru_cache
from typing import Any, NamedTuple, cast

import numpy as np
from scipy.linalg import lapack

__all__ = [
    "gather_rows",
    "gram_and_rhs",
    "gram_quantum",
    "quantise_table",
    "quantise_gathered",
    "exact_upper_gram_and_rhs",
    "symmetric_from_upper",
    "positive_definite_mask",
    "psd_part",
    "noise_edge",
    "solve_noisy_systems",
    "add_to_diagonal",
    "solve_positive_definite",
    "project_psd",
]


def gather_rows(padded: np.ndarray, cols: np.ndarray, sqrt_weights: np.ndarray | None) -> np.ndarray:
    """(g, L, r) rows ``padded[cols]``, each scaled by its sqrt weight when ``sqrt_weights`` is given."""
    x = np.take(padded, cols, axis=0)
    if sqrt_weights is not None:
        x *= sqrt_weights.astype(padded.dtype, copy=False)[:, :, None]
    return x


def gram_and_rhs(x: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(Xᵀ X, Xᵀ y) for a batch: X is (g, L, r) (already weighted), ``targets`` y is (g, L).

    ``x.transpose(0, 2, 1)`` is a column-major view of each Xᵀ, which batched GEMM reads as is.
    """
    xt = x.transpose(0, 2, 1)
    gram = np.matmul(xt, x)
    rhs = np.matmul(xt, targets.astype(x.dtype, copy=False)[:, :, None])[:, :, 0]
    return gram, rhs


GRAM_BITS = 10  # the clip norm Γ spans 2^10 to 2^11 quanta: rounding moves a coordinate by <= δ/2 <= Γ/2048
_EXACT_FLOAT32 = float(1 << 24)  # integers up to 2^24 are exact in float32
_BLOCK_ROWS = 512  # rows per float32 rank-k update at most


def gram_quantum(clip: float) -> float:
    """δ = 2^(⌊log₂ Γ⌋ − GRAM_BITS), the quantum of the quantised Gram rows (:func:`quantise_table`):
    a power of two, so scaling integer sums by δ² is exact."""
    if not clip > 0 or not math.isfinite(clip):
        raise ValueError("the clip norm must be a positive finite number")
    _, exponent = math.frexp(clip)  # clip = m·2^e, m in [0.5, 1)
    return math.ldexp(1.0, exponent - 1 - GRAM_BITS)


def quantise_table(table: np.ndarray, clip: float) -> np.ndarray:
    """q(u/δ) per row as int16: each row u (‖u‖ <= Γ = ``clip``) quantised by :func:`_quantise_row`
    at weight 1, so ‖δ·q(u/δ)‖ <= Γ (|q| < 2^(GRAM_BITS+1) fits int16: half the bytes of float32
    to gather). Rows are independent: row i is a function of u_i alone."""
    table = np.ascontiguousarray(table, dtype=np.float64)
    integers = np.empty(table.shape, dtype=np.int16)
    if len(table):
        step = gram_quantum(clip)
        _quantised_gram_kernels()[0](table, clip / step, 1.0 / step, integers)
    return integers


def quantise_gathered(table: np.ndarray, cols: np.ndarray, sqrt_weights: np.ndarray, counts: np.ndarray,
                      clip: float) -> np.ndarray:
    """Gathered weighted rows quantised, (g, L, r) float32 integers: slot l of group j is
    q(√w_jl·u/δ) for u = ``table[cols[j, l]]`` (:func:`_quantise_row`: ‖δ·x‖ <= √w_jl·Γ); slots
    beyond ``counts[j]`` are zero."""
    x = np.zeros((*cols.shape, table.shape[1]), dtype=np.float32)
    if len(cols):
        step = gram_quantum(clip)
        _quantised_gram_kernels()[1](np.ascontiguousarray(table, dtype=np.float64), np.asarray(cols, dtype=np.int32),
                                     np.asarray(sqrt_weights, dtype=np.float64), np.asarray(counts, dtype=np.int64),
                                     clip / step, 1.0 / step, x)
    return x


def exact_upper_gram_and_rhs(x: np.ndarray, targets: np.ndarray, counts: np.ndarray, step: float, target_step: float,
                             out: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(δ²·Σ_l x_l x_lᵀ upper triangles, δ·δ_t·Σ_l t_l x_l) per group over its first ``counts[j]``
    rows, for integer rows x (g, L, r) (int16 or float32), δ = ``step``, and integer targets t
    (g, L) (integer-valued floats or ints; δ_t = ``target_step``, a power of two). ``out`` =
    (grams, rhs, slots): group j's sums written into ``grams[slots[j]]`` (its upper triangle) and
    ``rhs[slots[j]]``, and those arrays returned, instead of new ones.

    The Grams are sums of integer products, formed by float32 ``ssyrk`` over blocks of rows in
    which every coordinate's Σ_l x_lp² is at most 2^24: by Cauchy-Schwarz every partial sum BLAS
    forms for an entry (p, q), in any order, is then an integer of magnitude at most
    √(Σ x_lp² · Σ x_lq²) <= 2^24, so exact in float32. Blocks are accumulated in float64 (exact
    below 2^53) and scaled by the power of two δ²: the result is the exact Gram of the rows,
    whatever the order, blocking or threads, and one row less changes it by exactly δ²·x_l x_lᵀ.
    (arXiv:2107.09802, Algorithm 1, forms A_j = Σ_i c_ij u_i u_iᵀ; its sensitivity argument
    assumes exact sums, which this makes true.) A row with a coordinate above 2^12 is added in
    float64. Lower triangles are left unset (the release reads the upper ones only). The
    right-hand sides are int64 sums of the integer products t_l·x_l (|t| < 2^21·√w, |x| < 2^11·√w:
    exact while Σ w < 2^31 per group), scaled once: exact in any order as well."""
    if out is None:  # the loop sets the upper triangles
        out = np.empty((x.shape[0], x.shape[2], x.shape[2])), np.zeros((x.shape[0], x.shape[2])), np.arange(len(x))
    grams, rhs, slots = out
    if len(x):
        rows = x if x.dtype == np.int16 else np.asarray(x, dtype=np.float32)
        _quantised_gram_kernels()[2](np.ascontiguousarray(rows), np.asarray(targets, dtype=np.int64),
                                     np.asarray(counts, dtype=np.int64), step, target_step, grams, rhs,
                                     np.asarray(slots, dtype=np.int64))
    return grams, rhs


def _quantise_table_loop(table: np.ndarray, radius: float, inv_step: float, integers: np.ndarray) -> None:
    """Compiled by :func:`_quantised_gram_kernels`: every row of :func:`quantise_table`."""
    row = np.empty(table.shape[1])
    for i in range(table.shape[0]):
        _quantise_row(table[i], 1.0, radius, inv_step, row)
        for k in range(table.shape[1]):
            integers[i, k] = np.int16(row[k])


def _quantise_gathered_loop(table: np.ndarray, cols: np.ndarray, weights: np.ndarray, counts: np.ndarray,
                            radius: float, inv_step: float, x: np.ndarray) -> None:
    """Compiled by :func:`_quantised_gram_kernels`: every used slot of :func:`quantise_gathered`."""
    row = np.empty(table.shape[1])
    for j in range(cols.shape[0]):
        for slot in range(counts[j]):
            _quantise_row(table[cols[j, slot]], weights[j, slot], radius, inv_step, row)
            x[j, slot] = row


def _quantise_row(u: np.ndarray, w: float, radius: float, inv_step: float, out: np.ndarray) -> float:
    """out = the quantised row of w·u/δ within norm w·Γ/δ (``radius`` = Γ/δ); returns ‖out‖²
    (exact: a sum of small integers).

    y = w·u/δ clipped to norm w·Γ/δ·(1 − 10⁻⁹) (the margin covers the float products), then
    rounded to the nearest integers; while the rounded row is longer than w·Γ/δ, the coordinate
    rounded furthest away from zero moves one quantum towards it. That ends at the latest at y
    rounded towards zero, whose norm is at most ‖y‖: the bound always holds, and every coordinate
    moves by less than one quantum from y (at most half a quantum, except those moved). The
    length test compares the exact integer ‖out‖² with (w·Γ/δ)², exact at w = 1 (Γ/δ < 2^10) and
    otherwise lowered by 4·10⁻¹⁶ to cover the two float products' rounding."""
    rank = u.shape[0]
    bound = w * radius * (1.0 - 1e-9)
    out[:] = 0.0
    if not bound >= 1.0:  # no non-zero integer row fits (or w is not a number)
        return 0.0
    limit = (w * radius) ** 2 if w == 1.0 else (w * radius) ** 2 * (1.0 - 4e-16)
    norm2 = 0.0
    for k in range(rank):
        out[k] = u[k] * w * inv_step
        norm2 += out[k] * out[k]
    if norm2 > bound * bound:
        scale = bound / math.sqrt(norm2)
        for k in range(rank):
            out[k] *= scale
    energy = 0.0
    for k in range(rank):
        energy += np.rint(out[k]) ** 2
    while energy > limit:
        worst, excess = -1, 0.0
        for k in range(rank):
            away = abs(np.rint(out[k])) - abs(out[k])
            if away > excess:
                worst, excess = k, away
        if worst < 0:
            break  # unreachable: every coordinate already rounded towards zero
        rounded = np.rint(out[worst])
        energy -= 2.0 * abs(rounded) - 1.0
        out[worst] = rounded - math.copysign(1.0, rounded)  # an integer now: its rint is itself
    for k in range(rank):
        out[k] = np.rint(out[k])
    return energy


def _exact_gram_loop(x: np.ndarray, targets: np.ndarray, counts: np.ndarray, step: float, target_step: float,
                     grams: np.ndarray, rhs: np.ndarray, slots: np.ndarray) -> None:
    """Compiled by :func:`_quantised_gram_kernels`: the sums of :func:`exact_upper_gram_and_rhs`
    (rows converted to float32 into a block buffer, one ``ssyrk`` per block; ``load[p]`` is the
    block's Σ_l x_lp², kept <= 2^24 for every coordinate p), group j's into slot ``slots[j]``."""
    rank = x.shape[2]
    block = np.empty((_BLOCK_ROWS, rank), dtype=np.float32)
    product = np.empty((rank, rank), dtype=np.float32)
    load = np.zeros(rank)
    syrk = _syrk_arguments(rank)
    exact_rhs = np.zeros(rank, dtype=np.int64)
    for j in range(x.shape[0]):
        gram = grams[slots[j]]
        exact_rhs[:] = 0
        for p in range(rank):
            gram[p, p:] = 0.0
        filled = 0
        load[:] = 0.0
        for slot in range(counts[j]):
            target, peak, over = targets[j, slot], 0.0, False
            for k in range(rank):
                value = np.float64(x[j, slot, k])
                exact_rhs[k] += target * np.int64(x[j, slot, k])
                peak = max(peak, value * value)
                over |= load[k] + value * value > _EXACT_FLOAT32
            if peak > _EXACT_FLOAT32:  # a coordinate alone too large for float32: exact in float64
                _add_row_gram(x[j, slot], gram)
                continue
            if over or filled == _BLOCK_ROWS:
                _add_block_gram(block, filled, syrk, product, gram)
                filled = 0
                load[:] = 0.0
            for k in range(rank):
                block[filled, k] = x[j, slot, k]
                load[k] += np.float64(x[j, slot, k]) ** 2
            filled += 1
        _add_block_gram(block, filled, syrk, product, gram)
        for p in range(rank):
            rhs[slots[j], p] = np.float64(exact_rhs[p]) * (step * target_step)
            for q in range(p, rank):
                gram[p, q] *= step * step


def _add_row_gram(row: np.ndarray, gram: np.ndarray) -> None:
    """gram's upper triangle += row rowᵀ in float64 (exact: products below 2^53)."""
    for p in range(row.shape[0]):
        for q in range(p, row.shape[0]):
            gram[p, q] += np.float64(row[p]) * np.float64(row[q])


class _SyrkArguments(NamedTuple):
    """``ssyrk``'s by-reference arguments for rank-k updates of r × r upper triangles."""

    lower: np.ndarray
    no_trans: np.ndarray
    dim: np.ndarray
    used: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray


def _syrk_arguments(rank: int) -> _SyrkArguments:
    return _SyrkArguments(np.array([ord("L")], dtype=np.uint8), np.array([ord("N")], dtype=np.uint8),
                          np.array([rank], dtype=np.int32), np.zeros(1, dtype=np.int32),
                          np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32))


def _add_block_gram(block: np.ndarray, filled: int, syrk: _SyrkArguments, product: np.ndarray,
                    gram: np.ndarray) -> None:
    """gram's upper triangle += the Gram of block[:filled] (float32 ``ssyrk`` into ``product``;
    exact where the caller's bound holds)."""
    if filled == 0:
        return
    rank = block.shape[1]
    syrk.used[0] = filled
    _SSYRK(syrk.lower.ctypes, syrk.no_trans.ctypes, syrk.dim.ctypes, syrk.used.ctypes, syrk.alpha.ctypes,
           block.ctypes, syrk.dim.ctypes, syrk.beta.ctypes, product.ctypes, syrk.dim.ctypes)
    for p in range(rank):  # column-major lower = row-major upper
        for q in range(p, rank):
            gram[p, q] += product[p, q]


@lru_cache(maxsize=64)
def _upper_index(rank: int) -> np.ndarray:
    """(rank, rank) map from (i, j) to the position of (min(i, j), max(i, j)) in ``np.triu_indices`` order."""
    rows, cols = np.triu_indices(rank)
    index = np.empty((rank, rank), dtype=np.intp)
    index[rows, cols] = np.arange(len(rows))
    index[cols, rows] = np.arange(len(rows))
    index.setflags(write=False)
    return index


def symmetric_from_upper(upper: np.ndarray, rank: int) -> np.ndarray:
    """Symmetric (..., rank, rank) matrices from their upper triangles in ``np.triu_indices`` order.

    One gather; equal element for element to scattering ``upper`` into the upper and lower triangles.
    """
    return np.take(upper, _upper_index(rank), axis=-1)


def project_psd(matrices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Π_PSD by eigen-decomposition: returns (clamped eigenvalues, eigenvectors)."""
    eigval, eigvec = np.linalg.eigh(matrices)
    return np.maximum(eigval, 0.0), eigvec


def positive_definite_mask(systems: np.ndarray) -> np.ndarray:
    """Which of the symmetric ``systems`` (n, r, r) have a Cholesky factor (are numerically PD).

    One LAPACK ``potrf`` per matrix: its status is per matrix, where numpy's batched Cholesky is
    all-or-nothing (and, copying and cleaning each factor, about twice as slow at r = 64).
    float64 batches run in the compiled loop (module doc); ``systems`` is left as it is.
    """
    if _compiled_ok(systems):
        status = np.empty(len(systems), dtype=np.int32)
        unused = np.empty((0, 0))  # no right-hand sides: the factorisations' status only
        _cholesky_kernel()(systems, unused, unused, status, False, np.empty(0), np.empty((0, 0, 0)))
        factorised: np.ndarray = status == 0
        return factorised
    potrf = lapack.get_lapack_funcs("potrf", (systems,))  # the upper triangle, as the compiled loop reads it
    return np.fromiter((potrf(a.T, lower=True, clean=False)[1] == 0 for a in systems), dtype=bool, count=len(systems))


def _compiled_ok(systems: np.ndarray, rhs: np.ndarray | None = None) -> bool:
    """Whether the compiled LAPACK loop takes these arrays: float64, C-contiguous, non-empty."""
    arrays = (systems,) if rhs is None else (systems, rhs)
    return len(systems) > 0 and all(a.dtype == np.float64 and a.flags.c_contiguous for a in arrays)


def _lapack_address(name: str, blas: bool = False) -> int:
    """Address of LAPACK routine ``name`` in ``scipy.linalg.cython_lapack`` (the wrappers' LAPACK),
    or with ``blas`` of BLAS routine ``name`` in ``scipy.linalg.cython_blas`` (the same library)."""
    from scipy.linalg import cython_blas, cython_lapack  # pylint: disable=import-outside-toplevel

    capsule = (cython_blas if blas else cython_lapack).__pyx_capi__[name]
    get_name = ctypes.pythonapi.PyCapsule_GetName
    get_name.restype, get_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
    get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
    get_pointer.restype, get_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return int(get_pointer(capsule, get_name(capsule)))


_LAPACK_ARGUMENTS = {"dpotrf": 5, "dpotrs": 8, "dsyevr": 21}  # every argument a pointer (Fortran calling convention)
_BLAS_ARGUMENTS = {"ssyrk": 10}
_DPOTRF: Any = None  # numba external functions, set by :func:`_cholesky_kernel`
_DPOTRS: Any = None
_DSYEVR: Any = None
_SSYRK: Any = None


@functools.cache
def _cholesky_kernel() -> Callable[..., None]:
    """:func:`_cholesky_loop` compiled by numba at the first call (numba is imported only then:
    processes that never solve, the API, do not load it). The LAPACK routines are external symbols
    registered under fixed names at their run-time addresses, so the compiled code is cached on
    disk like the sampler's."""
    import llvmlite.binding as llvm  # pylint: disable=import-outside-toplevel
    from numba import njit, types  # pylint: disable=import-outside-toplevel

    routines = [(name, n_args, False) for name, n_args in _LAPACK_ARGUMENTS.items()]
    for name, n_args, blas in routines + [(name, n_args, True) for name, n_args in _BLAS_ARGUMENTS.items()]:
        symbol = f"privrec_{name}"
        llvm.add_symbol(symbol, _lapack_address(name, blas))
        globals()[f"_{name.upper()}"] = types.ExternalFunction(symbol, types.void(*([types.voidptr] * n_args)))
    return cast(Callable[..., None], njit(cache=True, nogil=True)(_cholesky_loop))


_KERNEL_LOCK = threading.Lock()  # solver threads may ask for the kernels at the same moment


def _quantised_gram_kernels() -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    """(:func:`_quantise_table_loop`, :func:`_quantise_gathered_loop`, :func:`_exact_gram_loop`)
    compiled as :func:`_cholesky_kernel` is; their helpers are compiled first and bound to the
    module names the loops call, as the BLAS symbols are. Built once, under a lock."""
    with _KERNEL_LOCK:
        return _build_quantised_gram_kernels()


@functools.cache
def _build_quantised_gram_kernels() -> tuple[Callable[..., None], Callable[..., None], Callable[..., None]]:
    _cholesky_kernel()  # registers the BLAS symbols
    from numba import njit  # pylint: disable=import-outside-toplevel

    def compile_(fn: Callable[..., Any]) -> Any:
        return njit(cache=True, nogil=True)(getattr(fn, "py_func", fn))  # the Python function, even if compiled

    for helper in (_quantise_row, _add_row_gram, _add_block_gram, _syrk_arguments):
        globals()[helper.__name__] = compile_(helper)
    return compile_(_quantise_table_loop), compile_(_quantise_gathered_loop), compile_(_exact_gram_loop)


@functools.cache
def _eigen_kernel() -> Callable[..., None]:
    """:func:`_negative_eigenpairs_loop` compiled as :func:`_cholesky_kernel` is."""
    _cholesky_kernel()  # registers the LAPACK symbols
    from numba import njit  # pylint: disable=import-outside-toplevel

    return cast(Callable[..., None], njit(cache=True, nogil=True)(_negative_eigenpairs_loop))


def _negative_eigenpairs_loop(matrices: np.ndarray, floors: np.ndarray, eigval: np.ndarray, eigvec: np.ndarray,
                              found: np.ndarray, info_out: np.ndarray) -> None:
    """Per matrix k: LAPACK ``dsyevr`` of its upper triangle for the eigenpairs in (floors[k], 0],
    with the arguments scipy's wrapper passes (``compute_v=1, range="V", lower=0``, default
    workspace); eigenvalues in eigval[k, :found[k]], eigenvector c in eigvec[k, c] (the rows of
    eigvec[k] are the wrapper's columns). Compiled by :func:`_eigen_kernel`."""
    n, r = matrices.shape[0], matrices.shape[1]
    jobz, uplo = np.array([ord("V")], dtype=np.uint8), np.array([ord("U")], dtype=np.uint8)
    value_range = jobz  # "V": eigenvectors, and eigenvalues in a value range
    dim = np.array([r], dtype=np.int32)
    lower, upper, abstol = np.zeros(1), np.zeros(1), np.zeros(1)
    il, iu = np.array([1], dtype=np.int32), np.array([r], dtype=np.int32)
    count, info = np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.int32)
    lwork, liwork = np.array([max(26 * r, 1)], dtype=np.int32), np.array([max(10 * r, 1)], dtype=np.int32)
    work, iwork = np.empty(lwork[0]), np.empty(liwork[0], dtype=np.int32)
    support = np.empty(2 * r, dtype=np.int32)
    a = np.zeros((r, r))  # a[q, p] is the column-major (p, q) entry
    w, z = np.empty(r), np.empty((r, r))
    for k in range(n):
        for q0 in range(0, r, 8):
            for p0 in range(0, q0 + 1, 8):
                for q in range(q0, min(q0 + 8, r)):
                    for p in range(p0, min(p0 + 8, q + 1)):
                        a[q, p] = matrices[k, p, q]
        lower[0] = floors[k]
        _DSYEVR(jobz.ctypes, value_range.ctypes, uplo.ctypes, dim.ctypes, a.ctypes, dim.ctypes, lower.ctypes,
                upper.ctypes, il.ctypes, iu.ctypes, abstol.ctypes, count.ctypes, w.ctypes, z.ctypes, dim.ctypes,
                support.ctypes, work.ctypes, lwork.ctypes, iwork.ctypes, liwork.ctypes, info.ctypes)
        found[k], info_out[k] = count[0], info[0]
        eigval[k] = w
        eigvec[k] = z


def _cholesky_loop(systems: np.ndarray, rhs: np.ndarray, out: np.ndarray, info_out: np.ndarray, solve: bool,
                   diagonal: np.ndarray, extra: np.ndarray) -> None:
    """Per system j: LAPACK ``dpotrf`` of the symmetric matrix whose upper triangle is that of
    systems[j] + E_j + diagonal[j]·I, status in ``info_out[j]``; with ``solve``, ``dpotrs`` of
    rhs[j] into out[j] where the factorisation succeeded (``posv`` is exactly the two). E_j: none
    if ``extra`` is empty, else extra[0] for every j if it holds one matrix, else extra[j]. The
    row-major upper triangle is the column-major lower one LAPACK reads, so it is copied row by
    row (scipy's wrapper given the transposed matrix and ``lower=True`` reads the same numbers),
    the terms added on the way; ``systems`` is only read (its lower triangle never).
    Compiled by :func:`_cholesky_kernel`."""
    n, r = systems.shape[0], systems.shape[1]
    uplo = np.array([ord("L")], dtype=np.uint8)
    dim = np.array([r], dtype=np.int32)
    one = np.array([1], dtype=np.int32)
    info = np.zeros(1, dtype=np.int32)
    factor = np.zeros((r, r))  # factor[q, p] is the column-major (p, q) entry
    x = np.empty(r)
    shared = extra.shape[0] == 1
    for j in range(n):
        for q in range(r):  # the upper triangle, row by row (contiguous)
            for p in range(q, r):
                factor[q, p] = systems[j, q, p]
        if extra.shape[0]:
            e = extra[0] if shared else extra[j]
            for q in range(r):
                for p in range(q, r):
                    factor[q, p] += e[q, p]
        if diagonal.shape[0]:
            for p in range(r):
                factor[p, p] += diagonal[j]
        _DPOTRF(uplo.ctypes, dim.ctypes, factor.ctypes, dim.ctypes, info.ctypes)
        info_out[j] = info[0]
        if solve and info[0] == 0:
            x[:] = rhs[j]
            _DPOTRS(uplo.ctypes, dim.ctypes, one.ctypes, factor.ctypes, dim.ctypes, x.ctypes, dim.ctypes, info.ctypes)
            out[j] = x


def psd_part(matrices: np.ndarray) -> np.ndarray:
    """Π_PSD of each symmetric matrix (n, r, r), as A − Σ_{λ_k <= 0} λ_k q_k q_kᵀ.

    Only the non-positive eigenpairs are computed (LAPACK ``syevr`` on a value range): a noisy
    Gram that just failed a Cholesky test has few, and this is several times cheaper than a full
    eigen-decomposition. Equal to ``V max(Λ, 0) Vᵀ`` up to rounding. float64 batches call
    ``syevr`` from the compiled loop (module doc), with the wrapper's arguments: the same numbers.
    """
    out = np.array(matrices, copy=True)
    if len(matrices) == 0:
        return out
    floors = [-float(np.abs(a).sum(axis=1).max()) - 1.0 for a in matrices]  # below every eigenvalue (Gershgorin)
    pairs = (_compiled_negative_eigenpairs if _compiled_ok(matrices) else _wrapper_negative_eigenpairs)(matrices, floors)
    for k, (values, vectors, count, status) in enumerate(pairs):
        if status != 0:
            raise np.linalg.LinAlgError("syevr did not converge")
        if count:
            out[k] -= (vectors[:, :count] * values[:count]) @ vectors[:, :count].T
    return out


_EIGEN_GROUP = 16  # matrices per compiled call: their eigenvectors stay small (2 MiB at r = 128)


def _compiled_negative_eigenpairs(matrices: np.ndarray, floors: list[float]) -> Iterator[tuple[np.ndarray, np.ndarray, int, int]]:
    """:func:`_wrapper_negative_eigenpairs` by the compiled loop, a group of matrices at a time.
    Each eigenvector block is yielded transposed, column-major like the wrapper's ``z``, so the
    caller's products are the same BLAS calls."""
    kernel, rank = _eigen_kernel(), matrices.shape[-1]
    eigval, eigvec = np.empty((_EIGEN_GROUP, rank)), np.empty((_EIGEN_GROUP, rank, rank))
    found, info = np.empty(_EIGEN_GROUP, dtype=np.int32), np.empty(_EIGEN_GROUP, dtype=np.int32)
    for start in range(0, len(matrices), _EIGEN_GROUP):
        group = matrices[start : start + _EIGEN_GROUP]
        kernel(group, np.array(floors[start : start + _EIGEN_GROUP]), eigval, eigvec, found, info)
        for k in range(len(group)):
            yield eigval[k], eigvec[k].T, int(found[k]), int(info[k])


def _wrapper_negative_eigenpairs(matrices: np.ndarray, floors: list[float]) -> Iterator[tuple[np.ndarray, np.ndarray, int, int]]:
    """(eigenvalues, eigenvectors, how many, status) in (floor, 0] per matrix, by scipy's ``syevr``."""
    syevr = lapack.get_lapack_funcs("syevr", (matrices,))
    for a, floor in zip(matrices, floors, strict=True):
        eigval, eigvec, found, _, info = syevr(a, compute_v=1, range="V", vl=floor, vu=0.0)
        yield eigval, eigvec, int(found), int(info)


def noise_edge(std: float, rank: int) -> float:
    """≈ the spectral norm 2σ√r of an r × r symmetric matrix with i.i.d. N(0, σ²) upper triangle
    (Wigner semicircle edge): a data-independent bound on how negative a noisy Gram's spectrum gets."""
    return 2.0 * std * math.sqrt(rank)


def solve_noisy_systems(
    grams: np.ndarray,
    rhs: np.ndarray,
    ridge: np.ndarray,
    extra: np.ndarray | None = None,
    shift: float | np.ndarray = 0.0,
) -> tuple[np.ndarray, int]:
    """Solve (P_j + E_j + ridge_j I) x_j = b_j for a batch; return (x, number projected).

    Ã_j (``grams``) are noisy Gram matrices, s = ``shift`` >= 0 a diagonal shift (a scalar, or
    (n, 1) one per system; data-independent or a function of released quantities), E (``extra``,
    (r, r) or (n, r, r)) a PSD sum of exact Gram terms, ridge_j > 0; only the upper triangles of
    ``grams`` are read (a release may leave the lower ones unset). P_j = Ã_j + s I where the
    whole system Ã_j + s I + E_j + ridge_j I has a Cholesky factor (one factorisation, then its
    solve), and P_j = Π_PSD(Ã_j + s I), the exact projection of arXiv:2107.09802 Algorithm 1
    (its non-positive eigenpairs only, :func:`psd_part`), for the rest. So the projection runs
    only where the system could not be solved without it; a shift at the noise's spectral edge
    (:func:`noise_edge`) keeps that rest small. Everything here is a function of released and
    public quantities: post-processing, no privacy cost. ``grams`` is not modified.
    """
    n = len(grams)
    shifts = np.broadcast_to(np.asarray(shift, dtype=np.float64).reshape(-1), (n,)) if n else np.empty(0)
    if not _compiled_ok(grams, rhs):
        return _solve_noisy_systems_by_wrappers(grams, rhs, ridge, extra, shifts)
    out = np.empty(rhs.shape)
    info = np.empty(n, dtype=np.int32)
    terms = np.empty((0, 0, 0)) if extra is None else np.ascontiguousarray(extra, dtype=np.float64).reshape(
        -1, *grams.shape[1:])
    _cholesky_kernel()(grams, rhs, out, info, True, np.ascontiguousarray(shifts + ridge), terms)
    bad = np.flatnonzero(info != 0)
    if len(bad):
        out[bad] = _solve_projected_systems(grams[bad], rhs[bad], ridge[bad], _rows(extra, bad), shifts[bad])
    return out, int(len(bad))


def _rows(extra: np.ndarray | None, rows: np.ndarray) -> np.ndarray | None:
    return extra[rows] if extra is not None and extra.ndim == 3 else extra


def _solve_projected_systems(grams: np.ndarray, rhs: np.ndarray, ridge: np.ndarray, extra: np.ndarray | None,
                             shifts: np.ndarray) -> np.ndarray:
    """x_j = (Π_PSD(Ã_j + s_j I) + E_j + ridge_j I)⁻¹ b_j (the systems the direct factorisation refused)."""
    system = _symmetric_copy(grams)  # ``grams`` is not modified
    add_to_diagonal(system, shifts[:, None])
    system = psd_part(system)
    if extra is not None:
        system += extra
    add_to_diagonal(system, ridge[:, None])
    return solve_positive_definite(system, rhs)


def _solve_noisy_systems_by_wrappers(grams: np.ndarray, rhs: np.ndarray, ridge: np.ndarray, extra: np.ndarray | None,
                                     shifts: np.ndarray) -> tuple[np.ndarray, int]:
    """:func:`solve_noisy_systems` for batches the compiled loop does not take (other dtypes)."""
    system = _symmetric_copy(grams)
    add_to_diagonal(system, (shifts + ridge)[:, None])
    if extra is not None:
        system += extra
    ok = positive_definite_mask(system)
    out = np.empty(rhs.shape, dtype=np.float64)
    if ok.any():
        out[ok] = solve_positive_definite(system[ok], rhs[ok])
    bad = np.flatnonzero(~ok)
    if len(bad):
        out[bad] = _solve_projected_systems(grams[bad], rhs[bad], ridge[bad], _rows(extra, bad), shifts[bad])
    return out, int(len(bad))


def _symmetric_copy(matrices: np.ndarray) -> np.ndarray:
    """float64 symmetric matrices from the upper triangles of ``matrices`` (the lower ones unread)."""
    upper = np.triu(np.asarray(matrices, dtype=np.float64))
    return upper + np.triu(upper, 1).swapaxes(-1, -2)


def solve_positive_definite(systems: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """x_j = A_j⁻¹ b_j for symmetric positive definite A_j (n, r, r) and b_j (n, r).

    One LAPACK ``posv`` (Cholesky factor and solve) per system: about half an LU's work, and
    faster than numpy's batched LU (≈ 13 vs 24 µs at r = 64, 70 vs 110 µs at r = 128). A system
    whose factorisation fails (not PD in floating point) is solved by LU instead.
    """
    out = np.empty(rhs.shape, dtype=np.result_type(systems, rhs))
    if _compiled_ok(systems, rhs):
        info = np.empty(len(systems), dtype=np.int32)
        _cholesky_kernel()(systems, rhs, out, info, True, np.empty(0), np.empty((0, 0, 0)))
        failed = [int(j) for j in np.flatnonzero(info != 0)]
    else:
        failed = _solve_with_wrapper(systems, rhs, out)
    if failed:
        out[failed] = np.linalg.solve(systems[failed], rhs[failed][:, :, None])[:, :, 0]
    return out


def _solve_with_wrapper(systems: np.ndarray, rhs: np.ndarray, out: np.ndarray) -> list[int]:
    """scipy's ``posv`` per system into ``out``; returns the systems it could not factorise."""
    posv = lapack.get_lapack_funcs("posv", (systems, rhs))
    failed = []
    for j, (a, b) in enumerate(zip(systems, rhs, strict=True)):
        _, x, info = posv(a.T, b, lower=True)  # the upper triangle, as the compiled loop reads it
        if info == 0:
            out[j] = x
        else:
            failed.append(j)
    return failed


def add_to_diagonal(matrices: np.ndarray, values: np.ndarray | float) -> None:
    """matrices[..., i, i] += values (broadcast to (..., r)), in place: the diagonal alone is
    touched, where adding ``values · I`` would read and write (and allocate) every entry."""
    index = np.arange(matrices.shape[-1])
    matrices[..., index, index] += values
