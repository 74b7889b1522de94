"""SemanticSimilarity with the real all-MiniLM-L6-v2, offline (loaded once per session)."""

from __future__ import annotations

import os

import pytest

from mighty.eval import EmbeddingCache, Outcome, SemanticSimilarity, minilm


def said(text: str) -> Outcome:
    return Outcome(results=[{"fn": "run", "ok": True, "value": text}])


@pytest.fixture(scope="session")
def model_cache() -> EmbeddingCache:
    """One cache over the real model for the session (the model itself loads once)."""
    return EmbeddingCache(minilm)


BASE = "Take flight MT 404 at 09:15 from Paris to Oslo; it is snowing in Oslo, pack a coat."


def test_paraphrase_passes_unrelated_fails(model_cache: EmbeddingCache) -> None:
    """A paraphrase is similar above the threshold; an unrelated sentence is far below it."""
    judge = SemanticSimilarity(0.7, cache=model_cache)
    paraphrase = "Fly Paris to Oslo on MT 404, leaving 09:15. Bring a coat: Oslo has snow."
    unrelated = "Bananas are a good source of potassium and fibre."
    close = judge.compare(said(BASE), said(paraphrase))
    far = judge.compare(said(BASE), said(unrelated))
    assert close.ok, close.summary
    assert not far.ok, far.summary
    assert judge.similarity(BASE, unrelated) < 0.3
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # the model never reaches for the network


def test_vectors_are_cached_by_text(model_cache: EmbeddingCache) -> None:
    """A text embedded once is served from the cache; the vector is unit length."""
    hits = model_cache.hits
    (first,) = model_cache.embed(["Oslo is snowy today."])
    (again,) = model_cache.embed(["Oslo is snowy today."])
    assert first == again
    assert model_cache.hits == hits + 1
    assert abs(sum(x * x for x in first) - 1.0) < 1e-4
    assert len(first) == 384
