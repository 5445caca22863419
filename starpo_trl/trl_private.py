"""TRL's ``GRPOTrainer`` (and transformers' ``Trainer``) internals that ``MultiTurnStarPOTrainer``
relies on, named in one place. They are not public API: ``tests/test_trl_private.py`` fails,
naming the missing one, when a TRL or transformers release renames or drops any of them, and
checks that the trainer uses no other private name of its parents.
"""

# hooks the trainer overrides: renamed upstream, they would silently stop being called
OVERRIDDEN_METHODS = ("_generate_and_score_completions", "_save_checkpoint", "_load_optimizer_and_scheduler")
# parent methods the trainer calls
CALLED_METHODS = ("_get_per_token_logps_and_entropies", "_get_output_dir")
# attributes GRPOTrainer sets in __init__ and the trainer reads (private first, then TRL's own settings)
ATTRIBUTES = (
    "_metrics",
    "_logs",
    "_tokenizer",
    "use_vllm",
    "scale_rewards",
    "num_generations",
    "eos_token_ids",
    "temperature",
    "beta",
    "ref_model",
    "num_iterations",
)
# set only with use_vllm=True
VLLM_ATTRIBUTES = (
    "_last_loaded_step",
    "vllm_generation",
    "vllm_importance_sampling_correction",
    "vllm_importance_sampling_mode",
    "vllm_importance_sampling_clip_min",
    "vllm_importance_sampling_clip_max",
)
# TRL's VLLMGeneration internals the CPU weight sync uses (starpo_trl.rollout.vllm_backend.sync_weights)
VLLM_GENERATION_NAMES = ("_iter_named_params", "mode", "llm")
