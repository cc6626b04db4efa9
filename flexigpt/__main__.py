"""``python -m flexigpt``: the ``flexigpt`` command without its console script on ``PATH``
(the DAG's shell rules run it so, through the interpreter that runs Snakemake)."""

from flexigpt.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
