"""End-to-end validation of the optimizers on real tasks: ``matroots validate``.

* :mod:`.tasks` -- the tasks (``get_task(name, **size)`` with ``build_model(seed)``, ``batches(seed)``,
  ``loss``, ``evaluate``); :mod:`.corpus` -- the Python standard library's sources as text;
* :mod:`.config` -- the TOML grid (task x optimizer x lr x seed; Shampoo x solver x dtype x eps x
  frequency) and its units;
* :mod:`.training` -- one unit: training, curves, interleaved timing against AdamW, root diagnostics
  and forward errors;
* :mod:`.run` -- runs the units through :mod:`matroots.study.runner` (resumable, process pool or dask) and
  writes the tidy tables; ``--dry-run`` estimates;
* :mod:`.summary` -- steps-to-target, ratios and the root-accuracy-vs-training table;
  :mod:`.report`, :mod:`.figures` -- text tables and figures; :mod:`.cli` -- the command line.
"""

from .tasks import TASKS, Task, get_task

__all__ = ["TASKS", "Task", "get_task"]
