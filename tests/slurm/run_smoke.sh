#!/usr/bin/env bash
# The smoke DAG through the real SLURM executor (snakemake-executor-plugin-slurm, pinned in
# pyproject.toml's `slurm` extra) on a private single-node cluster (tests/slurm/cluster.sh),
# with the project's SLURM profile; then checks the tables and that `sacct` lists every job
# COMPLETED. Needs root on Debian 12 (installs slurm-wlm, munge, MariaDB). `make test-slurm`;
# .ci/run runs it after the test suite.
#   FLEXIGPT_SLURM_DIR   where the cluster and the run live (default /tmp/flexigpt-slurm)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=${FLEXIGPT_SLURM_DIR:-/tmp/flexigpt-slurm}
trap 'bash "$ROOT/tests/slurm/cluster.sh" down "$D"' EXIT
bash "$ROOT/tests/slurm/cluster.sh" up "$D"
. "$D/env.sh"
# the profile takes account and partitions from the environment
export FLEXIGPT_SLURM_ACCOUNT=ci FLEXIGPT_SLURM_PARTITION=debug FLEXIGPT_SLURM_GPU_PARTITION=debug
RUN=$D/run
# the checkout's resources/ is the cache the jobs fill (and reuse on the next run)
mkdir -p "$ROOT/resources"
rm -rf "$RUN"; mkdir -p "$RUN"; ln -s "$ROOT/resources" "$RUN/resources"
started=$(date +%s)
# tiny jobs on a 2-core node without GPUs: the profile's per-rule GPU/memory requests are
# replaced, everything else (executor, retries, latency, account, partitions) is the profile's.
# 4 jobs queued for 2 CPUs: SLURM starts the next one as a job ends, without waiting for the
# plugin's next status check (which backs off by 10 s while nothing finishes)
small="mem_mb=3000 gpu=0 runtime=30 cpus_per_task=1"
cd "$RUN"
timeout -k 10 2400 snakemake --snakefile "$ROOT/Snakefile" --configfile "$ROOT/config/smoke.yaml" \
  --workflow-profile "$ROOT/workflow/profiles/slurm" --jobs 4 --latency-wait 5 \
  --slurm-init-seconds-before-status-checks 2 \
  --set-resources $(for r in compress train evaluate inference_cost block_influence; do
                      for kv in $small; do printf '%s:%s ' $r $kv; done; done) \
  --set-threads compress=1 train=1 evaluate=1 inference_cost=1 block_influence=1 > "$D/snakemake.log" 2>&1 \
  || { tail -50 "$D/snakemake.log"; exit 1; }
test -s results/tiny-llama/tables/table1_tiny-llama.md
test -s results/tiny-llama/tables/verdicts.md
sacct -X --parsable2 --noheader --format=JobID,JobName,State,Elapsed \
  --starttime "$(date -d @"$started" +%Y-%m-%dT%H:%M:%S)" > "$D/sacct.txt"
cat "$D/sacct.txt"
jobs=$(wc -l < "$D/sacct.txt")
[ "$jobs" -gt 0 ] || { echo "sacct lists no jobs" >&2; exit 1; }
if grep -v '|COMPLETED|' "$D/sacct.txt"; then echo "jobs not COMPLETED (above)" >&2; exit 1; fi
echo "SLURM smoke DAG: $jobs jobs, all COMPLETED, $(( $(date +%s) - started )) s"
