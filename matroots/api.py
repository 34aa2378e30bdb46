"""The public entry points: :func:`inverse_root` and :func:`root`."""

from __future__ import annotations

import dataclasses
from typing import Any

from .core.errors import InvalidArgumentError
from .core.options import SolveOptions
from .core.result import RootResult
from .solvers import registry
from .solvers.base import SolverConfig


def resolve_method(method: str | SolverConfig, **options: Any) -> SolverConfig:
    """A config object from a registry name or a config (options override its fields)."""
    if isinstance(method, SolverConfig):
        if not options:
            return method
        try:
            return dataclasses.replace(method, **options)
        except TypeError as exc:
            raise InvalidArgumentError(
                f"bad options for method {method.name!r}: {exc}; its options are "
                f"{registry.field_names(type(method))}; the solve options are {', '.join(SolveOptions.names())}"
            ) from exc
    if isinstance(method, str):
        return registry.get(method, **options)
    raise InvalidArgumentError(
        f"method must be a registry name ({', '.join(registry.available())}) or a solver config, "
        f"got {type(method).__name__}"
    )


def inverse_root(
    A: Any,
    p: Any,
    method: str | SolverConfig = "eigh",
    options: SolveOptions | None = None,
    **kwargs: Any,
) -> RootResult:
    """Compute the inverse p-th root A^{-1/p} of a matrix or a batch of matrices.

    The keywords are the fields of :class:`matroots.SolveOptions` (``eps``, ``eps_mode``, ``dtype``,
    ``compute_dtype``, ``tol``, ``max_iter``, ``strict``, ``record_history``, ``warm_start``, ``psd``,
    ``quiet``; the one definition, validated there) and the fields of the method's config; a
    ``SolveOptions`` object may be passed as ``options`` (keywords override it).

    Args:
        A: torch tensor or numpy array of shape (n, n) or (..., n, n), float64/float32/bfloat16/float16.
            It is never written to (views and transposes included). If it requires grad (and grad mode
            is on), ``method="eigh"`` returns a root attached to the graph (exact derivative, finite for
            repeated eigenvalues; see :mod:`matroots.solvers.eigh_autograd`); the Newton methods refuse
            such input with InvalidArgumentError rather than silently detaching it.
        p: the root; rational p > 0 for ``eigh``, integer p >= 1 for the Newton methods.
        method: a name from :func:`matroots.solvers.available` or a config object such as
            ``CoupledNewtonConfig(scaling="optimal")``. ``"auto"`` picks per matrix the cheapest
            configuration the measured selection table says meets ``target=`` (relative forward
            error; default from the dtype) and reports the choice in ``info["auto"]``
            (:mod:`matroots.solvers.auto`).
        eps, eps_mode: regularisation A + eps_abs I, eps_abs = eps ("absolute") or eps * lambda_max
            ("relative"); see :mod:`matroots.core.regularize`.
        dtype: working precision (float64, float32, bfloat16, float16 or a name such as "bf16"); the
            input is rounded to it. Default: the input's dtype.
        compute_dtype: precision of the arithmetic when it differs from ``dtype`` (mixed precision).
        tol, max_iter: Newton stopping tolerance on ||M_k - I||_F, in (0, 1) (default 4 p sqrt(n) u),
            and iteration cap, an int >= 1.
        strict: raise :class:`~matroots.ConvergenceError` instead of warning on non-convergence.
        record_history: keep the per-iteration residuals in ``result.history``.
        warm_start: a previous :class:`RootResult` or root, for methods that support it.
        **options: fields of the method's config (e.g. ``scaling="frobenius"``).

    Returns:
        A :class:`RootResult`.

    Raises:
        MatrootsInputError: a bad argument (:class:`~matroots.InvalidArgumentError` names it, shows the
            value and what is allowed; numpy and 0-d torch scalars are accepted for numbers, bools are
            not), a bad shape, dtype, exponent or a non-symmetric matrix for an SPD-only method.
        MatrootsNumericalError: the matrix actually solved is not positive definite, a value does not
            fit the working format (:class:`~matroots.FormatRangeError`), or ``strict=True`` and the
            iteration did not converge.
    """
    solve_kw, config_kw = _split(options, kwargs)
    cfg = resolve_method(method, **config_kw)
    return cfg.solve(A, p, **solve_kw)


def root(
    A: Any,
    p: Any,
    method: str | SolverConfig = "eigh",
    options: SolveOptions | None = None,
    **kwargs: Any,
) -> RootResult:
    """Compute the principal p-th root A^{1/p}; same arguments as :func:`inverse_root`.

    eigh uses lambda^{1/p}; the Newton methods run the coupled iteration for Y_k = X_k^{-1}
    (Y_{k+1} = T_k^{-1} Y_k, Higham 2008 §7.3).
    """
    solve_kw, config_kw = _split(options, kwargs)
    if "inverse" in solve_kw:
        raise InvalidArgumentError(
            "root() computes A^{1/p}; use inverse_root() for A^{-1/p} (inverse= given)"
        )
    cfg = resolve_method(method, **config_kw)
    return cfg.solve(A, p, inverse=False, **solve_kw)


def _split(options: SolveOptions | None, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(solve keywords: ``options``' non-default fields overridden by ``kwargs``, config fields).

    The solve keywords are validated once, by ``SolverConfig.solve`` building its SolveOptions.
    """
    if options is not None and not isinstance(options, SolveOptions):
        raise InvalidArgumentError(f"options must be a matroots.SolveOptions or None, got {options!r}")
    solve_kw, config_kw = SolveOptions.split(kwargs)
    if options is not None:
        solve_kw = {**options.changed(), **solve_kw}
    return solve_kw, config_kw
