#!/usr/bin/env bash
# The big models' full recipes side by side on one CUDA device (Astra-γ, Scribe-γ, Leviathan by default), each
# an ordinary train.py run with early stopping (early_stopping.patience=$PATIENCE, default 2 validations) and its
# training step replayed from a CUDA graph (cuda_graphs=true, the default); then each one's training tokens/s
# and every figure of its summary.json. On the project's 2-core CPU these recipes never finish
# (docs/sweeps.md, "How long it takes"); on one H100 the three take minutes (docs/performance.md).
#
#   bash benchmarks/gpu_study.sh                       # astra_gamma scribe_gamma leviathan, side by side
#   bash benchmarks/gpu_study.sh scribe_beta           # any models
#   STEPS=100 bash benchmarks/gpu_study.sh             # every model cut to 100 steps: its tokens/s, quickly
#   PATIENCE=null bash benchmarks/gpu_study.sh         # no early stopping: the whole recipes
#   SECONDS_PER_MODEL=600 bash benchmarks/gpu_study.sh # each run stopped after 600 s (its last.ckpt resumes it:
#                                                      #   python train.py model=M resume=RUN)
#   OVERRIDES="+trainer.max_time=00:00:05:00" bash benchmarks/gpu_study.sh  # training stopped after 5 min on
#                                                      #   the recipe's own schedule, then evaluated as usual
#
# Extra train.py overrides go in OVERRIDES (e.g. OVERRIDES="logger=wandb"); the default logger is csv so that
# the script needs no W&B. The runs are ordinary run folders under $LOG_DIR/runs/<model>/ (LOG_DIR: outputs);
# each run's console goes to $LOG_DIR/gpu_study_<model>.log. ACCELERATOR=cpu runs it without a GPU (the test
# does, at a tiny step count). Exit status: the number of models that did not complete.
set -uo pipefail
cd "$(dirname "$0")/.."
models=("$@")
[[ ${#models[@]} -gt 0 ]] || models=(astra_gamma scribe_gamma leviathan)
steps_override=()
[[ -n "${STEPS:-}" ]] && steps_override=("trainer.max_steps=$STEPS")
limit=()
accelerator="${ACCELERATOR:-gpu}"
log_dir="${LOG_DIR:-outputs}"
patience="${PATIENCE:-2}"
[[ -n "${SECONDS_PER_MODEL:-}" ]] && limit=(timeout --signal=INT "$SECONDS_PER_MODEL")
mkdir -p "$log_dir"

[[ "$accelerator" != gpu ]] || python - <<'PY' || exit 1
import torch
if not torch.cuda.is_available():
    raise SystemExit("gpu_study.sh: no CUDA device (torch.cuda.is_available() is False): this script is for a GPU")
props = torch.cuda.get_device_properties(0)
print(f"gpu_study.sh: {props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}", flush=True)
PY

started=$SECONDS
marker="$(mktemp)"
pids=()
for model in "${models[@]}"; do
    echo "== $model ${STEPS:+(cut to $STEPS steps)} side by side: $log_dir/gpu_study_$model.log" >&2
    "${limit[@]}" python train.py "model=$model" "trainer.accelerator=$accelerator" logger=csv "paths.log_dir=$log_dir" \
        "early_stopping.patience=$patience" trainer.enable_progress_bar=false "${steps_override[@]}" ${OVERRIDES:-} \
        >"$log_dir/gpu_study_$model.log" 2>&1 &
    pids+=($!)
done

failed=0
for i in "${!models[@]}"; do
    model="${models[$i]}"
    wait "${pids[$i]}" || echo "gpu_study.sh: $model exited with status $?" >&2
    # The run this command made: the newest summary.json of the model written after it started.
    summary="$(find "$log_dir/runs/$model" -name summary.json -newer "$marker" 2>/dev/null | sort | tail -1)"
    if [[ -z "$summary" ]]; then
        echo "gpu_study.sh: $model wrote no summary.json in $((SECONDS - started)) s; its last lines:" >&2
        tail -5 "$log_dir/gpu_study_$model.log" >&2
        failed=$((failed + 1)); continue
    fi
    python - "$summary" "$((SECONDS - started))" <<'PY' || failed=$((failed + 1))
import json, sys
summary = json.load(open(sys.argv[1]))
print(f"gpu_study.sh: {summary.get('model')} {summary.get('status')} by {sys.argv[2]} s ({sys.argv[1]})")
for key, value in summary.items():
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        print(f"  {key}: {value}")
raise SystemExit(summary.get("status") != "completed")
PY
done
rm -f "$marker"
exit "$failed"
