#!/usr/bin/env bash
# The prepared GPU check (at most ~8 minutes on one GPU): does every heavy step run on the
# accelerator, and does it give the CPU's numbers?
#
#   1. the smoke DAG (tiny random Llama, every method, tables) with `device: cuda`;
#   2. SmolLM2-135M FlexiGPT at ratio 0.3: compress, a short recovery (16 steps) and an
#      evaluation at a small limit, once with --device cuda and once with --device cpu,
#      then the two compared (same compression; one-shot perplexity within 0.5 %; recovered
#      perplexity within 5 % and task accuracy within 8 points: bf16 kernels and reduction
#      orders differ between the devices) with each device's throughputs printed.
#
# Usage (repository root, environment with the project installed, resources fetched:
# `flexigpt fetch all`):   bash benchmarks/gpu_check.sh [OUT_DIR]
# DEVICE=cpu runs every step on the CPU (a dry run of this script on a machine without GPU).
# Writes OUT_DIR/gpu_check.json (figures) and OUT_DIR/gpu_check.log; exits non-zero when a
# step fails or a comparison is outside its tolerance.
set -euo pipefail
OUT=${1:-results/gpu_check}
DEVICE=${DEVICE:-cuda}
PY=${PYTHON:-python}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
echo "gpu_check: device $DEVICE, out $OUT, $(date -u +%FT%TZ)"
$PY - "$DEVICE" <<'EOF'
import sys, torch
from flexigpt.devices import resolve_device
device = resolve_device(sys.argv[1])
print(f"torch {torch.__version__}, device {device}"
      + (f" ({torch.cuda.get_device_name(device)})" if device.startswith("cuda") else ""))
EOF

# 1. smoke DAG on the device (its own results folder, fresh)
t0=$(date +%s)
rm -rf results/tiny-llama
$PY -m snakemake --cores all --configfile config/smoke.yaml --rerun-incomplete --quiet rules \
  --config device="$DEVICE" "jobs={threads: 4, gpu: 1}" --resources gpu=1
smoke_s=$(( $(date +%s) - t0 ))
grep -h '"device"' results/tiny-llama/*/*/*/compressed/manifest.json | sort | uniq -c
echo "smoke DAG: ${smoke_s} s"

# 2. SmolLM2 FlexiGPT on the device and on the CPU
MODEL=resources/models/smollm2-135m
TEXT=resources/text/wiki
for dev in "$DEVICE" cpu; do
  W="$OUT/$dev"
  [ "$dev" = cpu ] && [ "$DEVICE" = cpu ] && W="$OUT/cpu_ref"
  rm -rf "$W"; mkdir -p "$W"
  flexigpt compress --method flexigpt --model $MODEL --out "$W/compressed" --ratio 0.3 \
    --policy matched --calibration $TEXT/train.txt --n-calibration 32 --seq-len 512 \
    --device "$dev"
  flexigpt evaluate --model "$W/compressed" --out "$W/eval_start.json" --tasks "" \
    --ppl-text $TEXT/validation.test.txt --ppl-seq-len 512 --ppl-windows 16 --device "$dev"
  flexigpt train --model "$W/compressed" --out "$W/trained" --tokens 32768 \
    --text $TEXT/train.txt --validation $TEXT/validation.tune.txt --seq-len 256 \
    --micro-batch 8 --global-batch 8 --lr 4e-3 --gamma-lr 5e-2 --eval-windows 16 \
    --checkpoint-every 0 --device "$dev"
  flexigpt evaluate --model "$W/trained" --out "$W/eval_final.json" --limit 50 \
    --ppl-text $TEXT/validation.test.txt --ppl-seq-len 512 --ppl-windows 16 --bf16 \
    --device "$dev"
done

$PY - "$OUT" "$DEVICE" "$smoke_s" <<'EOF'
import json, sys
from pathlib import Path
out, device, smoke_s = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
dev_dir, cpu_dir = out / device, out / ("cpu_ref" if device == "cpu" else "cpu")
def figures(d):
    m = json.loads((d / "compressed" / "manifest.json").read_text())
    h = json.loads((d / "trained" / "manifest.json").read_text())["history"][-1]
    s, f = (json.loads((d / f"eval_{x}.json").read_text()) for x in ("start", "final"))
    return {"device": [m["device"], h["device"], s["device"], f["device"]],
            "pruned": m["info"]["pruned_blocks"], "compress_s": m["compress_seconds"],
            "train_tok_s": h["tokens_per_second"], "start_ppl": s["perplexity"]["value"],
            "final_ppl": f["perplexity"]["value"],
            "tasks": {t: e["value"] for t, e in f["tasks"].items()},
            "task_s": round(sum(e["seconds"] for e in f["tasks"].values()), 2)}
a, b = figures(dev_dir), figures(cpu_dir)
checks = {
    "ran_on_device": all(x.startswith(device) for x in a["device"]),
    "same_pruned_blocks": a["pruned"] == b["pruned"],
    "start_ppl_within_0.5%": abs(a["start_ppl"] / b["start_ppl"] - 1) <= 0.005,
    "final_ppl_within_5%": abs(a["final_ppl"] / b["final_ppl"] - 1) <= 0.05,
    "tasks_within_8_points": all(abs(a["tasks"][t] - b["tasks"][t]) <= 0.08 for t in a["tasks"]),
}
report = {"device": device, "smoke_dag_s": smoke_s, device: a, "cpu": b, "checks": checks}
(out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
for name, row in ((device, a), ("cpu", b)):
    print(f"{name:>6}: compress {row['compress_s']:.1f} s, train {row['train_tok_s']:.0f} tok/s, "
          f"tasks {row['task_s']:.1f} s; start PPL {row['start_ppl']:.3f}, final PPL "
          f"{row['final_ppl']:.3f}, tasks {row['tasks']}")
for name, ok in checks.items():
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
sys.exit(0 if all(checks.values()) else 1)
EOF
