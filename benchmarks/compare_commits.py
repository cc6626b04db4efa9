"""Are a refactor's results bit-identical? Compress the same model at two commits, compare.

For each method, runs ``flexigpt compress`` with the code of ``--base`` (a git worktree of
that commit in a temporary folder, on ``PYTHONPATH``) and with the code of this checkout,
same model, calibration text, ratio, seed and one torch thread (LAPACK reductions depend on
the thread count), and compares the saved weights (sha256 of ``model.safetensors``) and the
manifests' ``structure``. Prints one line per method and exits 1 if any differs.

Example (from the repository root, resources fetched)::

    .venv/bin/python -m benchmarks.compare_commits --base 2384b71 --methods flexigpt slicegpt
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from flexigpt.storage.registry import ROLES, methods_in_section

ROOT = Path(__file__).resolve().parent.parent


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def compress(code: Path, method: str, args: argparse.Namespace, out: Path) -> float:
    """``flexigpt compress`` with the package at ``code``; returns wall seconds."""
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-c", "import sys; from flexigpt.cli import main; sys.exit(main())",
           "compress", "--method", method, "--model", str(ROOT / args.model), "--ratio",
           str(args.ratio), "--calibration", str(ROOT / args.calibration), "--n-calibration",
           str(args.n_calibration), "--seq-len", str(args.seq_len), "--out", str(out)]
    where = subprocess.run([sys.executable, "-c", "import flexigpt; print(flexigpt.__file__)"],
                           check=True, env=env, cwd=code, capture_output=True, text=True)
    if not Path(where.stdout.strip()).resolve().is_relative_to(code.resolve()):
        raise RuntimeError(f"flexigpt imports from {where.stdout.strip()}, not from {code}")
    start = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, cwd=code, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the commit to compare this checkout with")
    p.add_argument("--methods", nargs="+", default=[m for m in methods_in_section("methods")
                                                    if m != ROLES.reference],
                   help="default: every method of the config's methods section but the "
                        "uncompressed reference")
    p.add_argument("--model", default="resources/models/smollm2-135m")
    p.add_argument("--calibration", default="resources/text/wiki/train.txt")
    p.add_argument("--ratio", type=float, default=0.3)
    p.add_argument("--n-calibration", type=int, default=128,
                   help="calibration windows (default: the CLI's; the default DAG uses 32)")
    p.add_argument("--seq-len", type=int, default=512, help="calibration window length")
    p.add_argument("--json", help="also write the comparison here (one entry per method)")
    args = p.parse_args()
    differ = 0
    report: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="flexigpt-compare-") as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base),
                        args.base], check=True, capture_output=True)
        try:
            for method in args.methods:
                outs, secs = {}, {}
                for name, code in (("base", base), ("head", ROOT)):
                    outs[name] = Path(tmp) / f"{method}-{name}"
                    secs[name] = compress(code, method, args, outs[name])
                shas = {k: sha256(v / "model.safetensors") for k, v in outs.items()}
                structs = {k: json.loads((v / "manifest.json").read_text())["structure"]
                           for k, v in outs.items()}
                same = shas["base"] == shas["head"] and structs["base"] == structs["head"]
                differ += not same
                keys = sorted(k for k in set(structs["base"]) | set(structs["head"])
                              if structs["base"].get(k, "<absent>")
                              != structs["head"].get(k, "<absent>"))
                print(f"{method} r{args.ratio}: weights "
                      f"{'identical' if shas['base'] == shas['head'] else 'DIFFER'} "
                      f"(sha256 {shas['head'][:16]}), structure "
                      + ("equal" if not keys else "DIFFERS in " + ", ".join(
                          f"{k}: {structs['base'].get(k, '<absent>')!r} -> "
                          f"{structs['head'].get(k, '<absent>')!r}" for k in keys))
                      + f"; {secs['base']:.0f} s at {args.base}, {secs['head']:.0f} s here",
                      flush=True)
                report.append({"method": method, "ratio": args.ratio, "base": args.base,
                               "weights_identical": shas["base"] == shas["head"],
                               "sha256": shas, "structure_differs_in": keys,
                               "seconds": secs, "n_calibration": args.n_calibration,
                               "seq_len": args.seq_len, "model": args.model})
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                           check=False, capture_output=True)
    if args.json:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                              check=True, capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                                     "--untracked-files=no"], check=True,
                                    capture_output=True, text=True).stdout.strip())
        Path(args.json).write_text(json.dumps({"head": head, "head_has_uncommitted_edits":
                                               dirty, "methods": report}, indent=1)
                                   + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
