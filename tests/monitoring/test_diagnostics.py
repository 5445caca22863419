import pytest

from starpo_trl.monitoring.diagnostics import distinct_n, ngram_jaccard, reasoning_metrics, template_share


def test_distinct_n_by_hand():
    # bigrams: (a b) (b c) | (a b) (b d) -> 3 distinct of 4
    assert distinct_n(["a b c", "a b d"], 2) == 0.75
    assert distinct_n(["a a a a"], 1) == 0.25
    assert distinct_n([], 2) == 0.0 and distinct_n(["one"], 2) == 0.0


def test_template_share_masks_numbers_and_case():
    texts = ["Move up 3 times", "move UP 5 times", "push the box left", "Move up 12 times"]
    assert template_share(texts) == 0.75
    assert template_share(["x", "y"]) == 0.5


def test_similarity_to_previous_step():
    assert ngram_jaccard(["a b c"], ["a b c"]) == 1.0
    # {ab, bc} vs {ab, bd}: 1 shared of 3
    assert ngram_jaccard(["a b c"], ["a b d"]) == pytest.approx(1 / 3)
    assert ngram_jaccard(["a b"], ["c d"]) == 0.0


def test_reasoning_metrics_on_an_echo_trap_batch():
    diverse = reasoning_metrics(
        ["the box is left of the target", "go up then right", None, "hole below so avoid down"]
    )
    echo = reasoning_metrics(["I move Up.", "I move Up.", "I move Up.", "I move Up."], previous=["I move Up."])
    assert diverse["reasoning_rate"] == 0.75 and echo["reasoning_rate"] == 1.0
    assert echo["template_share"] == 1.0 and diverse["template_share"] == pytest.approx(1 / 3)
    assert echo["distinct_2"] < diverse["distinct_2"]
    assert echo["similarity_to_previous_step"] == 1.0 and echo["think_words"] == 3.0
