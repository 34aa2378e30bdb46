"""A tiny sweep grid shared by the sweep, CLI and notebook tests (4 units, 16 rows)."""

TINY = """
name = "tiny"
families = ["randsvd"]
n = [6]
kappa = [1e2, 1e8]
p = [2]
dtypes = ["fp64", "bf16"]
seeds = [0]
eps = [{ value = 0.0, mode = "absolute" }, { value = 1e-6, mode = "relative" }]
reference_backend = "mpmath"

[[solvers]]
name = "eigh"

[[solvers]]
name = "coupled_newton"
options = { scaling = "frobenius" }
"""

#: Columns that measure time on this machine (differ between otherwise identical runs).
TIMING = [
    "seconds",
    "reference_seconds",
    "gemm_seconds",
    "cpu_seconds",
    "gemm_equivalents",
    "unit_wall_seconds",
    "unit_cpu_seconds",
]


def drop_timing(df):
    """The rows without their timing columns (for row-for-row comparisons of two runs)."""
    return df.drop(columns=[c for c in TIMING if c in df.columns])
