#!/usr/bin/env bash
# The CUDA-graph checks and the step benchmark on one CUDA device, in one go (docs/performance.md, *CUDA graphs*):
#   1. the CUDA tests (graphed = eager over 50 steps, the fast recurrence and bf16 against their references);
#   2. benchmarks/bench_gpu.py: eager, graphed and cuDNN tokens/s and the profiler's kernel share, big models;
#   3. train.py itself, cuda_graphs=true then false, STEPS steps of MODEL (default astra_gamma, 300): the same
#      losses and the tokens/s Lightning's loop reaches.
# Every part's output also goes to $OUT (where set) or outputs/gpu_check/.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-outputs/gpu_check}"
mkdir -p "$out"
model="${MODEL:-astra_gamma}"
steps="${STEPS:-300}"
python - <<'PY' || exit 1
import torch
if not torch.cuda.is_available():
    raise SystemExit("gpu_check.sh: no CUDA device (torch.cuda.is_available() is False): this script is for a GPU")
print(f"gpu_check.sh: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}", flush=True)
PY
started=$SECONDS
python -m pytest -q -p no:cacheprovider -rs tests/test_cuda_graphs.py tests/test_fast_recurrence.py tests/test_precision.py \
    -k "cuda or graph" 2>&1 | tee "$out/tests.txt" | tail -15
echo "gpu_check.sh: tests in $((SECONDS - started)) s"; started=$SECONDS
timeout "${BENCH_SECONDS:-300}" python benchmarks/bench_gpu.py ${BENCH_ARGS:-} 2>&1 | grep -v "^USDT" | tee "$out/bench.txt"
echo "gpu_check.sh: benchmark in $((SECONDS - started)) s"
for graphs in true false; do
    started=$SECONDS
    python train.py "model=$model" "trainer.max_steps=$steps" "cuda_graphs=$graphs" logger=csv "paths.log_dir=$out/runs" \
        evaluation.budget=0.01 evaluation.text.samples=0 trainer.enable_progress_bar=false 2>&1 \
        | grep -E "cuda_graphs|val bpc|Error|error" | tee -a "$out/train.txt"
    echo "gpu_check.sh: train.py cuda_graphs=$graphs in $((SECONDS - started)) s" | tee -a "$out/train.txt"
done
