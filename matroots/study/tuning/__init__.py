"""Tuned solver selection: ``matroots tune`` sweeps, selection tables and their lookup."""
