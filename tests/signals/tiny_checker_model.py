"""Tiny randomly initialised checker models written to a directory, as an ONNX export lays them
out (``config.json``, ``tokenizer.json``, ``tokenizer_config.json``, ``model.onnx`` or
``encoder_model.onnx`` + ``decoder_model.onnx``), so the checker backend's loading, chunking,
batching and thresholds run offline.

The models mean-pool word embeddings over the attention mask and map the pooled vector to
logits. Their weights are random, except that one word (``SIGNAL``) is planted to push the
"supported" logit up: a chunk holding it scores higher than one without, so tests can tell
which chunk won. ``reference_logits`` computes the same function with numpy, one unpadded
input at a time, to check the runtime's batching and padding against.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

SIGNAL = "zebra"
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]
_WORDS_TEXT = (
    "the a an of in on to and is are was were for with by from at as it its this that "
    "predict premise hypothesis determine if true given warranty laptop laptops device devices "
    "phone phones months month years year days day repair repairs customer customers order "
    "orders refund refunds shipping free store credit gift cards policy covers cover covered "
    "manufacturing defects damage accidental liquid wear normal new sold carry carries extended "
    "clause under support team answers calls weekdays weekends open closed office city river "
    "bridge museum park library station zebra zebras lion horse crossing stripes animal animals "
    "gotham northwind gadgets not never no 12 24 30 5 10 99 2024 plants grow water sun light "
    "blue green red sky sea ship ships boat harbour wind rain snow winter summer"
)
WORDS = _WORDS_TEXT.split()
DIM = 8


@dataclass(frozen=True)
class TinyModel:
    """Where a tiny model was written, and its weights (for the numpy reference)."""

    folder: Path
    tokenizer: Tokenizer
    embeddings: np.ndarray  # [vocab, DIM]
    head: np.ndarray  # [DIM, labels or vocab]
    bias: np.ndarray

    def reference_logits(self, text: str | tuple[str, str]) -> np.ndarray:
        """The model's logits for one input, computed with numpy (no padding, no batch)."""
        enc = (
            self.tokenizer.encode(*text) if isinstance(text, tuple) else self.tokenizer.encode(text)
        )
        pooled = self.embeddings[enc.ids].mean(axis=0)
        return pooled @ self.head + self.bias


def _tokenizer(folder: Path, max_length: int, vocab_size: int) -> Tokenizer:
    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    while len(vocab) < vocab_size:
        vocab[f"filler{len(vocab)}"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIALS)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B:1 </s>:1",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"model_max_length": max_length, "eos_token": "</s>", "pad_token": "<pad>"}),
        encoding="utf-8",
    )
    return tok


