"""Writing a fixture checkpoint, reading it back the way every reference is computed (eager
attention, float32), and the provenance each reference.json records about that."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
import transformers
from torch import nn


def rewrite_config_to_legacy_geometry(directory: Path, text_spec: dict) -> None:
    """Replace the `per_layer_config` that 5.23 writes by the older top-level keys
    `global_head_dim` / `num_global_key_value_heads`, which HF still accepts on load."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    text = config.get("text_config", config)
    text.pop("per_layer_config", None)
    text["global_head_dim"] = text_spec["global_head_dim"]
    text["num_global_key_value_heads"] = text_spec["num_global_key_value_heads"]
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_checkpoint(model: nn.Module, directory: Path, spec: dict) -> None:
    if directory.exists():
        shutil.rmtree(directory)
    kwargs = {}
    if spec.get("max_shard_size"):
        kwargs["max_shard_size"] = spec["max_shard_size"]
    model.save_pretrained(directory, **kwargs)
    if spec["config_form"] == "legacy":
        rewrite_config_to_legacy_geometry(directory, spec["text"])


def load_checkpoint(model_class, directory: Path, **kwargs) -> nn.Module:
    model = model_class.from_pretrained(directory, attn_implementation="eager", **kwargs)
    return model.float().eval()


def assert_same_weights(saved: nn.Module, loaded: nn.Module) -> None:
    saved_state = saved.state_dict()
    loaded_state = loaded.state_dict()
    if saved_state.keys() != loaded_state.keys():
        raise AssertionError(f"state dict keys differ: {saved_state.keys() ^ loaded_state.keys()}")
    for key, tensor in saved_state.items():
        if not torch.equal(tensor.float(), loaded_state[key].float()):
            raise AssertionError(f"{key} changed in the save/load round trip")


def checkpoint_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name != "reference.json")


def versions(dtype: torch.dtype, computed_in: str, moe: bool = False) -> dict:
    result = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "checkpoint_dtype": str(dtype).removeprefix("torch."),
        "compute_dtype": "float32",
        "computed_in": computed_in,
        "attn_implementation": "eager",
    }
    if moe:
        result["experts_implementation"] = "eager"
    result["torch_threads"] = torch.get_num_threads()
    return result
