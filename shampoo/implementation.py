"""The implementation setting of one :class:`shampoo.Shampoo`: which fast paths its step takes.

Like torch.optim's ``foreach``/``fused`` flags it is chosen per optimizer instance, frozen, and
changes how the step is computed, not what it computes: every path computes the same formulas
(docs/design.md §6), bitwise where the paths run the same kernels in the same order, and to
rounding where one pass replaces several. Two optimizers in one process may differ; the tests
compare each fast path with its reference path this way.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InvalidShampooArgumentError

#: The default round chunk: 8 MiB per (c, n, n) batch (docs/design.md §6, "Root computation").
DEFAULT_ROUND_CHUNK_BYTES = 8 * 2**20

#: Where a background root round is solved (``root_device``; docs/design.md §6, "Asynchronous roots").
ROOT_DEVICES = ("auto", "same", "host", "device")


@dataclass(frozen=True, kw_only=True)
class ShampooImplementation:
    """Fast paths of one Shampoo optimizer (``Shampoo(..., implementation=...)``).

    Args:
        fused_adam: Adam grafting with a first moment and bias correction updates both moments and
            writes its direction in one call of torch's fused Adam kernel (``torch._fused_adam_`` on
            a zeroed buffer with lr = -1) instead of six elementwise passes; equal to rounding.
        apply_from_buckets: on one process without momentum, for contiguous parameters of their
            state's dtype, w <- w - lr s_j D_j is added straight from each bucket's stacked
            directions into the parameters (-lr s_j rounded once instead of s_j D_j; equal to
            rounding); False: always through the per-parameter direction tensors.
        trust_factors: the factors a root round hands to the solvers are finite, exactly symmetric
            and correctly shaped by construction, so the solves skip their input checks
            (``trusted=True`` of :class:`matroots.SolveOptions`); False re-validates them (bitwise
            the same roots).
        round_chunk_bytes: a root round solves the due factors of one (n, p) in consecutive
            batches of at most this many bytes (at least one factor each; CPU only); None: one
            batch per (n, p).
        root_device: where a background root round (``root_schedule="async"``, ``max_root_delay``
            >= 1) is solved: ``"host"`` copies a CUDA round's factors to pinned host memory on a
            side stream, solves on the CPU and copies the roots back on a side stream that the
            training stream waits for (Anil et al. 2020 §4: roots on otherwise idle host CPUs;
            :mod:`shampoo.root_transfer`); ``"same"`` solves where the factors live (on CUDA: the
            background thread launches the solver's kernels on its default stream); ``"device"``
            solves on the GPU on a side stream that waits for the training stream's event at
            submission and that the training stream waits for at install; ``"auto"`` is ``"host"``
            for CUDA parameters. CPU parameters solve on the CPU under every value, bitwise as before;
            ``max_root_delay = 0`` and ``root_schedule="sync"`` solve in the step and ignore it.
    """

    fused_adam: bool = True
    apply_from_buckets: bool = True
    trust_factors: bool = True
    round_chunk_bytes: int | None = DEFAULT_ROUND_CHUNK_BYTES
    root_device: str = "auto"

    def __post_init__(self) -> None:
        for name in ("fused_adam", "apply_from_buckets", "trust_factors"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise InvalidShampooArgumentError(name, value, "True or False")
        c = self.round_chunk_bytes
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise InvalidShampooArgumentError(
                "round_chunk_bytes", c, "None (one batch per (n, p)) or an int >= 1 (bytes per batch)"
            )
        if not isinstance(self.root_device, str) or self.root_device not in ROOT_DEVICES:
            raise InvalidShampooArgumentError(
                "root_device", self.root_device,
                f"one of {ROOT_DEVICES} (background rounds of CUDA parameters solved on the host CPU, "
                "where the factors live, on a side stream of the GPU, or 'auto': the host for CUDA)",
            )  # fmt: skip

    def chunk_rows(self, matrix_bytes: int) -> int | None:
        """Factors per batch of a round whose matrices have ``matrix_bytes`` each (None: all)."""
        if self.round_chunk_bytes is None:
            return None
        return max(1, self.round_chunk_bytes // max(matrix_bytes, 1))


DEFAULT_IMPLEMENTATION = ShampooImplementation()


def resolve_implementation(value: ShampooImplementation | None) -> ShampooImplementation:
    """The implementation setting from ``Shampoo(implementation=...)`` (None: the defaults)."""
    if value is None:
        return DEFAULT_IMPLEMENTATION
    if not isinstance(value, ShampooImplementation):
        raise InvalidShampooArgumentError(
            "implementation", value, "a shampoo.ShampooImplementation or None (the default fast paths)"
        )
    return value


__all__ = [
    "DEFAULT_IMPLEMENTATION",
    "DEFAULT_ROUND_CHUNK_BYTES",
    "ROOT_DEVICES",
    "ShampooImplementation",
    "resolve_implementation",
]
