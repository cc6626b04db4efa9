#!/usr/bin/env bash
# The prepared GPU check: CPU vs CUDA on the tiny models, as pytest's `gpu` tests
# (tests/test_gpu.py: compress with every registered method — same selection, near-equal
# weights and logits —, a short FlexiGPT recovery, evaluation (perplexity + zero-shot tasks)
# and greedy / self-speculative decoding, each within the bounds stated there).
#
# Usage (repository root, environment with the project installed; the tests build their own
# tiny resources in a temporary directory, nothing needs fetching):
#   bash benchmarks/gpu_check.sh [extra pytest arguments]
# Prints the device, then exits with pytest's status; refuses to run without a CUDA device
# (the tests would only be skipped).
set -euo pipefail
PY=${PYTHON:-python}
$PY - <<'PYEOF'
import torch

print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"cuda available: {torch.cuda.is_available()}")
if not torch.cuda.is_available():
    raise SystemExit("gpu_check: no CUDA device visible; nothing to check")
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"cuda:{i}: {p.name}, {p.total_memory / 2**30:.0f} GiB, "
          f"compute capability {p.major}.{p.minor}")
PYEOF
exec "$PY" -m pytest -m gpu -q -rs "$@"
