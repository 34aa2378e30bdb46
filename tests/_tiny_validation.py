"""Tiny validation grids shared by the validation tests and the notebook test."""

import json

import pandas as pd

#: Sizes that make every task build and step in well under a second.
TINY_SIZES = {
    "digits": "{ hidden = 16, batch_size = 32 }",
    "lsq": "{ batch_size = 64 }",
    "bytes_lm": "{ d_model = 16, heads = 2, ff = 32, layers = 1, seq = 16, batch_size = 4, val_windows = 4, "
    "max_train_bytes = 200000, max_val_bytes = 50000 }",
    "w1": "{ seq = 16, batch_size = 2, val_windows = 2, max_train_bytes = 200000, max_val_bytes = 50000 }",
}


def tiny_config(
    tasks: list[str],
    *,
    steps: int = 2,
    eval_every: int = 1,
    seeds: str = "[0]",
    freq: int = 1,
    name: str = "tiny",
) -> str:
    """AdamW + Shampoo (eigh, eps 1e-2 relative: every factor's kappa <= 100, root every ``freq`` steps)
    on ``tasks``, a one-chunk timing."""
    lines = [f'name = "{name}"', f"seeds = {seeds}", "[timing]", "rounds = 1", "chunk_steps = 2"]
    for t in tasks:
        lines += [f"[tasks.{t}]", f"steps = {steps}", f"eval_every = {eval_every}", f"size = {TINY_SIZES[t]}"]
    lines += [
        "[[optimizers]]",
        'name = "adamw"',
        "lr = [3e-3, 1e-2]",
        "[[optimizers]]",
        'name = "shampoo"',
        "lr = [3e-3, 1e-2]",
        'root_solver = ["eigh"]',
        f"precondition_frequency = [{freq}]",
        'eps = [{ value = 1e-2, mode = "relative" }]',
    ]
    return "\n".join(lines) + "\n"


#: The notebook's default small grid: digits and lsq, three optimizers, two solvers, one degraded dtype.
NOTEBOOK = """
name = "nb_tiny"
seeds = [0, 1]
[timing]
rounds = 1
chunk_steps = 5
[tasks.digits]
steps = 30
eval_every = 5
size = { hidden = 16 }
[tasks.lsq]
steps = 30
eval_every = 5
[[optimizers]]
name = "adamw"
lr = [3e-3, 1e-2]
[[optimizers]]
name = "sgd"
lr = [1e-1]
[[optimizers]]
name = "shampoo"
lr = [3e-3, 1e-2]
precondition_frequency = [5]
[[optimizers]]
name = "shampoo"
lr = [1e-2]
root_solver = ["coupled_newton"]
precondition_frequency = [5]
[[optimizers]]
name = "shampoo"
label = "lowprec"
lr = [1e-2]
root_dtype = ["fp16"]
eps = [{ value = 1e-6, mode = "relative" }]
precondition_frequency = [5]
options = { fallback = "none" }
"""


def tiny_protocol(
    *, trials: int = 2, steps: int = 20, eval_every: int = 5, name: str = "ptiny", tasks: tuple[str, ...] = ()
) -> str:
    """A protocol grid on tiny digits: AdamW, Shampoo (eigh), SOAP as published (untuned), and an
    absent-or-present peer; ``trials`` trials each at tuning seed 0, final seeds 1 and 2. ``tasks``:
    more tiny tasks after digits, with the same steps."""
    more = "".join(
        f"[tasks.{t}]\nsteps = {steps}\neval_every = {eval_every}\nsize = {TINY_SIZES[t]}\n" for t in tasks
    )
    return f"""
name = "{name}"
[timing]
rounds = 1
chunk_steps = 2
[protocol]
trials = {trials}
tuning_seeds = [0]
final_seeds = [1, 2]
[tasks.digits]
steps = {steps}
eval_every = {eval_every}
size = {TINY_SIZES["digits"]}
{more}[[optimizers]]
name = "adamw"
[[optimizers]]
name = "shampoo"
label = "shampoo-eigh"
root_solver = "eigh"
eps = {{ value = 1e-2, mode = "relative" }}
space = {{ precondition_frequency = [5] }}
[[optimizers]]
name = "soap"
label = "soap-published"
tune = false
fixed = {{ lr = 1e-2, beta2 = 0.95, weight_decay = 0.0, warmup_fraction = 0.0, precondition_frequency = 5 }}
options = {{ betas = [0.95, 0.95] }}
[[optimizers]]
name = "peer"
peer = "heavyball_soap"
"""


def synthetic_protocol_tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two tuning trials of one optimizer whose validation and held-out rankings disagree: trial 0 is
    best on the validation split, trial 1 on the held-out split; and final rows whose validation and
    held-out losses differ."""
    rows, curves = [], []
    for cfg, opt in (("adamw", "adamw"), ("shampoo", "shampoo")):
        for trial, (val, test) in enumerate(((1.0, 3.0), (2.0, 0.5))):
            rows.append({"task": "t", "config": cfg, "optimizer": opt, "phase": "tune", "trial": trial, "seed": 0,
                         "hparams": json.dumps({"lr": 10.0**-trial}), "failure": "", "failure_message": "",
                         "final_val_loss": val, "final_test_loss": test, "metric_name": "m"})  # fmt: skip
        for seed, (val, test) in zip((1, 2, 3), ((0.9, 1.5), (1.1, 1.6), (1.0, 1.7)), strict=True):
            scale = 1.0 if opt == "adamw" else 0.5
            rows.append({"task": "t", "config": cfg, "optimizer": opt, "phase": "final", "trial": 0, "seed": seed,
                         "hparams": json.dumps({"lr": 1.0}), "failure": "", "failure_message": "",
                         "final_val_loss": val, "final_test_loss": test, "final_test_metric": 0.0,
                         "metric_name": "m"})  # fmt: skip
            for step in range(0, 11):
                # held-out loss falls linearly to `test` at step 10 for AdamW; Shampoo twice as fast
                loss = test + (5.0 - test) * max(1.0 - step / (10 * scale), 0.0)
                curves.append({"task": "t", "config": cfg, "optimizer": opt, "phase": "final", "seed": seed,
                               "step": step, "test_loss": loss, "val_loss": 100.0, "cpu_s": step * (2.0 if opt ==
                               "shampoo" else 1.0)})  # fmt: skip
    return pd.DataFrame(rows), pd.DataFrame(curves)
