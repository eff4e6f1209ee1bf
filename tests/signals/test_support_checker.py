"""CheckerSupport on tiny randomly initialised models written in the test (ONNX Runtime)."""

from __future__ import annotations

import asyncio
import importlib.util
import math
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx", reason="building the tiny test models needs onnx (the test extra)")
pytest.importorskip("onnxruntime", reason="the checker runtime needs the checker extra")

from tiny_checker_model import classifier, seq2seq

import tracerag
from tracerag.errors import ConfigurationError
from tracerag.signals._checker import CheckerSupport, chunk_sentences
from tracerag.signals._citations import verify_citations
from tracerag.signals._support import get_backend, usage_scope
from tracerag.signals._types import Material
from tracerag.text._sentences import split_sentences

# six sentences: with the tiny model's 32-token window they make three chunks; the signal word
# the model was planted with ("zebra") is in the last one only
MATERIAL = (
    "The museum is open on weekdays. The park has a river and a bridge. "
    "The library is closed in winter. The station has ships and boats. "
    "The office is in the city. The zebra crossing has stripes."
)
SUPPORTED = "The zebra crossing has stripes."
OTHER = "The museum is open on weekdays."


def _sigmoid_support(logits: np.ndarray, index: int) -> float:
    z = logits - logits.max()
    return float(np.exp(z[index]) / np.exp(z).sum())


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checker") / "minicheck"


@pytest.fixture(scope="module")
def tiny(folder: Path):
    return classifier(folder)


@pytest.fixture
def checker(tiny) -> CheckerSupport:
    return CheckerSupport(tiny.folder, cache_size=0)


def _chunks(checker: CheckerSupport, claim: str) -> list[str]:
    sentences = split_sentences(MATERIAL)
    counts = checker._model.count([s.text for s in sentences])
    budget = min(checker.chunk_tokens, checker._model.max_length - checker._overhead(claim))
    return [MATERIAL[c.start : c.end] for c in chunk_sentences(sentences, counts, budget)]


def test_loads_an_exported_directory_and_reads_its_settings(checker: CheckerSupport):
    assert checker.profile == "minicheck"  # two generic labels, no entailment label
    assert checker._model.max_length == 32  # tokenizer_config.json's model_max_length
    assert checker._model.eos_token == "</s>"
    assert tracerag.CheckerSupport is CheckerSupport


def test_long_material_is_chunked_and_the_best_chunk_wins(checker: CheckerSupport, tiny):
    chunks = _chunks(checker, SUPPORTED)
    assert len(chunks) == 3 and "zebra" in chunks[-1]
    assert " ".join(chunks) == MATERIAL  # every sentence in exactly one chunk, in order
    expected = [_sigmoid_support(tiny.reference_logits(f"{c}</s>{SUPPORTED}"), 1) for c in chunks]
    result = checker(SUPPORTED, MATERIAL)
    assert result.score == pytest.approx(max(expected), abs=1e-5)
    assert max(expected) == expected[-1] > checker.threshold > max(expected[:-1])
    assert result.supported
    assert result.sentence == SUPPORTED  # the winning chunk's sentence that says it
    assert MATERIAL[result.start : result.end] == result.sentence
    assert "best of 3 chunks" in result.reason


def test_every_chunk_fits_the_model(checker: CheckerSupport):
    for chunk in _chunks(checker, SUPPORTED):
        enc = checker._model._counter.encode(f"{chunk}</s>{SUPPORTED}")
        assert len(enc.ids) + 2 <= checker._model.max_length  # with <s> and </s>


def test_batches_give_the_same_scores_as_one_input_at_a_time(tiny):
    claims = [SUPPORTED, OTHER, "The park has a river.", "Ships and boats are in the station."]
    one = CheckerSupport(tiny.folder, batch_size=1, cache_size=0)
    many = CheckerSupport(tiny.folder, batch_size=16, cache_size=0)
    for claim in claims:
        assert one(claim, MATERIAL).score == pytest.approx(many(claim, MATERIAL).score, abs=1e-5)
    with usage_scope() as usage:
        CheckerSupport(tiny.folder, batch_size=2, cache_size=0)(OTHER, MATERIAL)
    assert usage.calls == 2  # three chunks in batches of two
    assert usage.input_tokens > 3 * 10


