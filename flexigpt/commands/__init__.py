"""Subcommands of the ``flexigpt`` CLI (see flexigpt/cli.py)."""
