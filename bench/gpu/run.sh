#!/usr/bin/env bash
# The GPU path, proved on one GPU in a few minutes: GRPO steps on a Qwen3-0.6B-sized model built from a config, LoRA on
# and off (bench/gpu/grpo_gpu.py). The GPU machine has Python, torch, transformers and peft but no TRL: TRL and the
# project are installed from the wheels in bench/gpu/wheels (made here by bench/gpu/wheels.sh; nothing is downloaded
# there). `--dry-run`: the same script on this machine's CPU with a tiny model, as CI runs it (no install).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [[ "${1:-}" == "--dry-run" ]]; then
    exec "$PYTHON" bench/gpu/grpo_gpu.py --dry-run "${@:2}"
fi
if ! "$PYTHON" -c "import trl" 2>/dev/null; then
    [[ -d bench/gpu/wheels ]] || { echo "bench/gpu/wheels is missing: run bench/gpu/wheels.sh where pip reaches PyPI" >&2; exit 2; }
    "$PYTHON" -m pip install --quiet --no-index --find-links bench/gpu/wheels -r bench/gpu/requirements.txt
    "$PYTHON" -m pip install --quiet --no-index --no-deps --find-links bench/gpu/wheels tracemill
fi
"$PYTHON" -c "import torch; assert torch.cuda.is_available(), 'no GPU'; print(torch.cuda.get_device_name())"
exec "$PYTHON" bench/gpu/grpo_gpu.py --out bench/gpu/result.json "$@"
