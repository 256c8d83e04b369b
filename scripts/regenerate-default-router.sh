#!/usr/bin/env bash
# Retrain the committed default router (the repository root is its Hub folder), export it here with
# the card note kept from README.md, and re-record the picks tests/test_root_router.py checks.
# Run from the project root, on purpose only (a new head, backbone package or embedding code), then
# review the figures in the card. About 6 minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
pilot=../shared/benchgen-pilot
run=$(mktemp -d)
trap 'rm -rf "$run"' EXIT
sed -n '/^## About this default router/,/^<!-- end of router card -->/p' README.md | sed '$d' > "$run/card-note.md"
benchgen-router train --rewards "$pilot/rewards.jsonl" --tasks "$pilot/tasks.v1.jsonl" \
    --rewards-id benchgen/router-pilot --backbone sentence-transformers/all-MiniLM-L6-v2 \
    --model-id benchgen-router-lite-demo-minilm \
    --calls "$pilot/rewards.v1-pilot.jsonl" --pool "$pilot/agents.json" \
    --generations 20 --ensemble-seeds 42,43,44,45,46 \
    --operating-point quality=0 --operating-point balanced=0.2 --operating-point economy=1.5 \
    --operating-point fast=0:0.01 --default-operating-point balanced \
    --output-dir "$run/out" --export . --card-note "@$run/card-note.md"
python tests/test_root_router.py --record
