#!/usr/bin/env bash
# The big models' full recipes on one CUDA device, one model at a time (Astra-γ first), each printing its
# training tokens/s and every figure of its summary.json. The full recipes of Scribe-γ (32 h) and Leviathan
# (13 h) are GPU jobs: on this project's 2-core CPU they never finish (docs/sweeps.md, "How long it takes").
#
#   bash benchmarks/gpu_study.sh                       # astra_gamma scribe_gamma leviathan, full recipes
#   bash benchmarks/gpu_study.sh scribe_beta           # any models, in this order
#   STEPS=100 bash benchmarks/gpu_study.sh             # every model cut to 100 steps: its tokens/s, quickly
#   SECONDS_PER_MODEL=600 bash benchmarks/gpu_study.sh # each run stopped after 600 s (its last.ckpt resumes it:
#                                                      #   python train.py model=M resume=RUN)
#
# Extra train.py overrides go in OVERRIDES (e.g. OVERRIDES="logger=wandb"); the default logger is csv so that
# the script needs no W&B. The runs are ordinary run folders under $LOG_DIR/runs/<model>/ (LOG_DIR: outputs).
# ACCELERATOR=cpu runs it without a GPU (the test does, at a tiny step count). Exit status: the number of models
# that did not complete.
set -uo pipefail
cd "$(dirname "$0")/.."
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(astra_gamma scribe_gamma leviathan)
steps_override=()
[[ -n "${STEPS:-}" ]] && steps_override=("trainer.max_steps=$STEPS")
limit=()
accelerator="${ACCELERATOR:-gpu}"
log_dir="${LOG_DIR:-outputs}"
[[ -n "${SECONDS_PER_MODEL:-}" ]] && limit=(timeout --signal=INT "$SECONDS_PER_MODEL")

[[ "$accelerator" != gpu ]] || python - <<'EOF' || exit 1
import torch
if not torch.cuda.is_available():
    raise SystemExit("gpu_study.sh: no CUDA device (torch.cuda.is_available() is False): this script is for a GPU")
props = torch.cuda.get_device_properties(0)
print(f"gpu_study.sh: {props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}", flush=True)
EOF

failed=0
for model in "${models[@]}"; do
    echo "== $model ${STEPS:+(cut to $STEPS steps)}" >&2
    started=$SECONDS
    marker="$(mktemp)"
    "${limit[@]}" python train.py "model=$model" "trainer.accelerator=$accelerator" logger=csv "paths.log_dir=$log_dir" "${steps_override[@]}" \
        ${OVERRIDES:-} || echo "gpu_study.sh: $model exited with status $?" >&2
    # The run this command made: the newest summary.json of the model written after it started.
    summary="$(find "$log_dir/runs/$model" -name summary.json -newer "$marker" 2>/dev/null | sort | tail -1)"
    rm -f "$marker"
    if [[ -z "$summary" ]]; then
        echo "gpu_study.sh: $model wrote no summary.json in $((SECONDS - started)) s" >&2
        failed=$((failed + 1)); continue
    fi
    python - "$summary" "$((SECONDS - started))" <<'EOF' || failed=$((failed + 1))
import json, sys
summary = json.load(open(sys.argv[1]))
print(f"gpu_study.sh: {summary.get('model')} {summary.get('status')} in {sys.argv[2]} s ({sys.argv[1]})")
for key, value in summary.items():
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        print(f"  {key}: {value}")
raise SystemExit(summary.get("status") != "completed")
EOF
done
exit "$failed"
