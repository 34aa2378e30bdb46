"""Study layer (docs/design.md §2): test-matrix families, grids, the resumable unit runner, sweeps,
selection tables (``tuning``), reports and figures, end-to-end validation (``validation``)."""