def test_threshold_decides_between_scores(tiny):
    low = CheckerSupport(tiny.folder, threshold=0.05, cache_size=0)
    other = low(OTHER, MATERIAL)
    assert other.supported
    strict = CheckerSupport(tiny.folder, threshold=min(0.99, other.score + 0.01), cache_size=0)
    assert not strict(OTHER, MATERIAL).supported
    assert "below threshold" in strict(OTHER, MATERIAL).reason


@pytest.mark.parametrize(
    ("claim", "why"),
    [
        ("The zebra crossing has 12 stripes.", "12 not in material"),
        ("The zebra crossing has no stripes.", "negation mismatch"),
        ("The Gotham zebra crossing has stripes.", "'gotham' never named"),
    ],
)
def test_lexical_hard_checks_overrule_the_model(checker: CheckerSupport, claim: str, why: str):
    result = checker(claim, MATERIAL)
    assert not result.supported
    assert result.score <= checker.params.mismatch_cap * checker.threshold
    assert why in result.reason.lower()


def test_a_claim_of_several_sentences_is_as_strong_as_its_weakest(checker: CheckerSupport):
    both = checker(f"{SUPPORTED} {OTHER}", MATERIAL)
    assert both.score == pytest.approx(
        min(checker(SUPPORTED, MATERIAL).score, checker(OTHER, MATERIAL).score), abs=1e-6
    )
    assert "weakest of 2 claim sentences" in both.reason


def test_nli_profile_reads_the_entailment_label(tmp_path: Path):
    labels = {0: "contradiction", 1: "neutral", 2: "entailment"}
    tiny = classifier(tmp_path / "nli", labels=labels, support=2, model_type="deberta")
    nli = CheckerSupport(tiny.folder, cache_size=0)
    assert nli.profile == "nli"
    result = nli(SUPPORTED, MATERIAL)
    enc_chunk = next(c for c in _chunks(nli, SUPPORTED) if "zebra" in c)
    expected = _sigmoid_support(tiny.reference_logits((enc_chunk, SUPPORTED)), 2)
    assert result.score == pytest.approx(expected, abs=1e-5)
    assert result.supported


def test_seq2seq_checker_reads_the_first_decoder_step(tmp_path: Path):
    tiny = seq2seq(tmp_path / "t5")
    t5 = CheckerSupport(tiny.folder, cache_size=0)
    assert t5.profile == "minicheck-t5"
    result = t5(SUPPORTED, MATERIAL)
    chunk = next(c for c in _chunks(t5, SUPPORTED) if "zebra" in c)
    logits = tiny.reference_logits(f"predict: {chunk}</s>{SUPPORTED}")
    expected = _sigmoid_support(logits[[3, 209]], 1)
    assert result.score == pytest.approx(expected, abs=1e-5)
    assert result.supported and result.sentence == SUPPORTED


def test_verdicts_are_cached_and_async_checks_run_off_the_event_loop(tiny):
    checker = CheckerSupport(tiny.folder)
    threads: list[str] = []
    inner = checker._model.probabilities

    def recording(inputs):
        threads.append(threading.current_thread().name)
        return inner(inputs)

    checker._model.probabilities = recording  # type: ignore[method-assign]
    try:

        async def main() -> None:
            loop_thread = threading.current_thread().name
            first = await checker.acheck(SUPPORTED, MATERIAL)
            assert first.supported
            assert threads and all(t != loop_thread for t in threads)

        asyncio.run(main())
        calls = len(threads)
        with usage_scope() as usage:
            checker(SUPPORTED, MATERIAL)
        assert len(threads) == calls and usage.cached == 1
    finally:
        checker._model.probabilities = inner  # type: ignore[method-assign]


def test_citation_report_names_the_checker_sentence(checker: CheckerSupport):
    report = verify_citations(
        f"{SUPPORTED[:-1]} [m1].", [Material(id="m1", text=MATERIAL)], backend=checker
    )
    claim = report.claims[0]
    assert claim.verdict == "supported" and claim.sentence == SUPPORTED
    assert report.backend == "checker"


