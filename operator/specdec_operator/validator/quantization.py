"""The precision a checkpoint's weights are stored in (from its quantization_config), and the label of a
free-form provenance value; the training pipeline records provenance with the same words."""

from __future__ import annotations

import re
from typing import Any

from .modelmeta import ModelMeta


def _bits_label(bits: Any, kind: str) -> str | None:
    if not isinstance(bits, int) or isinstance(bits, bool):
        return None
    if kind == "float":
        return {8: "fp8", 4: "fp4"}.get(bits)
    return {8: "int8", 4: "int4"}.get(bits)


_LABEL_BITS = {"fp4": 4, "int4": 4, "fp8": 8, "int8": 8, "bf16": 16}


def checkpoint_quantization(meta: ModelMeta) -> tuple[str | None, str]:
    """The precision the target checkpoint's weights are stored in: (label, how it was derived).

    label is bf16 | fp8 | int8 | int4 | fp4, or None when quantization_config names a method this
    validator does not know (the caller reports that rather than guessing).
    """
    qc = meta.quantization_config
    if qc is None and meta.hf_quant_config is not None:
        qc = meta.hf_quant_config.get("quantization", meta.hf_quant_config)
        if not isinstance(qc, dict):
            return None, "hf_quant_config.json has no quantization object"
        qc = dict(qc, quant_method=qc.get("quant_method", "modelopt"))
    if qc is None:
        return "bf16", "no quantization_config"
    method = str(qc.get("quant_method", "modelopt")).lower().replace("_", "-")
    if method == "compressed-tensors":
        fmt = str(qc.get("format", "")).lower()
        if "nvfp4" in fmt or "mxfp4" in fmt:
            return "fp4", f"compressed-tensors format {fmt}"
        labels = []
        groups = qc.get("config_groups") or {}
        if isinstance(groups, dict):
            for group in groups.values():
                weights = group.get("weights") if isinstance(group, dict) else None
                if isinstance(weights, dict):
                    label = _bits_label(weights.get("num_bits"), str(weights.get("type", "int")).lower())
                    if label:
                        labels.append(label)
        if labels:
            label = min(labels, key=lambda lbl: _LABEL_BITS[lbl])
            return label, f"compressed-tensors {label} weights"
        if "float-quantized" in fmt:
            return "fp8", "compressed-tensors float-quantized"
        return None, "compressed-tensors without recognizable config_groups weights"
    if method in ("awq", "awq-marlin", "gptq", "gptq-marlin", "moe-wna16", "auto-round", "autoround", "quark-int4"):
        bits = qc.get("bits", qc.get("w_bit", qc.get("weight_bits")))
        label = _bits_label(bits, "int")
        return (label, f"{method} bits={bits}") if label else (None, f"{method} with bits={bits}")
    if method in ("fp8", "fbgemm-fp8", "modelopt-fp8", "w8a8-fp8", "mxfp8", "ptpc-fp8"):
        return "fp8", method
    if method in ("mxfp4", "modelopt-fp4", "modelopt-mixed"):
        return "fp4", method
    if method in ("w8a8-int8", "w8a8", "qoq"):
        return "int8", method
    if method == "w4afp8":
        return "int4", method
    if method == "bitsandbytes":
        if qc.get("load_in_4bit"):
            return "int4", "bitsandbytes 4-bit"
        if qc.get("load_in_8bit"):
            return "int8", "bitsandbytes 8-bit"
        return None, "bitsandbytes without load_in_4bit/8bit"
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        if "FP4" in algo:
            return "fp4", f"modelopt {algo}"
        if algo in ("FP8", "MXFP8", "FP8_PER_CHANNEL_PER_TOKEN"):
            return "fp8", f"modelopt {algo}"
        if algo.startswith("W4A8") or algo == "MIXED_PRECISION":
            return "int4", f"modelopt {algo}"
        return None, f"modelopt quant_algo {algo or 'missing'}"
    return None, f"quant_method {method}"


_QUANT_WORDS = (
    ("fp4", re.compile(r"nvfp4|mxfp4|\bfp4|w4a4")),
    ("int4", re.compile(r"int4|w4a16|w4a8|awq|gptq|4[-_ ]?bit")),
    ("fp8", re.compile(r"fp8|float8|e4m3|w8a8[-_]?fp8")),
    ("int8", re.compile(r"int8|w8a8|8[-_ ]?bit")),
    ("bf16", re.compile(r"bf16|bfloat16|fp16|float16|\bnone\b|unquantized|full[- ]precision")),
)


def normalize_quantization(text: Any) -> str | None:
    """Map a free-form provenance value ('INT4 (compressed-tensors)', 'bfloat16', 'sglang-fp8') to a label."""
    if not isinstance(text, str):
        return None
    low = text.lower()
    for label, pattern in _QUANT_WORDS:
        if pattern.search(low):
            return label
    return None
