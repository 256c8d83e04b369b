#!/usr/bin/env bash
# The routing benchmark on a GPU machine, as one prepared command.
#
#   PYTHON=/path/to/python OUT=/results bash bench_gpu.sh [extra benchgen-router bench options]
#
# Installs nothing and needs no network: $PYTHON (default python3) must already hold a CUDA build
# of torch, transformers, tokenizers, safetensors, numpy and tqdm. The workload is
# ../shared/benchgen-pilot/tasks.v1.jsonl, or the file named by $TASKS (carry it to a machine that
# lacks ../shared); without either, the benchmark generates prompts with the same length
# distribution. The table goes to stdout and, when $OUT is set, to $OUT/bench_gpu.md with every
# number in $OUT/bench_gpu.json. Rows: the default set (reference per query and in batches of 16,
# the package's default path, the bf16 mode); the package packs up to 32,768 positions per batch
# on a GPU (hardware.default_batch_tokens).
set -euo pipefail
cd "$(dirname "$0")"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "bench_gpu.sh: torch sees no CUDA device")'
args=(--device cuda --profile)
if [[ -n "${TASKS:-}" ]]; then
    args+=(--tasks "$TASKS")
fi
if [[ -n "${OUT:-}" ]]; then
    mkdir -p "$OUT"
    args+=(--output "$OUT/bench_gpu.md" --output "$OUT/bench_gpu.json")
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv || true
exec "$PY" -m benchgen_router bench "${args[@]}" "$@"
