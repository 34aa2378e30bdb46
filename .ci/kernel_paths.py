"""Show that a second set of CPU kernel settings really changes results bitwise.

    python .ci/kernel_paths.py ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE

Runs one probe in two fresh interpreters, one with the caller's environment and one with the given
settings added, and compares the bits of each result: Shampoo's statistic update (fp32 ``baddbmm`` of
G G^T), batched GEMMs in fp32 and fp64, symmetric eigendecompositions (LAPACK syevd through MKL),
elementwise exp and a row sum (ATen's vectorised kernels), and matroots' eigh and coupled Newton
inverse 4th roots. Prints which differ and exits 1 when none does: a second test pass under settings
that change nothing proves nothing. ``.ci/run`` calls it before its second pass.

The settings act at process start (ATen reads ``ATEN_CPU_CAPABILITY`` when it first dispatches, MKL
reads ``MKL_CBWR`` when it loads), which is why the probe runs in subprocesses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROBE = r"""
import hashlib, json, torch, matroots
def h(t):
    return hashlib.sha1(t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:12]
g = torch.Generator().manual_seed(0)
out = {"cpu capability": torch.backends.cpu.get_cpu_capability()}
G = torch.randn(4, 48, 7, generator=g)
F = torch.zeros(4, 48, 48).baddbmm_(G, G.mT, beta=0.999, alpha=0.001)
out["baddbmm fp32 (Shampoo statistic)"] = h(F)
out["baddbmm fp32 triangles equal"] = str(torch.equal(F, F.mT))
A = torch.randn(3, 33, 33, generator=g, dtype=torch.float64)
S = A @ A.mT + torch.eye(33, dtype=torch.float64)
out["bmm fp64 33x33"] = h(A @ A)
out["mm fp32 33x32 @ 32x33"] = h(A[0, :, :32].float() @ A[1, :32, :].float())
out["eigh fp64 (syevd)"] = h(torch.linalg.eigh(S)[0])
out["eigh fp32 (syevd)"] = h(torch.linalg.eigh(S.float())[0])
out["exp fp32 (ATen vector)"] = h(torch.exp(A.float()))
out["row sum fp32 (ATen vector)"] = h(A.float().sum(-1))
S = S / S.abs().amax()
out["matroots eigh p=4"] = h(matroots.inverse_root(S, 4, method="eigh").root)
out["matroots coupled_newton p=4 fp32"] = h(matroots.inverse_root(S, 4, method="coupled_newton", dtype="fp32").root)
print(json.dumps(out))
"""


def probe(extra: dict[str, str]) -> dict[str, str]:
    env = {**os.environ, **extra}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> int:
    try:
        extra = dict(a.split("=", 1) for a in argv)
    except ValueError:
        print("usage: kernel_paths.py NAME=VALUE ...", file=sys.stderr)
        return 2
    if not extra:
        print("usage: kernel_paths.py NAME=VALUE ...", file=sys.stderr)
        return 2
    base, alt = probe({}), probe(extra)
    label = " ".join(argv)
    print(f"{'result':<36} {'default':<14} {label}")
    changed = []
    for key in base:
        same = base[key] == alt[key]
        if not same and key != "cpu capability":
            changed.append(key)
        print(f"{key:<36} {base[key]:<14} {alt[key]:<14} {'' if same else 'differs'}")
    if not changed:
        print(f"kernel_paths: {label} changes no result bitwise on this CPU; a second pass proves nothing")
        return 1
    print(f"kernel_paths: {label} changes {len(changed)} of {len(base) - 1} results bitwise")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
