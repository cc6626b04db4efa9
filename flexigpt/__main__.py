"""``python -m flexigpt``: the ``flexigpt`` command without its console script on ``PATH``
(the DAG's shell rules run it so, through the interpreter that runs Snakemake)."""

import sys

if __name__ == "__main__":
    try:
        from flexigpt.cli import main
    except KeyboardInterrupt:  # Ctrl-C while the command's own modules load
        print("flexigpt: interrupted while starting; nothing was written", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(main())
