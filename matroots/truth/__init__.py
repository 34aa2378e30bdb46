"""Truth layer (docs/design.md §2): high-precision references (mpmath, python-flint) with error estimates,
and the error metrics and bounds that judge computed roots against them."""
