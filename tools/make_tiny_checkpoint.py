"""Build real tiny Hugging Face checkpoints of the registered families, exactly as users have them.

    python tools/make_tiny_checkpoint.py tiny-qwen3.5 out/tiny-qwen3.5
    python tools/make_tiny_checkpoint.py tiny-qwen3 out/tiny-qwen3

The model comes from transformers' own classes (Qwen3_5ForConditionalGeneration / Qwen3ForCausalLM)
with random weights, cast to bf16 and written by `save_pretrained` as sharded safetensors + index.
The MTP weights transformers does not model are added under the names real checkpoints use
(`mtp.*`, shapes from the registry), into the last shard. A small byte-level BPE tokenizer with
Qwen's special tokens is trained locally with `tokenizers`; the chat template is the one the
family's real checkpoints ship (tools/fixtures/). Configs come from the registry's test-only entries, so the fixtures always
satisfy the same closed-set checks as the real models.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ninfer_format.rules import expand
from ninfer_registry import RegistryEntry, load

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
                  "<|video_pad|>"]
_WORDS = ("the model reads a long prompt and writes code def return import class self value list dict for in if "
          "else while function call tool result file path error test assert print json string number true false "
          "agent user assistant system request response token cache prefix decode prefill kernel tensor layer").split()


def _corpus(lines: int = 4000) -> list[str]:
    state, out = 12345, []
    for i in range(lines):
        words = []
        for _ in range(6 + i % 9):
            state = (1103515245 * state + 12345) & 0x7FFFFFFF
            words.append(_WORDS[state % len(_WORDS)])
        out.append(" ".join(words) + (f" {i} = {i * 7 % 97};" if i % 3 == 0 else "."))
    return out


# The chat template each family's checkpoints ship (Qwen3.5: XML tool calls; Qwen3: JSON tool calls).
CHAT_TEMPLATES = {"qwen3_5_hybrid": "qwen3_5_chat_template.jinja", "qwen3_dense": "qwen3_chat_template.jinja"}


def train_tokenizer(vocab_size: int, out_dir: Path, chat_template: str) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 4096, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None, "clean_up_tokenization_spaces": False,
    }, indent=2))
    (out_dir / "chat_template.jinja").write_text((FIXTURES / chat_template).read_text())


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights that make a tiny model's logits informative: fan-in scaled linears, norms perturbed around
    their family's default (ones for Qwen3's `x * w`, zeros for Qwen3.5's `x * (1 + w)`), so logits are
    well separated and greedy decoding is not decided by float rounding."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
            elif name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2.0)
            else:
                p.add_(torch.randn(p.shape, generator=g) * 0.1)


def _hf_model(entry: RegistryEntry):
    import transformers

    cfg = entry.expected_config()
    if entry.family == "qwen3_5_hybrid":
        top = {k: v for k, v in cfg.items() if not isinstance(v, dict)}
        top.pop("model_type")
        config = transformers.Qwen3_5Config(text_config=cfg["text_config"], vision_config=cfg["vision_config"], **top)
        config.text_config.output_gate_type = "swish"
        return transformers.Qwen3_5ForConditionalGeneration(config)
    if entry.family == "qwen3_dense":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**{k: v for k, v in cfg.items() if k != "model_type"}))
    raise ValueError(f"no tiny builder for family {entry.family}")


def _add_mtp(entry: RegistryEntry, out_dir: Path, seed: int) -> None:
    config = json.loads((out_dir / "config.json").read_text())
    mtp = {n: t for n, t in expand(entry.resolved, config, ("mtp",)).items()}
    if not mtp:
        return
    g = torch.Generator().manual_seed(seed + 1)
    index_path = out_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    last = sorted(set(index["weight_map"].values()))[-1]
    tensors = load_file(out_dir / last)
    for name, t in mtp.items():
        scale = 1 / math.sqrt(t.shape[1]) if len(t.shape) == 2 else 0.1
        tensors[name] = (torch.randn(t.shape, generator=g) * scale).to(torch.bfloat16)
        index["weight_map"][name] = last
    save_file(tensors, out_dir / last, metadata={"format": "pt"})
    index["metadata"]["total_size"] = sum(
        sum(v.numel() * v.element_size() for v in load_file(out_dir / s).values()) for s in set(index["weight_map"].values()))
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True))


def build(model_id: str, out_dir: Path, seed: int = 0, max_shard_size: str = "200KB") -> Path:
    entry = load(model_id)
    if not entry.test_only:
        raise ValueError(f"{model_id} is a real model; tiny checkpoints are built for test-only entries")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = _hf_model(entry)
    _randomize(model, seed)
    model.to(torch.bfloat16).save_pretrained(out_dir, max_shard_size=max_shard_size)
    if not (out_dir / "model.safetensors.index.json").exists():
        raise RuntimeError("expected a sharded checkpoint; lower max_shard_size")
    _add_mtp(entry, out_dir, seed)
    vocab = entry.expected_config().get("text_config", entry.expected_config())["vocab_size"]
    train_tokenizer(vocab, out_dir, CHAT_TEMPLATES[entry.family])
    if "vision_config" in entry.expected_config():
        write_image_processor(entry, out_dir)
    return out_dir


def write_image_processor(entry: RegistryEntry, out_dir: Path) -> None:
    """preprocessor_config.json as transformers writes it for Qwen3.5 (Qwen2-VL's processor), sized small."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    v = entry.expected_config()["vision_config"]
    side = v["patch_size"] * v["spatial_merge_size"]
    Qwen2VLImageProcessorPil(size={"shortest_edge": (2 * side) ** 2, "longest_edge": (8 * side) ** 2},
                             patch_size=v["patch_size"], temporal_patch_size=v["temporal_patch_size"],
                             merge_size=v["spatial_merge_size"], image_mean=[0.5, 0.5, 0.5],
                             image_std=[0.5, 0.5, 0.5]).save_pretrained(out_dir)


def _nvfp4_groups(entry: RegistryEntry, config: dict) -> list[list[str]]:
    """The tensors the nvfp4 profile quantizes, grouped as the runtime fuses them (one global scale each)."""
    from ninfer_registry import scheme_classes

    classes = scheme_classes(entry, "nvfp4")
    groups: dict[tuple, list[str]] = {}
    for name, t in expand(entry.resolved, config, entry.available_parts).items():
        if classes[t.tensor_class]["kind"] == "nvfp4":
            groups.setdefault((t.part, t.layer, t.fuse) if t.fuse else (name,), []).append(name)
    return list(groups.values())


def _compressed_tensors_nvfp4(group: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    """compressed-tensors' own NVFP4 (W4A16) math and compressor, one global scale for the group."""
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    args = QuantizationArgs(num_bits=4, type="float", strategy="tensor_group", symmetric=True, group_size=16,
                            scale_dtype=torch.float8_e4m3fn)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    both = torch.cat([w.float().reshape(-1) for w in group.values()])
    gs = generate_gparam(both.amin(), both.amax())  # float32 statistics (shared/formats.md pitfall)
    out = {}
    for name, w in group.items():
        g = w.float().unflatten(-1, (w.shape[-1] // 16, 16))
        scale, _ = calculate_qparams(g.amin(-1), g.amax(-1), args, global_scale=gs)
        sd = NVFP4PackedCompressor.compress({"weight": w, "weight_scale": scale, "weight_global_scale": gs}, scheme)
        module = name.removesuffix(".weight")
        out.update({f"{module}.{k}": v for k, v in sd.items()})
    return out, args.model_dump(mode="json")


def _modelopt_nvfp4(group: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """NVIDIA ModelOpt's quantizer, with the names its HF export writes (and an input scale it adds for W4A4)."""
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor

    s2 = torch.cat([w.float().reshape(-1) for w in group.values()]).abs().amax() / (6.0 * 448.0)
    out = {}
    for name, w in group.items():
        qt, s8, s2_out = NVFP4QTensor.quantize(w, 16, weights_scaling_factor_2=s2)
        module = name.removesuffix(".weight")
        out.update({f"{module}.weight": qt._quantized_data, f"{module}.weight_scale": s8,
                    f"{module}.weight_scale_2": s2_out.float().reshape(()), f"{module}.input_scale": torch.ones(())})
    return out


def prequantize(model_id: str, src: Path, out_dir: Path, fmt: str) -> Path:
    """Copy a tiny bf16 checkpoint as an NVFP4 checkpoint made by `fmt` ("compressed-tensors" or
    "modelopt"): the library's own quantizer makes the bytes; fused tensors share a global scale."""
    entry = load(model_id)
    out_dir = Path(out_dir)
    shutil.copytree(src, out_dir)
    config = json.loads((out_dir / "config.json").read_text())
    index_path = out_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = {s: load_file(out_dir / s) for s in set(index["weight_map"].values())}
    quantized, targets, args = {}, [], None
    for names in _nvfp4_groups(entry, config):
        group = {n: shards[index["weight_map"][n]].pop(n) for n in names}
        if fmt == "compressed-tensors":
            parts, args = _compressed_tensors_nvfp4(group)
        else:
            parts = _modelopt_nvfp4(group)
        for key in parts:
            quantized[key] = index["weight_map"][names[0]]
        for n in names:
            index["weight_map"].pop(n)
        for key, value in parts.items():
            shards[quantized[key]][key] = value.clone()
        targets += [n.removesuffix(".weight") for n in names]
    index["weight_map"].update(quantized)
    for shard, tensors in shards.items():
        save_file(tensors, out_dir / shard, metadata={"format": "pt"})
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True))
    if fmt == "compressed-tensors":
        config["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": {"targets": sorted(targets), "weights": args, "format": "nvfp4-pack-quantized"}},
            "ignore": []}
    else:
        quant = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": []}
        config["quantization_config"] = {"quant_method": "modelopt", **quant}
        (out_dir / "hf_quant_config.json").write_text(json.dumps(
            {"producer": {"name": "modelopt", "version": "0.47.0"}, "quantization": quant}, indent=2))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    return out_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_id", help="a test-only registry id, e.g. tiny-qwen3.5")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(args.model_id, args.out_dir, args.seed))


if __name__ == "__main__":
    main()
