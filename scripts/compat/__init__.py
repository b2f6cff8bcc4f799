"""scripts/check_compat.py's steps, one module per environment it runs in (common.py: what all four share)."""
