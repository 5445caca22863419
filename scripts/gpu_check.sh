#!/usr/bin/env bash
# GPU checks CPU CI cannot run, in one go on one GPU (< 10 minutes; no network needed):
#   (a) vLLM multi-turn rollout (TRL colocate) vs a forward pass: token ids exact, logprobs close
#   (b) a few training steps under DeepSpeed ZeRO-2, PPO/GAE with its critic under ZeRO-3, and LoRA training with vLLM generation
#       (adapter-only sync: vllm_lora_sync)
#   (c) peak GPU memory, LoRA vs full fine-tuning
# Needs: pip install -e ".[gpu,vllm]". Results: benchmarks/results.json and BENCHMARKS.md (section gpu_check).
#   bash scripts/gpu_check.sh [LOG_DIR]
set -u
cd "$(dirname "$0")/.."
LOGS=${1:-runs/gpu_check}
MODEL=$LOGS/qwen2.5-0.5b-arch-random
mkdir -p "$LOGS"
PY=${PYTHON:-python}
ACC=${ACCELERATE:-accelerate}

step() {  # step NAME TIMEOUT_S COMMAND...: run, keep its output and exit code, never stop the script
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  echo $? > "$LOGS/$name.rc"
  tail -n 3 "$LOGS/$name.log"
  echo "== $name exit $(cat "$LOGS/$name.rc")"
}

COMMON="--model_name_or_path $MODEL --env_id starpo/Sokoban-v0 --num_start_states 4 --num_generations 4 --rollout_filter_ratio 0.5 \
 --per_device_train_batch_size 4 --gradient_accumulation_steps 2 --max_steps 3 --max_turns 3 --max_tokens_per_turn 48 \
 --max_episode_tokens 1024 --num_eval_episodes 16 --eval_before false --report_to none --save_strategy no --disable_tqdm true \
 --bf16 true --collapse_guard off"

step make_model 120 $PY scripts/gpu_check.py make-model "$MODEL"
step vllm_rollout 150 $PY scripts/gpu_check.py vllm-rollout "$MODEL"
step zero2_train 120 $ACC launch --config_file accelerate_configs/zero2.yaml --num_processes 1 train.py $COMMON --output_dir "$LOGS/zero2"
step zero3_gae_train 150 $ACC launch --config_file accelerate_configs/zero3.yaml --num_processes 1 train.py $COMMON --output_dir "$LOGS/zero3_gae" \
  --advantage_estimator gae
step vllm_lora_train 150 $PY train.py $COMMON --output_dir "$LOGS/vllm_lora" --use_peft true --lora_target_modules all-linear \
  --learning_rate 1e-5 --use_vllm true --vllm_mode colocate --vllm_gpu_memory_utilization 0.3 --vllm_max_model_length 2048 \
  --vllm_lora_sync true
step memory 120 $PY scripts/gpu_check.py memory "$MODEL"
$PY scripts/gpu_check.py record "$LOGS"
for f in "$LOGS"/*.rc; do echo "$(basename "$f" .rc): exit $(cat "$f")"; done
