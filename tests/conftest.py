import os
import pathlib
import sys
import warnings

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import envs  # noqa: E402,F401  (registers the starpo/* env ids the tests play)

warnings.filterwarnings("ignore", category=FutureWarning)

if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n 2`: one thread per worker, or they oversubscribe the cores
    import torch

    torch.set_num_threads(1)


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


def assert_logprobs_match_a_forward_pass(model, ep, temperature: float = 1.0, atol: float = 1e-4):
    """The episode's recorded sampling logprobs equal ``log_softmax(logits / T)`` of one forward pass
    over prompt + completion, on every model token; env tokens carry 0."""
    import torch

    ids = torch.tensor([ep.prompt_ids + ep.completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, :-1].float() / temperature
    logps = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None]).squeeze(1)[len(ep.prompt_ids) - 1 :]
    mask = torch.tensor(ep.env_mask, dtype=torch.bool)
    assert torch.allclose(logps[mask], torch.tensor(ep.logprobs)[mask], atol=atol)
    assert all(lp == 0.0 for lp, m in zip(ep.logprobs, ep.env_mask) if m == 0)


def env_spans(ep) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of env tokens in an episode's completion."""
    spans, start = [], None
    for i, m in enumerate(ep.env_mask + [1]):
        if m == 0 and start is None:
            start = i
        elif m == 1 and start is not None:
            spans.append((start, i))
            start = None
    return spans
