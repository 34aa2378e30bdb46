"""Core layer (docs/design.md §2): errors, the result object, argument rules and solve options, formats,
input validation, spectral estimates, eps and rank-deficiency policies, condition numbers, the factor-dump
format. Imports nothing above itself."""
