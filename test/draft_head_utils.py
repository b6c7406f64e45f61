"""Multi-token-prediction tensors added to a tiny transformers checkpoint: transformers writes
the models without them, real DeepSeek-V3 and Qwen3-Next checkpoints carry them."""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file


def add_to_checkpoint(folder: str, tensors: dict[str, torch.Tensor]) -> None:
    """Adds `tensors` to the folder's single model.safetensors."""
    path = f"{folder}/model.safetensors"
    state = load_file(path)
    assert not set(state) & set(tensors)
    state.update({name: t.contiguous() for name, t in tensors.items()})
    save_file(state, path, metadata={"format": "pt"})


def _random_like(tensors: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(t.shape, generator=gen) * 0.1 for name, t in tensors.items()}


def _saved_layer(folder: str, source: str, dest: str) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors under `source` (as saved: per-expert names), renamed under `dest`."""
    state = load_file(f"{folder}/model.safetensors")
    return {dest + k[len(source):]: v for k, v in state.items() if k.startswith(source)}


def deepseek_nextn_tensors(folder: str, cfg, seed: int = 2) -> dict[str, torch.Tensor]:
    """NextN module 0 for the DeepseekV3ForCausalLM checkpoint in `folder` (config `cfg`):
    `model.layers.{L}.` with a decoder layer shaped as the last one, enorm, hnorm, eh_proj,
    shared_head (norm and head) and embed_tokens; random values."""
    last, nextn = f"model.layers.{cfg.num_hidden_layers - 1}.", f"model.layers.{cfg.num_hidden_layers}."
    decoder = _saved_layer(folder, last, nextn)
    hidden, vocab = cfg.hidden_size, cfg.vocab_size
    own = {nextn + "enorm.weight": torch.empty(hidden), nextn + "hnorm.weight": torch.empty(hidden),
           nextn + "eh_proj.weight": torch.empty(hidden, 2 * hidden), nextn + "shared_head.norm.weight": torch.empty(hidden),
           nextn + "embed_tokens.weight": torch.empty(vocab, hidden), nextn + "shared_head.head.weight": torch.empty(vocab, hidden)}
    return _random_like({**decoder, **own}, seed)


def qwen3_next_mtp_tensors(folder: str, cfg, seed: int = 2) -> dict[str, torch.Tensor]:
    """Qwen3-Next's `mtp.*` for the checkpoint in `folder` (config `cfg`): fc, the two pre-fc
    norms, one full-attention decoder layer shaped as the first full-attention layer (which must
    have the MLP kind of layer 0), and the final norm; random values."""
    first_full = cfg.layer_types.index("full_attention")
    layer = _saved_layer(folder, f"model.layers.{first_full}.", "mtp.layers.0.")
    hidden = cfg.hidden_size
    own = {"mtp.fc.weight": torch.empty(hidden, 2 * hidden), "mtp.pre_fc_norm_embedding.weight": torch.empty(hidden),
           "mtp.pre_fc_norm_hidden.weight": torch.empty(hidden), "mtp.norm.weight": torch.empty(hidden)}
    return _random_like({**layer, **own}, seed)
