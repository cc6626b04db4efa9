"""``python -m flexigpt.cli`` (what ``accelerate launch -m flexigpt.cli train ...`` and the
subprocess tests run): the ``flexigpt`` command."""

import sys

if __name__ == "__main__":
    try:
        from flexigpt.cli import main
    except KeyboardInterrupt:  # Ctrl-C while the command's own modules load
        print("flexigpt: interrupted while starting; nothing was written", file=sys.stderr)
        raise SystemExit(130) from None
    raise SystemExit(main())
