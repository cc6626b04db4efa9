"""flexigpt tables: the paper's tables (Markdown/CSV/LaTeX) and figures from result files."""

from __future__ import annotations

import argparse

HELP = "build the paper's tables and figures from evaluation/timing results"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--results", help="results tree to discover inputs in (JSONs are "
                                     "classified by content; train_log.csv, manifest.json)")
    p.add_argument("--archive", help="a run archive (flexigpt archive): rebuild its tables from "
                                     "the inputs it lists (replaces the other inputs)")
    p.add_argument("--across", nargs="+", metavar="DIR",
                   help="table directories of two or more finished runs of different models "
                        "(each with its verdicts.csv): write the cross-model verdicts and "
                        "replacement tables (replaces the other inputs)")
    p.add_argument("--out", required=True, help="output directory for tables and figures")
    p.add_argument("--result-files", nargs="+", metavar="JSON",
                   help="explicit evaluation result JSONs (replaces discovery)")
    p.add_argument("--timing-files", nargs="+", metavar="JSON",
                   help="explicit inference-timing JSONs (replaces discovery)")
    p.add_argument("--train-logs", nargs="+", metavar="CSV",
                   help="explicit train_log.csv files (replaces discovery)")
    p.add_argument("--manifests", nargs="+", metavar="JSON",
                   help="explicit FlexiGPT manifest.json files (replaces discovery)")
    p.add_argument("--published", help="published-numbers CSV (default: packaged copy)")
    p.add_argument("--formats", default="md,csv,tex", help="comma-separated table formats")
    p.add_argument("--no-plots", action="store_true", help="tables only")


def run(args: argparse.Namespace) -> int:
    from flexigpt.tables import build_all
    from flexigpt.tables.from_archive import rebuild

    formats = tuple(f for f in args.formats.split(",") if f)
    if args.across:
        from flexigpt.tables.across import across_models

        given = [f for f in ("archive", "results", "result_files", "timing_files",
                             "train_logs", "manifests") if getattr(args, f)]
        if given:
            raise ValueError(f"--across reads finished tables; drop --{given[0].replace('_', '-')}")
        written = across_models(args.across, args.out,
                                formats=tuple(f for f in formats if f in ("md", "csv")))
        print(f"wrote {len(written)} files to {args.out}")
        return 0
    if args.archive:
        given = [f for f in ("results", "result_files", "timing_files", "train_logs", "manifests")
                 if getattr(args, f)]
        if given:
            raise ValueError(f"--archive lists its own inputs; drop --{given[0].replace('_', '-')}")
        written = rebuild(args.archive, args.out, formats=formats, make_plots=not args.no_plots)
        print(f"wrote {len(written)} files to {args.out}")
        return 0
    written = build_all(args.results, args.out, results=args.result_files,
                        timings=args.timing_files, train_logs=args.train_logs,
                        manifests=args.manifests, published=args.published,
                        formats=formats,
                        make_plots=not args.no_plots)
    if not [p for p in written if p.name != "index.txt"]:
        raise ValueError(f"no evaluation or timing results found in "
                         f"{args.results or 'the files given'}: nothing to tabulate")
    print(f"wrote {len(written)} files to {args.out}")
    return 0
