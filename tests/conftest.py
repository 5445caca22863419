import pathlib
import sys
import warnings

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore", category=FutureWarning)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from starpo_trl.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    from starpo_trl.tiny import build_tiny_model

    return build_tiny_model(tiny_tokenizer, seed=0)


@pytest.fixture
def fresh_model(tiny_tokenizer):
    """A new tiny model per test (training changes its weights)."""
    from starpo_trl.tiny import build_tiny_model

    return build_tiny_model(tiny_tokenizer, seed=1)


class ScriptedBackend:
    """Replies with fixed texts (one list per call, or one text for every call); logprobs are -1.0."""

    def __init__(self, tokenizer, replies, eos_token_id):
        self.tokenizer, self.replies, self.eos = tokenizer, replies, eos_token_id
        self.calls = []

    def generate(self, sequences, max_new_tokens, temperature):
        self.calls.append(len(sequences))
        out = []
        for i, _ in enumerate(sequences):
            text = self.replies(len(self.calls) - 1, i) if callable(self.replies) else self.replies
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos]
            ids = ids[:max_new_tokens]
            out.append((ids, [-1.0] * len(ids)))
        return out


@pytest.fixture
def scripted(tiny_tokenizer):
    def make(replies):
        return ScriptedBackend(tiny_tokenizer, replies, tiny_tokenizer.eos_token_id)

    return make