def test_bad_models_and_settings_are_configuration_errors(tmp_path: Path, tiny):
    with pytest.raises(ConfigurationError, match="does not exist"):
        CheckerSupport(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "model.onnx").write_bytes((tiny.folder / "model.onnx").read_bytes())
    with pytest.raises(ConfigurationError, match=r"no tokenizer\.json"):
        CheckerSupport(empty)
    with pytest.raises(ConfigurationError, match="threshold"):
        CheckerSupport(tiny.folder, threshold=0)
    with pytest.raises(ConfigurationError, match="profile"):
        CheckerSupport(tiny.folder, profile="bert")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="needs a model"):
        get_backend("checker")
    with pytest.raises(ConfigurationError, match="runtime 'onnx' needs a local directory"):
        CheckerSupport("org/some-checker", runtime="onnx")
    if importlib.util.find_spec("transformers") is None:
        with pytest.raises(ConfigurationError, match="checker-torch"):
            CheckerSupport("lytang/MiniCheck-RoBERTa-Large")


def test_registered_instance_is_found_by_name(tiny):
    checker = CheckerSupport(tiny.folder, name="tiny-checker")
    checker.register()
    assert get_backend("tiny-checker") is checker
    assert math.isfinite(get_backend("tiny-checker")(SUPPORTED, MATERIAL).score)


# -- the transformers runtime (PyTorch), where it is installed ---------------------------------
# PyPI's torch wheel brings its CUDA libraries (about 5.6 GB, 9 minutes to install here), so CI
# tests the ONNX runtime above; this runs wherever the checker-torch extra is installed.


def _torch_checker(folder: Path, kind: str):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    from tiny_checker_model import SPECIALS, _tokenizer

    torch.manual_seed(0)
    folder.mkdir(parents=True)
    tok = _tokenizer(folder, 32, vocab_size=256)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        model_max_length=32,
    )
    assert fast.convert_tokens_to_ids(SPECIALS) == [0, 1, 2, 3]
    if kind == "seq2seq":
        config = transformers.T5Config(
            vocab_size=256,
            d_model=16,
            d_kv=4,
            d_ff=32,
            num_layers=1,
            num_heads=2,
            decoder_start_token_id=0,
            pad_token_id=1,
            eos_token_id=2,
        )
        model = transformers.T5ForConditionalGeneration(config)
    else:
        config = transformers.RobertaConfig(
            vocab_size=256,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=40,
            pad_token_id=1,
            num_labels=2,
        )
        model = transformers.RobertaForSequenceClassification(config)
    model.eval()
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return model, fast, torch


@pytest.mark.parametrize("kind", ["classifier", "seq2seq"])
def test_transformers_runtime_scores_as_the_model_does(tmp_path: Path, kind: str):
    model, fast, torch = _torch_checker(tmp_path / kind, kind)
    checker = CheckerSupport(tmp_path / kind, cache_size=0, batch_size=2)
    assert checker.profile == ("minicheck-t5" if kind == "seq2seq" else "minicheck")
    result = checker(SUPPORTED, MATERIAL)
    chunks = _chunks(checker, SUPPORTED)
    assert len(chunks) >= 2
    expected = []
    with torch.no_grad():
        for chunk in chunks:
            if kind == "seq2seq":
                enc = fast(f"predict: {chunk}</s>{SUPPORTED}", return_tensors="pt")
                start = torch.zeros((1, 1), dtype=torch.long)
                logits = model(**enc, decoder_input_ids=start).logits[0, 0, [3, 209]]
            else:
                enc = fast(f"{chunk}</s>{SUPPORTED}", return_tensors="pt")
                logits = model(**enc).logits[0]
            expected.append(float(torch.softmax(logits, dim=-1)[1]))
    assert result.score == pytest.approx(max(expected), abs=1e-4)  # padded batches change nothing
    assert result.sentence in MATERIAL


def test_a_sentence_longer_than_a_chunk_is_cut_so_the_claim_is_never_truncated(tiny):
    checker = CheckerSupport(tiny.folder, cache_size=0)
    long_sentence = (
        "The museum and the park and the library and the station and the office and the city "
        "and the river and the bridge and the harbour and the zebra crossing has stripes."
    )
    seen: list[str] = []
    inner = checker._model.probabilities

    def recording(inputs):
        seen.extend(inputs)
        return inner(inputs)

    checker._model.probabilities = recording  # type: ignore[method-assign]
    result = checker(SUPPORTED, long_sentence)
    assert len(seen) >= 2  # the one sentence went to the model in pieces
    for text in seen:
        assert text.endswith(f"</s>{SUPPORTED}")  # each input ends with the whole claim
        assert len(checker._model._counter.encode(text).ids) + 2 <= checker._model.max_length
    pieces = [t.split("</s>")[0] for t in seen]
    assert " ".join(p.strip() for p in pieces) == long_sentence
    assert result.supported and result.sentence == long_sentence
