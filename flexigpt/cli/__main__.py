"""``python -m flexigpt.cli`` (what ``accelerate launch -m flexigpt.cli train ...`` and the
subprocess tests run): the ``flexigpt`` command."""

from flexigpt.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
