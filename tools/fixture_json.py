"""Deterministic, compact JSON for reference files.

Floats are written with the shortest decimal text that parses back to the same float32
(numpy's Dragon4 "unique" mode), so a reader that parses each number as f32 gets exactly the
value torch produced, and the files stay small. Lists of numbers are written on one line;
objects are indented so that the files remain readable and diff well.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import torch


def f32_list(tensor: torch.Tensor) -> list[np.float32]:
    """A flat list of float32 scalars (so that `dumps` formats them as float32)."""
    array = tensor.detach().to(torch.float32).cpu().contiguous().numpy().reshape(-1)
    return [np.float32(x) for x in array]


def int_list(tensor: torch.Tensor | list[int]) -> list[int]:
    if isinstance(tensor, torch.Tensor):
        return [int(x) for x in tensor.detach().cpu().reshape(-1).tolist()]
    return [int(x) for x in tensor]


def _format_float(value: float | np.floating) -> str:
    as_f32 = np.float32(value)
    if not math.isfinite(float(as_f32)):
        raise ValueError(f"non-finite value {value!r} cannot be written as JSON")
    text = np.format_float_positional(as_f32, unique=True, trim="-")
    if len(text) > 14:
        text = np.format_float_scientific(as_f32, unique=True, trim="-")
    return text


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str, np.integer, np.floating))


def _scalar(value: Any) -> str:
    if value is None or isinstance(value, (bool, str)):
        return json.dumps(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return _format_float(value)


def dumps(value: Any, indent: int = 0) -> str:
    pad = "  " * (indent + 1)
    if _is_scalar(value):
        return _scalar(value)
    if isinstance(value, dict):
        if not value:
            return "{}"
        items = [f"{pad}{json.dumps(str(k))}: {dumps(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(value, (list, tuple)):
        if all(_is_scalar(v) for v in value):
            return "[" + ",".join(_scalar(v) for v in value) + "]"
        items = [pad + dumps(v, indent + 1) for v in value]
        return "[\n" + ",\n".join(items) + "\n" + "  " * indent + "]"
    raise TypeError(f"cannot serialise {type(value).__name__}")


def write(path, value: Any) -> None:
    text = dumps(value) + "\n"
    json.loads(text)  # fail here rather than in the Rust tests if the text is not valid JSON
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)
