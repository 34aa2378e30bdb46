"""End-to-end validation of the optimizers on real tasks: ``matroots validate``.

* :mod:`.tasks` -- the tasks (``get_task(name, **size)``), :mod:`.corpus` -- the stdlib text.
"""

from .tasks import TASKS, Task, get_task

__all__ = ["TASKS", "Task", "get_task"]
