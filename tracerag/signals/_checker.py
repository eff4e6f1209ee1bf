"""A support backend run by a grounding-checker model: MiniCheck, Vectara HHEM, NLI cross-encoders.

``CheckerSupport`` scores a claim against a material with a small model trained to tell whether
a document supports a claim, run locally:

* Hugging Face sequence-classification checkers: MiniCheck RoBERTa-Large and DeBERTa-v3-Large
  (``profile="minicheck"``: the chunk and the claim joined by the tokenizer's end-of-sequence
  token, label 1 is "supported"), DeBERTa NLI cross-encoders (``"nli"``: the chunk as premise
  and the claim as hypothesis; the support probability is the ``entailment`` label's), Vectara
  HHEM-2.1-open (``"hhem"``: its own ``predict``, which needs ``trust_remote_code=True``);
* the seq2seq checker MiniCheck-Flan-T5-Large (``"minicheck-t5"``: ``"predict: "``, the chunk,
  the end-of-sequence token and the claim go to the encoder; the support probability is the
  softmax of the first decoder step's logits over the "unsupported" and "supported" tokens,
  ids 3 and 209).

``model`` is a Hugging Face model id or a local directory. Two runtimes: ONNX Runtime for a
directory exported to ONNX (``model.onnx``, or ``encoder_model.onnx`` and ``decoder_model.onnx``
for seq2seq, with ``tokenizer.json`` and ``config.json``: the layout ``optimum-cli export onnx``
writes), needing the ``checker`` extra (onnxruntime, tokenizers, numpy); and ``transformers``
with PyTorch for anything ``from_pretrained`` loads (the ``checker-torch`` extra). Nothing is
downloaded unless a model id is given and ``transformers`` fetches it.

The MiniCheck way: the material is split at sentence ends into chunks that fit the model with
the claim (``chunk_tokens``, 400 tokens for MiniCheck by default), every chunk is scored, and
the best chunk wins. A claim of several sentences is checked sentence by sentence; the weakest
decides. Pairs are scored in batches (``batch_size``). The supporting sentence is the sentence
of the winning chunk that shares most of the claim's weighted words (the lexical backend's
alignment, restricted to that chunk). The lexical hard checks still apply: an amount, date,
duration or number of the claim that the material does not state, a negation the aligned
sentence does not share, or a name the material never mentions caps the score below the
threshold, whatever the model says.

Calls from async code run in a worker thread (``acheck``); verdicts are cached per (claim,
material) and chunk scores per (claim sentence, chunk). Each model batch is reported to the
enclosing ``usage_scope`` (calls and input tokens).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from tracerag.errors import ConfigurationError
from tracerag.signals._lexical import LexicalParams, _material_view, analyse
from tracerag.signals._support import (
    LruCache,
    Support,
    SyncSupportBackend,
    check_inputs,
    record_usage,
    register_backend,
)
from tracerag.text._sentences import Sentence, split_sentences

__all__ = [
    "DEFAULT_THRESHOLD",
    "CheckerSupport",
    "Profile",
    "Runtime",
    "checker_runtimes",
]

#: Support probability at or above which a claim counts as supported (MiniCheck's own cut).
DEFAULT_THRESHOLD = 0.5

Profile = Literal["auto", "minicheck", "minicheck-t5", "nli", "hhem"]
Runtime = Literal["auto", "onnx", "transformers"]

#: Chunk size (tokens of material per chunk) each profile was trained or published with.
_CHUNK_TOKENS = {"minicheck": 400, "minicheck-t5": 500, "nli": 400, "hhem": 400}
#: MiniCheck-Flan-T5's "unsupported" and "supported" token ids in the T5 vocabulary.
MINICHECK_T5_LABEL_IDS = (3, 209)
_HHEM_TEMPLATE = (
    "<pad> Determine if the hypothesis is true given the premise?\n\n"
    "Premise: {premise}\n\nHypothesis: {hypothesis}"
)
# the units an over-long sentence is cut into: a word with its trailing space, or one character
# of a script written without spaces
_UNIT_RE = re.compile(
    r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]|[^\s\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]+\s*|\s+"
)
_SUPPORT_LABELS = ("entailment", "entail", "supported", "support", "consistent", "yes")
_CHECKER_HINT = 'pip install ".[checker]" (ONNX Runtime), from the tracerag source tree'
_TORCH_HINT = (
    'pip install ".[checker-torch]" (transformers and PyTorch), from the tracerag source tree'
)


def checker_runtimes() -> list[str]:
    """The runtimes whose packages are installed here (``"onnx"``, ``"transformers"``)."""
    out = []
    if all(importlib.util.find_spec(m) for m in ("onnxruntime", "tokenizers", "numpy")):
        out.append("onnx")
    if all(importlib.util.find_spec(m) for m in ("transformers", "torch")):
        out.append("transformers")
    return out


class _Model(Protocol):
    """A loaded checker: token counts and support probabilities of model inputs."""

    max_length: int
    eos_token: str

    def count(self, texts: Sequence[str]) -> list[int]: ...

    def probabilities(self, inputs: Sequence[str | tuple[str, str]]) -> tuple[list[float], int]:
        """The support probability of each input, and the input tokens spent."""
        ...


# ----------------------------------------------------------------------------------------------
# Loading


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"checker model file {path} is not valid JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _support_index(config: dict[str, Any], n_labels: int, profile: str) -> int:
    """Which output label means "supported"."""
    labels = {int(k): str(v).lower() for k, v in (config.get("id2label") or {}).items()}
    for wanted in _SUPPORT_LABELS:
        for index, label in labels.items():
            if label == wanted or label.startswith(wanted):
                return index
    if profile == "nli" and n_labels == 3:
        raise ConfigurationError(
            "NLI checker: config.json names no entailment label (id2label); pass support_label="
        )
    return 1 if n_labels >= 2 else 0


def _guess_profile(config: dict[str, Any]) -> str:
    archs = " ".join(config.get("architectures") or []).lower()
    labels = " ".join(str(v).lower() for v in (config.get("id2label") or {}).values())
    if "hhem" in archs or "hhem" in str(config.get("model_type", "")).lower():
        return "hhem"
    if "conditionalgeneration" in archs or config.get("is_encoder_decoder"):
        return "minicheck-t5"
    if "entail" in labels:
        return "nli"
    return "minicheck"


def _max_length(config: dict[str, Any], tokenizer_config: dict[str, Any], default: int) -> int:
    """The longest input the model takes: the tokenizer's ``model_max_length``, else its
    position embeddings (RoBERTa keeps two of them for its padding offset)."""
    limit = tokenizer_config.get("model_max_length")
    if isinstance(limit, int) and 8 <= limit <= 1_000_000:
        return limit
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions >= 8:
        return positions - 2 if config.get("model_type") == "roberta" else positions
    return default


def _eos_token(tokenizer_config: dict[str, Any], special: dict[str, Any]) -> str:
    for source in (tokenizer_config, special):
        token = source.get("eos_token") or source.get("sep_token")
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str) and token:
            return token
    return "</s>"


def _softmax_at(logits: Any, index: int) -> list[float]:
    import numpy as np

    z = np.asarray(logits, dtype=np.float64)
    if z.ndim == 1:
        z = z[:, None]
    if z.shape[1] == 1:
        return [float(v) for v in 1.0 / (1.0 + np.exp(-z[:, 0]))]
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return [float(v) for v in (e[:, index] / e.sum(axis=1))]


class _OnnxModel:
    """A checker exported to ONNX, run by ONNX Runtime with a ``tokenizers`` tokenizer."""

    def __init__(
        self,
        folder: Path,
        profile: str,
        support_label: int | None,
        label_ids: tuple[int, int],
        max_length: int | None,
        threads: int | None,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ConfigurationError(f"checker model {folder} has no tokenizer.json")
        self.config = _read_json(folder / "config.json")
        tokenizer_config = _read_json(folder / "tokenizer_config.json")
        special = _read_json(folder / "special_tokens_map.json")
        self.profile = profile if profile != "auto" else _guess_profile(self.config)
        if self.profile == "hhem":
            raise ConfigurationError(
                "HHEM runs through its own code: use runtime='transformers' with "
                "trust_remote_code=True"
            )
        self.max_length = max_length or _max_length(self.config, tokenizer_config, 512)
        self.eos_token = _eos_token(tokenizer_config, special)
        options = ort.SessionOptions()
        if threads:
            options.intra_op_num_threads = threads
        providers = ["CPUExecutionProvider"]

        def session(name: str) -> Any:
            return ort.InferenceSession(str(folder / name), options, providers=providers)

        if self.profile == "minicheck-t5":
            for name in ("encoder_model.onnx", "decoder_model.onnx"):
                if not (folder / name).is_file():
                    raise ConfigurationError(
                        f"seq2seq checker {folder} has no {name} (export it with optimum-cli "
                        "export onnx --no-post-process, which keeps the decoder unmerged)"
                    )
            self._encoder, self._decoder = (
                session("encoder_model.onnx"),
                session("decoder_model.onnx"),
            )
            self._session = None
        else:
            if not (folder / "model.onnx").is_file():
                raise ConfigurationError(f"checker model {folder} has no model.onnx")
            self._session = session("model.onnx")
        self.label_ids = label_ids
        self.decoder_start = int(self.config.get("decoder_start_token_id") or 0)
        self.support_label = support_label
        self._tokenizer = Tokenizer.from_file(str(tokenizer_file))
        pad_id = int(self.config.get("pad_token_id") or 0)
        pad = self._tokenizer.id_to_token(pad_id) or "<pad>"
        self._tokenizer.enable_padding(pad_id=pad_id, pad_token=pad)
        self._tokenizer.enable_truncation(max_length=self.max_length)
        self._counter = Tokenizer.from_file(str(tokenizer_file))
        self._counter.no_truncation()
        self._counter.no_padding()

    def count(self, texts: Sequence[str]) -> list[int]:
        encoded = self._counter.encode_batch(list(texts), add_special_tokens=False)
        return [len(e.ids) for e in encoded]

    def probabilities(self, inputs: Sequence[str | tuple[str, str]]) -> tuple[list[float], int]:
        import numpy as np

        encoded = self._tokenizer.encode_batch(list(inputs))
        ids = np.array([e.ids for e in encoded], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
        tokens = int(mask.sum())
        if self._session is not None:
            names = {i.name for i in self._session.get_inputs()}
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in names:
                feed["token_type_ids"] = np.array([e.type_ids for e in encoded], dtype=np.int64)
            logits = self._session.run(None, {k: v for k, v in feed.items() if k in names})[0]
            index = self.support_label
            if index is None:
                index = _support_index(self.config, int(np.shape(logits)[-1]), self.profile)
            return _softmax_at(logits, index), tokens
        hidden = self._encoder.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        start = np.full((len(ids), 1), self.decoder_start, dtype=np.int64)
        names = {i.name for i in self._decoder.get_inputs()}
        feed = {
            "input_ids": start,
            "encoder_hidden_states": hidden,
            "encoder_attention_mask": mask,
        }
        logits = self._decoder.run(None, {k: v for k, v in feed.items() if k in names})[0]
        first = np.asarray(logits)[:, 0, :]
        return _softmax_at(first[:, list(self.label_ids)], 1), tokens


class _TransformersModel:
    """A checker loaded by ``transformers`` and run by PyTorch."""

    def __init__(
        self,
        source: str,
        profile: str,
        support_label: int | None,
        label_ids: tuple[int, int],
        max_length: int | None,
        device: str | None,
        trust_remote_code: bool,
    ) -> None:
        import torch
        from transformers import (
            AutoConfig,
            AutoModelForSeq2SeqLM,
            AutoModelForSequenceClassification,
            AutoTokenizer,
        )

        self._torch = torch
        config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
        self.config = config.to_dict()
        self.profile = profile if profile != "auto" else _guess_profile(self.config)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if self.profile == "minicheck-t5":
            self._model = AutoModelForSeq2SeqLM.from_pretrained(
                source, trust_remote_code=trust_remote_code
            )
        else:
            self._model = AutoModelForSequenceClassification.from_pretrained(
                source, trust_remote_code=trust_remote_code
            )
        self._model.eval().to(self.device)
        if self.profile == "hhem":
            # HHEM tokenizes inside its own predict(); its tokenizer counts the tokens
            self._tokenizer = getattr(
                self._model, "tokenizer", None
            ) or AutoTokenizer.from_pretrained(self.config.get("foundation", source))
        else:
            self._tokenizer = AutoTokenizer.from_pretrained(source)
        limit = getattr(self._tokenizer, "model_max_length", None)
        if not isinstance(limit, int) or limit > 1_000_000:
            limit = 512
        self.max_length = max_length or limit
        self.eos_token = self._tokenizer.eos_token or self._tokenizer.sep_token or "</s>"
        self.support_label = support_label
        self.label_ids = label_ids
        self.decoder_start = int(self.config.get("decoder_start_token_id") or 0)

    def count(self, texts: Sequence[str]) -> list[int]:
        ids = self._tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        return [len(x) for x in ids]

    def probabilities(self, inputs: Sequence[str | tuple[str, str]]) -> tuple[list[float], int]:
        torch = self._torch
        with torch.inference_mode():
            if self.profile == "hhem":
                pairs = [x if isinstance(x, tuple) else (x, "") for x in inputs]
                scores = self._model.predict(pairs)
                tokens = sum(self.count([a + " " + b for a, b in pairs]))
                return [float(s) for s in scores], tokens
            if inputs and isinstance(inputs[0], tuple):
                first = [x[0] for x in inputs if isinstance(x, tuple)]
                second = [x[1] for x in inputs if isinstance(x, tuple)]
                enc = self._tokenizer(
                    first,
                    second,
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
            else:
                enc = self._tokenizer(
                    [str(x) for x in inputs],
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                )
            enc = {k: v.to(self.device) for k, v in enc.items()}
            tokens = int(enc["attention_mask"].sum())
            if self.profile == "minicheck-t5":
                start = torch.full(
                    (enc["input_ids"].shape[0], 1),
                    self.decoder_start,
                    dtype=torch.long,
                    device=self.device,
                )
                out = self._model(
                    input_ids=enc["input_ids"],
                    attention_mask=enc["attention_mask"],
                    decoder_input_ids=start,
                )
                first_step = out.logits[:, 0, :].float().cpu().numpy()
                return _softmax_at(first_step[:, list(self.label_ids)], 1), tokens
            logits = self._model(**enc).logits.float().cpu().numpy()
        index = self.support_label
        if index is None:
            index = _support_index(self.config, int(logits.shape[-1]), self.profile)
        return _softmax_at(logits, index), tokens


_LOADED: dict[tuple[Any, ...], _Model] = {}
_LOADED_LOCK = threading.Lock()


def _is_onnx_folder(path: Path) -> bool:
    return (path / "model.onnx").is_file() or (path / "encoder_model.onnx").is_file()


def _load(
    model: str | Path,
    runtime: str,
    profile: str,
    support_label: int | None,
    label_ids: tuple[int, int],
    max_length: int | None,
    device: str | None,
    threads: int | None,
    trust_remote_code: bool,
) -> _Model:
    """The loaded checker for these settings, shared by every backend that asks for it."""
    path = Path(model).expanduser()
    local = path.is_dir()
    if isinstance(model, Path) and not local:
        raise ConfigurationError(f"checker model directory {path} does not exist")
    if runtime == "auto":
        runtime = "onnx" if local and _is_onnx_folder(path) else "transformers"
    stamp: tuple[Any, ...] = ()
    if local:
        stamp = tuple(
            (f.name, f.stat().st_mtime_ns, f.stat().st_size)
            for f in sorted(path.iterdir())
            if f.is_file()
        )
    key = (
        str(path.resolve()) if local else str(model),
        stamp,
        runtime,
        profile,
        support_label,
        label_ids,
        max_length,
        device,
        threads,
        trust_remote_code,
    )
    with _LOADED_LOCK:
        loaded = _LOADED.get(key)
        if loaded is not None:
            return loaded
        if runtime == "onnx":
            if "onnx" not in checker_runtimes():
                raise ConfigurationError(
                    f"the ONNX checker runtime is not installed: {_CHECKER_HINT}"
                )
            if not local:
                raise ConfigurationError(
                    f"runtime 'onnx' needs a local directory with model.onnx, got {str(model)!r}"
                )
            loaded = _OnnxModel(path, profile, support_label, label_ids, max_length, threads)
        elif runtime == "transformers":
            if "transformers" not in checker_runtimes():
                where = "directory" if local else "model id"
                raise ConfigurationError(
                    f"checker {where} {str(model)!r} needs transformers and PyTorch, which are not "
                    f"installed: {_TORCH_HINT}; or export it to ONNX "
                    "(optimum-cli export onnx --model ID DIR) and use the checker extra"
                )
            try:
                loaded = _TransformersModel(
                    str(model),
                    profile,
                    support_label,
                    label_ids,
                    max_length,
                    device,
                    trust_remote_code,
                )
            except OSError as exc:  # no such model id, no network, no weights in the folder
                raise ConfigurationError(
                    f"checker model {str(model)!r} could not be loaded: {exc}"
                ) from exc
        else:
            raise ConfigurationError(
                f"checker runtime must be 'auto', 'onnx' or 'transformers', got {runtime!r}"
            )
        _LOADED[key] = loaded
        return loaded


# ----------------------------------------------------------------------------------------------
# The backend


@dataclass(frozen=True)
class _Chunk:
    start: int  # offsets in the material
    end: int
    first: int  # index of its first and last sentence
    last: int


def chunk_sentences(
    sentences: Sequence[Sentence], counts: Sequence[int], budget: int
) -> list[_Chunk]:
    """Consecutive sentences grouped into chunks of at most ``budget`` tokens (a sentence longer
    than that stands alone); no overlap, as MiniCheck chunks."""
    chunks: list[_Chunk] = []
    first, used = 0, 0
    for i, n in enumerate(counts):
        if i > first and used + n > budget:
            chunks.append(_Chunk(sentences[first].start, sentences[i - 1].end, first, i - 1))
            first, used = i, 0
        used += n
    if sentences:
        chunks.append(_Chunk(sentences[first].start, sentences[-1].end, first, len(sentences) - 1))
    return chunks


class CheckerSupport(SyncSupportBackend):
    """Support scored by a grounding-checker model, with the lexical hard checks kept.

    ``model``: a Hugging Face model id or a local directory. ``profile``: how the model takes
    its input (``"auto"`` reads ``config.json``: seq2seq is MiniCheck-Flan-T5, an
    ``entailment`` label an NLI cross-encoder, HHEM by its architecture, otherwise MiniCheck's
    sequence classifier). ``runtime``: ``"onnx"`` for an exported directory, ``"transformers"``
    for PyTorch, ``"auto"`` picks by what the directory holds. ``chunk_tokens``: material tokens
    per chunk (the profile's default, never more than fits the model with the claim).
    ``support_label``: the output index meaning "supported" when ``config.json`` does not say.
    ``label_token_ids``: a seq2seq checker's ("unsupported", "supported") token ids.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        profile: Profile = "auto",
        runtime: Runtime = "auto",
        chunk_tokens: int | None = None,
        batch_size: int = 8,
        max_length: int | None = None,
        support_label: int | None = None,
        label_token_ids: tuple[int, int] = MINICHECK_T5_LABEL_IDS,
        device: str | None = None,
        threads: int | None = None,
        trust_remote_code: bool = False,
        name: str = "checker",
        cache_size: int = 2048,
        params: LexicalParams | None = None,
    ) -> None:
        if not isinstance(model, (str, Path)) or not str(model).strip():
            raise ConfigurationError("CheckerSupport needs a model id or a model directory")
        if not 0.0 < threshold <= 1.0:
            raise ConfigurationError(f"threshold must be in (0, 1], got {threshold!r}")
        if batch_size < 1:
            raise ConfigurationError(f"batch_size must be at least 1, got {batch_size!r}")
        if chunk_tokens is not None and chunk_tokens < 16:
            raise ConfigurationError(f"chunk_tokens must be at least 16, got {chunk_tokens!r}")
        if profile not in ("auto", *_CHUNK_TOKENS):
            raise ConfigurationError(
                f"checker profile must be one of auto, {', '.join(_CHUNK_TOKENS)}; got {profile!r}"
            )
        self.threshold = float(threshold)
        self.name = name
        self.batch_size = int(batch_size)
        self.params = params or LexicalParams()
        self.model = model
        self._model = _load(
            model,
            runtime,
            profile,
            support_label,
            (int(label_token_ids[0]), int(label_token_ids[1])),
            max_length,
            device,
            threads,
            trust_remote_code,
        )
        self.profile: str = getattr(self._model, "profile", profile)
        self.chunk_tokens = int(chunk_tokens or _CHUNK_TOKENS[self.profile])
        self._cache: LruCache[tuple[str, str], Support] = LruCache(cache_size)
        self._chunk_scores: LruCache[tuple[str, str], float] = LruCache(cache_size * 8)

    def __repr__(self) -> str:
        model = str(self.model)
        return f"CheckerSupport({model!r}, profile={self.profile!r}, threshold={self.threshold})"

    def register(self) -> None:
        """Make this instance the support backend named ``self.name``."""
        register_backend(self.name, lambda: self)

    # -- model inputs ------------------------------------------------------------------------

    def _input(self, chunk: str, claim: str) -> str | tuple[str, str]:
        eos = self._model.eos_token
        if self.profile == "minicheck":
            return f"{chunk}{eos}{claim}"
        if self.profile == "minicheck-t5":
            return f"predict: {chunk}{eos}{claim}"
        if self.profile == "hhem" and not isinstance(self._model, _TransformersModel):
            return _HHEM_TEMPLATE.format(premise=chunk, hypothesis=claim)
        return (chunk, claim)

    def _overhead(self, claim: str) -> int:
        """Tokens a model input takes besides its chunk: the claim, the prompt, specials."""
        skeleton = self._input("", claim)
        text = skeleton if isinstance(skeleton, str) else " ".join(skeleton)
        if self.profile == "hhem":  # its predict() wraps the pair in its prompt
            text = _HHEM_TEMPLATE.format(premise="", hypothesis=claim)
        return self._model.count([text])[0] + 4

    def _score_pairs(self, pairs: list[tuple[str, str]]) -> list[float]:
        """Support probability of each (chunk, claim), in batches, cached."""
        out: list[float | None] = [self._chunk_scores.get(p) for p in pairs]
        todo = [i for i, v in enumerate(out) if v is None]
        for k in range(0, len(todo), self.batch_size):
            batch = todo[k : k + self.batch_size]
            probs, tokens = self._model.probabilities([self._input(*pairs[i]) for i in batch])
            record_usage(calls=1, input_tokens=tokens)
            if len(probs) != len(batch) or not all(math.isfinite(p) for p in probs):
                raise ConfigurationError(
                    f"checker model gave {len(probs)} scores for {len(batch)} inputs"
                )
            for i, p in zip(batch, probs, strict=True):
                out[i] = self._chunk_scores.put(pairs[i], max(0.0, min(1.0, float(p))))
        return [float(v) for v in out if v is not None]

    def _fit(
        self, sentences: list[Sentence], counts: list[int], budget: int
    ) -> tuple[list[Sentence], list[int], list[int]]:
        """The sentences with any longer than ``budget`` tokens cut at word (or, in Chinese,
        character) boundaries into pieces that fit, their token counts, and the sentence each
        piece comes from: a model input is never truncated, so the claim always reaches the
        model whole."""
        if all(n <= budget for n in counts):
            return sentences, counts, list(range(len(sentences)))
        pieces: list[Sentence] = []
        piece_counts: list[int] = []
        origin: list[int] = []
        for i, (sentence, n) in enumerate(zip(sentences, counts, strict=True)):
            if n <= budget:
                pieces.append(sentence)
                piece_counts.append(n)
                origin.append(i)
                continue
            units = [(m.start(), m.end()) for m in _UNIT_RE.finditer(sentence.text)]
            sizes = self._model.count([sentence.text[a:b] for a, b in units])
            first, used = 0, 0
            for k, size in enumerate([*sizes, budget + 1]):
                if k == len(units) or (k > first and used + size > budget):
                    a, b = units[first][0], units[k - 1][1]
                    pieces.append(
                        Sentence(sentence.text[a:b], sentence.start + a, sentence.start + b)
                    )
                    piece_counts.append(min(used, budget))
                    origin.append(i)
                    first, used = k, 0
                used += size
        return pieces, piece_counts, origin

    # -- checking ----------------------------------------------------------------------------

    def __call__(
        self, claim: str, material_text: str, *, corpus: Sequence[str] | None = None
    ) -> Support:
        """Score how well ``material_text`` supports ``claim`` (blocking: the model runs here)."""
        check_inputs(claim, material_text)
        key = (claim, material_text)
        cached = self._cache.get(key)
        if cached is not None:
            record_usage(cached=1)
            return cached
        return self._cache.put(key, self._check(claim, material_text, corpus))

    def _check(self, claim: str, material_text: str, corpus: Sequence[str] | None) -> Support:
        view = _material_view(material_text)
        sentences = view.sentences or [Sentence(material_text, 0, len(material_text))]
        parts = [s.text.strip() for s in split_sentences(claim)] or [claim.strip()]
        parts = [p for p in parts if p] or [claim.strip()]
        counts = self._model.count([s.text for s in sentences])
        plans: list[tuple[str, list[_Chunk], list[int]]] = []
        pairs: list[tuple[str, str]] = []
        for part in parts:
            budget = max(16, min(self.chunk_tokens, self._model.max_length - self._overhead(part)))
            pieces, piece_counts, origin = self._fit(sentences, counts, budget)
            chunks = chunk_sentences(pieces, piece_counts, budget)
            plans.append((part, chunks, origin))
            pairs += [(material_text[c.start : c.end], part) for c in chunks]
        scores = iter(self._score_pairs(pairs))
        # per claim sentence: its best chunk; the weakest claim sentence decides
        results = []
        for part, chunks, origin in plans:
            per_chunk = [next(scores) for _ in chunks]
            best = max(range(len(chunks)), key=lambda k: per_chunk[k])
            results.append((per_chunk[best], part, chunks[best], len(chunks), origin))
        score, part, chunk, n_chunks, origin = min(results, key=lambda r: r[0])
        analysis = analyse(claim, material_text, corpus, self.params)
        in_chunk = sorted(
            {origin[k] for k in range(chunk.first, chunk.last + 1)}
            & set(range(len(view.sentences)))
        )
        ranked = sorted(in_chunk, key=lambda i: -analysis.sentence_scores[i])
        reasons: list[str] = []
        cap = self.params.mismatch_cap * self.threshold
        hard = False
        for q in analysis.mismatches:
            reasons.append(f"{q.raw} not in material")
            hard = True
        if analysis.negation_mismatch:
            reasons.append(
                "negation mismatch: the claim is negated, the sentence is not"
                if analysis.claim_negated
                else "negation mismatch: the sentence is negated, the claim is not"
            )
            hard = True
        material_tokens = frozenset().union(*view.tokens) if view.tokens else frozenset()
        absent = [name for name in analysis.missing_entities if name not in material_tokens]
        if absent:
            reasons.append(f"{', '.join(repr(n) for n in absent)} never named in the material")
            hard = True
        model_score = score
        if hard:
            score = min(score, cap)
        supported = score >= self.threshold and not hard
        where = f"best of {n_chunks} chunks" if n_chunks > 1 else "one chunk"
        part_note = (
            f" (weakest of {len(parts)} claim sentences: {part!r})" if len(parts) > 1 else ""
        )
        reasons.append(
            f"checker: support probability {model_score:.2f}, {where}{part_note}"
            + ("" if supported or hard else f", below threshold {self.threshold:.2f}")
        )
        if ranked:
            s = view.sentences[ranked[0]]
            sentence, start, end = s.text, s.start, s.end
        else:
            sentence, start, end = material_text[chunk.start : chunk.end], chunk.start, chunk.end
        return Support(
            score=round(max(0.0, min(1.0, score)), 6),
            supported=supported,
            sentence=sentence,
            start=start,
            end=end,
            backend=self.name,
            reason="; ".join(reasons),
            mismatches=tuple(q.raw for q in analysis.mismatches),
            candidates=tuple(
                (
                    view.sentences[i].start,
                    view.sentences[i].end,
                    round(analysis.sentence_scores[i], 4),
                )
                for i in ranked[:5]
            ),
            unsupported_terms=tuple(analysis.unsupported_terms(claim)),
        )


def unconfigured_checker() -> CheckerSupport:
    """The registry's factory for ``"checker"`` before one is registered: raises, saying why."""
    raise ConfigurationError(
        "support backend 'checker' needs a model and cannot be created by name: build it with "
        "tracerag.CheckerSupport('a model id or directory') and pass that instance as the "
        "backend, or call its register()"
    )


_factory: Callable[[], CheckerSupport] = unconfigured_checker
register_backend("checker", _factory)
