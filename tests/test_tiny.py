from transformers import AutoModelForCausalLM, AutoTokenizer

from starpo_trl.tiny import save_tiny

TEXTS = [
    "<think>I choose Up.</think><answer>Up || Left</answer>",
    "Numbers: 7, 3, 5, 2\nTarget: 22",
    "unicode ÿ\x00 日本 \u202e",
]


def test_tiny_checkpoint_reloads_with_identical_tokenisation(tmp_path, tiny_tokenizer):
    path = save_tiny(str(tmp_path), hidden_size=32, num_layers=1)
    tok = AutoTokenizer.from_pretrained(path)
    for text in TEXTS:
        assert tok(text).input_ids == tiny_tokenizer(text).input_ids
        assert tok.decode(tok(text).input_ids) == text
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    ]
    assert tok.apply_chat_template(messages) == tiny_tokenizer.apply_chat_template(messages)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == len(tok) and model.generation_config.eos_token_id == tok.eos_token_id
