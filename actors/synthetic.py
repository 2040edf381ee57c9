"""Tiny random HF-format causal LMs built from a seed, for testing without a model hub.

`build` writes a Llama or Qwen2 model (float32 safetensors, config, generation config) and a
byte-level BPE tokenizer trained on the corpus shipped in actors/data. The same spec gives the
same bytes on every node and every run, so a synthetic model can stand in for a downloaded one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from actors.build_once import build_once

if TYPE_CHECKING:
    from fleet.contracts.sources import SyntheticSource

CORPUS = Path(__file__).with_name("data") / "corpus.txt"
# Part of every synthetic model's cache key: bump it when what build() writes changes.
FORMAT = 2
# A plain-text chat template (no new special tokens), so chat prompts work on tiny models too.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
MARKER = ".complete"
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIALS = [BOS, EOS, PAD]
# The BPE trainer puts special tokens first, in the order given.
SPECIAL_IDS = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
# Qwen2's pre-tokenizer split (GPT-4 style: digits one at a time); see _write_tokenizer.
QWEN2_SPLIT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501


def build(spec: SyntheticSource, out_dir: Path) -> Path:
    """Build the model `spec` describes into `out_dir` (once, safe from several processes at
    once: actors/build_once.py) and return `out_dir`."""
    _check(spec)

    def write(tmp: Path) -> str:
        _write_tokenizer(spec, tmp)
        _write_model(spec, tmp)
        return spec.model_dump_json() + "\n"

    return build_once(Path(out_dir), write, marker=MARKER, root=Path(out_dir).parent)


def _check(spec: SyntheticSource) -> None:
    if spec.hidden_size % spec.num_heads:
        msg = f"hidden_size {spec.hidden_size} is not a multiple of num_heads {spec.num_heads}"
        raise ValueError(msg)
    if spec.num_heads % spec.num_kv_heads:
        msg = f"num_heads {spec.num_heads} is not a multiple of num_kv_heads {spec.num_kv_heads}"
        raise ValueError(msg)


def _write_tokenizer(spec: SyntheticSource, out: Path) -> None:
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    # Qwen2's pipeline for both families: transformers 5 loads any model_type "qwen2" directory
    # with Qwen2Tokenizer, which rebuilds normalizer and pre-tokenizer its own way (ignoring
    # tokenizer.json's), so only this pipeline encodes the same under every loader.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        min_frequency=1,
        special_tokens=SPECIALS,
        # All 256 bytes up front, so any text encodes without an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(CORPUS)], trainer)
    # The corpus runs out of merges near 2.3k tokens; larger vocabularies are filled with
    # reserved specials so that tokenizer and embedding sizes agree exactly.
    if (short := spec.vocab_size - tok.get_vocab_size()) > 0:
        tok.add_special_tokens([f"<reserved_{i}>" for i in range(short)])
    if tok.get_vocab_size() != spec.vocab_size or [tok.token_to_id(t) for t in SPECIALS] != [0, 1, 2]:
        msg = f"tokenizer has {tok.get_vocab_size()} tokens or misplaced specials; spec asks for {spec.vocab_size}"
        raise ValueError(msg)
    # BOS comes from the tokenizer itself, so HF and vLLM (which both just call it) agree.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, SPECIAL_IDS["bos_token_id"])]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        # Saved as null: left out, Qwen2Tokenizer adds an "<|endoftext|>" unk beyond the vocabulary.
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=spec.max_position_embeddings,
        chat_template=CHAT_TEMPLATE,
    ).save_pretrained(out)


def _write_model(spec: SyntheticSource, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[spec.family]
    config = config_cls(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.init_std,
        # Untied, so a loader that drops lm_head shows up as a mismatch.
        tie_word_embeddings=False,
        dtype="float32",
        **SPECIAL_IDS,
    )
    # fork_rng: HF's own init draws from the global generator, which belongs to the caller.
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        model = model_cls(config).to(torch.float32)
        # Our own init rather than HF's, whose scheme varies between versions. Biases (qwen2's
        # q/k/v) are random rather than zero, so a loader that loses them shows up too.
        gen = torch.Generator().manual_seed(spec.seed)
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, spec.init_std, generator=gen)
    # save_file rather than save_pretrained: same file, minus a progress bar on every build.
    save_file(model.state_dict(), out / "model.safetensors", metadata={"format": "pt"})
    config.architectures = [model_cls.__name__]
    config.save_pretrained(out)
    GenerationConfig(**SPECIAL_IDS).save_pretrained(out)
