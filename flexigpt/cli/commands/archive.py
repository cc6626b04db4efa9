"""flexigpt archive: copy a finished run's table inputs (no weights) so its tables rebuild
anywhere (``flexigpt tables --archive DIR``)."""

from __future__ import annotations

import argparse

HELP = "copy a finished run's table inputs and per-document records (no weights) to --out"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--configfile", nargs="+", default=["config/config.yaml"],
                   help="the config file(s) the run used, later ones laid over earlier ones "
                        "as `flexigpt run` does (default: config/config.yaml)")
    p.add_argument("--workdir", default=".", help="the run's working directory (default: .)")
    p.add_argument("--out", required=True, help="new directory for the archive")
    p.add_argument("--facts-only", action="store_true",
                   help="add the model's facts (embedding parameters, compression basis) to "
                        "the index of the existing archive --out, written before the index "
                        "had them; nothing else changes")
    p.add_argument("--add", action="store_true",
                   help="add to the existing archive --out the runs the config gained after "
                        "it was written (their files from --workdir); archived files are "
                        "never replaced")


def run(args: argparse.Namespace) -> int:

    from flexigpt.cli.commands.run import merged_config
    from flexigpt.workflow.config_check import check_config_files
    from flexigpt.workflow.config_schema import check_schema
    from flexigpt.workflow.dag.table_inputs import add_model_facts, archive_run, extend_archive

    check_config_files(args.configfile)
    config = merged_config(args.configfile)
    check_schema(config, args.configfile)
    if args.facts_only:
        print(f"wrote the model facts into {add_model_facts(config, args.out, args.workdir)}")
        return 0
    if args.add:
        written = extend_archive(config, args.out, workdir=args.workdir)
        print(f"added {len(written) - 1} files to {args.out} (index: {written[-1]})")
        return 0
    written = archive_run(config, args.out, workdir=args.workdir)
    print(f"archived {len(written) - 1} files to {args.out} (index: {written[-1]})")
    return 0
