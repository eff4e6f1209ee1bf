"""What a second check against a long material costs the embeddings backend, next to the first.

The ``embeddings`` backend embeds every sentence of a material it has not seen; its sentence
vectors are then kept by sentence text, so a later check of another claim against the same
material embeds only the claim. Measured here with the offline MiniLM model on materials of
``--sentences`` sentences (default 200, the length of a WiCE article): process time of the first
check of a claim, then of a second check of another claim against the same material, and their
ratio; then a third material that shares all but ten of its sentences with one already seen.
The materials are WiCE dev articles of at least that many sentences where the shared data is
present, else made from the demo knowledge base's sentences (numbered, so each is distinct).

Usage: python benchmarks/verifier_embeddings_cache.py [--data DIR] [--sentences N]
                                                      [--materials N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from verifier_data import data_root

from tracerag.signals import _lexical as lexical
from tracerag.text._quantities import _extract_cached
from tracerag.text._sentences import split_sentences


def _demo_sentences() -> list[str]:
    from importlib import resources

    text = resources.files("tracerag.demo").joinpath("knowledge_base.jsonl").read_text("utf-8")
    out: list[str] = []
    for line in text.splitlines():
        if line.strip():
            out += [s.text for s in split_sentences(json.loads(line)["text"])]
    return out


def materials(root: Path, sentences: int, count: int) -> list[tuple[list[str], list[str]]]:
    """``count`` materials of at least ``sentences`` sentences, each with two claims."""
    path = root / "wice" / "claim-dev.jsonl"
    out: list[tuple[list[str], list[str]]] = []
    if path.is_file():
        by_article: dict[str, tuple[list[str], list[str]]] = {}
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            evidence = row["evidence"]
            if isinstance(evidence, str):
                import ast

                evidence = ast.literal_eval(evidence)
            if len(evidence) < sentences:
                continue
            key = "\n".join(evidence[:3])
            entry = by_article.setdefault(key, ([str(s) for s in evidence[:sentences]], []))
            entry[1].append(str(row["claim"]))
        out = [(s, c) for s, c in by_article.values() if len(c) >= 2][:count]
        if out:
            return out
    base = _demo_sentences()
    for m in range(count):
        sents = [f"Section {m}.{k}: {base[k % len(base)]}" for k in range(sentences)]
        out.append((sents, [sents[5].split(": ", 1)[1], sents[40].split(": ", 1)[1]]))
    return out


def _clear_lexical() -> None:
    lexical._VIEWS.clear()
    lexical._DOC_TOKENS.clear()
    _extract_cached.cache_clear()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", help="the shared data directory (holding wice/, ...)")
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--materials", type=int, default=5)
    args = parser.parse_args(argv)
    from tracerag.signals._embeddings import EmbeddingSupport, MiniLMEmbeddings, minilm_available

    if not minilm_available():
        print("the MiniLM model is not installed (the embeddings extra): nothing to measure")
        return 0
    backend = EmbeddingSupport(MiniLMEmbeddings())
    backend("warm-up claim.", "A warm-up sentence. Another one.")  # load the model
    rows = materials(data_root(args.data), args.sentences, args.materials)
    firsts, seconds, shared = [], [], []
    for sents, claims in rows:
        text = "\n".join(sents)
        _clear_lexical()
        backend.clear_cache()
        began = time.process_time()
        backend(claims[0], text)
        firsts.append(time.process_time() - began)
        began = time.process_time()
        backend(claims[1], text)
        seconds.append(time.process_time() - began)
        # another material holding the same sentences but ten new ones
        edited = "\n".join(sents[:-10] + [f"Note {k}: {s}" for k, s in enumerate(sents[-10:])])
        began = time.process_time()
        backend(claims[1], edited)
        shared.append(time.process_time() - began)
    n = len(rows)
    first, second, third = (statistics.median(v) * 1000 for v in (firsts, seconds, shared))
    print(
        f"{n} materials of {args.sentences} sentences, MiniLM int8 on the CPU (median process time)"
    )
    print(f"  first check (embeds the material)      {first:8.1f} ms")
    print(
        f"  second check, same material            {second:8.1f} ms  "
        f"ratio {second / first:.3f} (per material: "
        + ", ".join(f"{s / f:.3f}" for f, s in zip(firsts, seconds, strict=True))
        + ")"
    )
    print(f"  material sharing all but 10 sentences  {third:8.1f} ms  ratio {third / first:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