def _pool_nodes(ids: str, mask: str, table: str, out: str) -> list[onnx.NodeProto]:
    """Nodes computing the masked mean of the embeddings of ``ids`` into ``out``."""
    return [
        helper.make_node("Gather", [table, ids], ["emb"]),
        helper.make_node("Cast", [mask], ["maskf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
        helper.make_node("Mul", ["emb", "mask3"], ["masked"]),
        helper.make_node("ReduceSum", ["masked", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
        helper.make_node("Div", ["summed", "count"], [out]),
    ]


def _axes() -> list[onnx.TensorProto]:
    return [
        numpy_helper.from_array(np.array([1], dtype=np.int64), "axis1"),
        numpy_helper.from_array(np.array([2], dtype=np.int64), "axis2"),
    ]


def _save(graph: onnx.GraphProto, path: Path) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _weights(vocab: int, outputs: int, support: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    emb = rng.normal(0.0, 0.3, size=(vocab, DIM)).astype(np.float32)
    head = rng.normal(0.0, 0.3, size=(DIM, outputs)).astype(np.float32)
    bias = np.zeros(outputs, dtype=np.float32)
    signal = 4 + WORDS.index(SIGNAL)
    emb[signal] = 0.0
    emb[signal, 0] = 12.0  # the planted word: one dimension ...
    head[0, :] = 0.0
    head[0, support] = 1.5  # ... that raises the "supported" logit only
    bias[support] = -1.0
    return emb, head, bias


def classifier(
    folder: Path,
    *,
    labels: dict[int, str] | None = None,
    support: int = 1,
    max_length: int = 32,
    seed: int = 0,
    model_type: str = "roberta",
) -> TinyModel:
    """A sequence-classification checker (MiniCheck's layout by default: LABEL_0 / LABEL_1)."""
    folder.mkdir(parents=True, exist_ok=True)
    labels = labels or {0: "LABEL_0", 1: "LABEL_1"}
    tok = _tokenizer(folder, max_length, vocab_size=len(SPECIALS) + len(WORDS) + 8)
    vocab = tok.get_vocab_size()
    emb, head, bias = _weights(vocab, len(labels), support, seed)
    nodes = [
        *_pool_nodes("input_ids", "attention_mask", "E", "pooled"),
        helper.make_node("MatMul", ["pooled", "W"], ["scores"]),
        helper.make_node("Add", ["scores", "b"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny-checker",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(labels)])],
        initializer=[
            numpy_helper.from_array(emb, "E"),
            numpy_helper.from_array(head, "W"),
            numpy_helper.from_array(bias, "b"),
            *_axes(),
        ],
    )
    _save(graph, folder / "model.onnx")
    config = {
        "architectures": [f"{model_type.capitalize()}ForSequenceClassification"],
        "model_type": model_type,
        "id2label": {str(k): v for k, v in labels.items()},
        "label2id": {v: k for k, v in labels.items()},
        "pad_token_id": 1,
    }
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return TinyModel(folder, tok, emb, head, bias)


def seq2seq(
    folder: Path, *, max_length: int = 32, seed: int = 0, label_ids: tuple[int, int] = (3, 209)
) -> TinyModel:
    """A seq2seq checker in the layout of an ONNX export (encoder and decoder), MiniCheck-Flan-T5
    style: the first decoder step's logits over ``label_ids`` decide."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = max(label_ids) + 8
    tok = _tokenizer(folder, max_length, vocab_size=vocab)
    emb, head, bias = _weights(vocab, vocab, label_ids[1], seed)
    encoder = helper.make_graph(
        [
            helper.make_node("Gather", ["E", "input_ids"], ["emb"]),
            helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
            helper.make_node("Mul", ["emb", "mask3"], ["last_hidden_state"]),
        ],
        "tiny-encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [
            helper.make_tensor_value_info(
                "last_hidden_state", TensorProto.FLOAT, ["batch", "seq", DIM]
            )
        ],
        initializer=[numpy_helper.from_array(emb, "E"), _axes()[1]],
    )
    _save(encoder, folder / "encoder_model.onnx")
    decoder = helper.make_graph(
        [
            helper.make_node("Cast", ["encoder_attention_mask"], ["maskf"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["maskf", "axis2"], ["mask3"]),
            helper.make_node(
                "ReduceSum", ["encoder_hidden_states", "axis1"], ["summed"], keepdims=0
            ),
            helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
            helper.make_node("Div", ["summed", "count"], ["pooled"]),
            helper.make_node("MatMul", ["pooled", "W"], ["scores"]),
            helper.make_node("Add", ["scores", "b"], ["flat"]),
            helper.make_node("Unsqueeze", ["flat", "axis1"], ["logits"]),
        ],
        "tiny-decoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", 1]),
            helper.make_tensor_value_info(
                "encoder_attention_mask", TensorProto.INT64, ["batch", "seq"]
            ),
            helper.make_tensor_value_info(
                "encoder_hidden_states", TensorProto.FLOAT, ["batch", "seq", DIM]
            ),
        ],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1, vocab])],
        initializer=[
            numpy_helper.from_array(head, "W"),
            numpy_helper.from_array(bias, "b"),
            *_axes(),
        ],
    )
    _save(decoder, folder / "decoder_model.onnx")
    config = {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "is_encoder_decoder": True,
        "decoder_start_token_id": 0,
        "pad_token_id": 1,
    }
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return TinyModel(folder, tok, emb, head, bias)


def words(text: str) -> list[str]:
    """The words of ``text`` the tiny tokenizer knows (for writing test texts)."""
    known = set(WORDS)
    return [w for w in re.findall(r"\w+", text.lower()) if w not in known]
