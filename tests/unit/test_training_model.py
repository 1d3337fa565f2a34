"""The draft network, layer conventions, INT4 RTN and the SGLang capture protocol (no pipeline)."""

from __future__ import annotations

import pytest
import torch

from drafter_training.capture import decode_hidden, encode_hidden, parse_sglang_capture
from drafter_training.model import DraftConfig, Eagle3Draft, StepCache
from drafter_training.target import (
    check_capture_layers,
    default_capture_layers,
    parse_quantization,
    rtn_quantize_,
)
from drafter_training.train import shifted, simulated_acceptance
from drafter_training.vocab import build_mapping
from specdec_operator.errors import InputError


def tiny_draft(seed: int = 0) -> Eagle3Draft:
    torch.manual_seed(seed)
    cfg = DraftConfig(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=50,
        draft_vocab_size=40,
        target_hidden_size=24,
        aux_layer_ids=[0, 1, 2],
    )
    model = Eagle3Draft(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    counts = torch.arange(50, 0, -1)
    d2t, t2d, _ = build_mapping(counts, 40)
    model.set_vocab_mapping(d2t, t2d)
    return model.eval()


def test_unrolled_training_attention_equals_the_chain_the_server_runs():
    """Step k of the TTT unroll at row t must compute exactly what a topk-1 chain of depth k computes after
    the prefix ending at t+1: prefix keys from step 0 over target features, then the chain's own keys."""
    model = tiny_draft()
    T, steps = 9, 4
    ids = torch.randint(0, 50, (1, T + steps))
    aux = torch.randn(1, T, 72, dtype=torch.float64)
    positions = torch.arange(T)[None]
    step_inputs = [ids[:, 1 + k : 1 + k + T] for k in range(steps)]
    with torch.no_grad():
        unrolled = model.unroll(aux, step_inputs, positions)
        for t in range(T):
            cache = StepCache()
            logits, hidden = model.step(aux[:, : t + 1], ids[:, 1 : t + 2], positions[:, : t + 1], cache)
            # Same computation, different kernel shapes: equal to float rounding (torch 2.15 differs by 1.4e-7).
            torch.testing.assert_close(logits[0, -1], unrolled[0][0, t], rtol=1e-5, atol=1e-6)
            row = torch.tensor([t])
            for k in range(1, steps):
                logits, hidden = model.step(hidden[:, -1:], ids[:, t + 1 + k : t + 2 + k], (row + k)[None], cache, query_rows=row)
                torch.testing.assert_close(logits[0, -1], unrolled[k][0, t], rtol=1e-5, atol=1e-6)


def test_step_zero_is_causal_and_later_steps_see_their_own_chain():
    model = tiny_draft(1)
    ids = torch.randint(0, 50, (1, 12))
    aux = torch.randn(1, 10, 72, dtype=torch.float64)
    pos = torch.arange(10)[None]
    with torch.no_grad():
        a = model.unroll(aux, [ids[:, 1:11], ids[:, 2:12]], pos)
        aux2 = aux.clone()
        aux2[:, 6:] += 1.0
        b = model.unroll(aux2, [ids[:, 1:11], ids[:, 2:12]], pos)
    torch.testing.assert_close(a[0][:, :6], b[0][:, :6])
    torch.testing.assert_close(a[1][:, :6], b[1][:, :6])
    assert not torch.allclose(a[1][:, 6:], b[1][:, 6:])


def test_parameter_names_are_sglangs_checkpoint_names():
    names = set(tiny_draft().state_dict())
    for name in (
        "fc.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        "midlayer.hidden_norm.weight",
        "midlayer.input_layernorm.weight",
        "midlayer.post_attention_layernorm.weight",
        "midlayer.self_attn.q_proj.weight",
        "midlayer.mlp.gate_proj.weight",
    ):
        assert name in names
    m = tiny_draft()
    assert m.midlayer.self_attn.q_proj.weight.shape == (32, 64)  # 2 * hidden inputs
    assert m.fc.weight.shape == (32, 72)  # 3 * target_hidden


def test_capture_layer_conventions():
    assert default_capture_layers(32) == [1, 15, 28]  # SGLang config / SpecForge output index
    assert [i + 1 for i in default_capture_layers(32)] == [2, 16, 29]  # SGLang's captured layer inputs
    assert default_capture_layers(61) == [1, 29, 57]
    assert check_capture_layers([0, 1, 2], 4) == [0, 1, 2]
    with pytest.raises(InputError, match="--capture-layers"):
        check_capture_layers(default_capture_layers(4), 4)
    with pytest.raises(InputError, match="0..2"):
        check_capture_layers([0, 1, 3], 4)  # the last layer's output is never captured by SGLang


def test_rtn_int4_group_quantisation():
    torch.manual_seed(0)
    w = torch.randn(8, 256)
    ref = w.clone()
    rtn_quantize_(w, 4, 128)
    for g in range(2):
        block, orig = w[:, g * 128 : (g + 1) * 128], ref[:, g * 128 : (g + 1) * 128]
        for r in range(8):
            assert block[r].unique().numel() <= 16
            step = (orig[r].max() - orig[r].min()) / 15
            assert (block[r] - orig[r]).abs().max() <= step / 2 + 1e-5
    again = w.clone()
    rtn_quantize_(again, 4, 128)
    torch.testing.assert_close(again, w, atol=1e-5, rtol=0)
    assert parse_quantization("int4-rtn-g64") == ("int4-rtn", 64)
    assert parse_quantization("int3-rtn") == ("int3-rtn", 128)
    with pytest.raises(InputError, match="--quantization"):
        parse_quantization("int3")
    w3 = torch.randn(4, 128)
    rtn_quantize_(w3, 3, 128)
    assert all(row.unique().numel() <= 8 for row in w3)


def test_fp8_storage_round_trip():
    torch.manual_seed(0)
    x = torch.randn(20, 96) * torch.tensor([1.0, 50.0, 0.01]).repeat_interleave(32)
    enc = encode_hidden(x, "fp8", 3)
    assert enc[""].dtype == torch.float8_e4m3fn and enc["_scale"].shape == (20, 3)
    back = decode_hidden(enc, 3)
    rel = ((back - x).abs() / x.abs().reshape(20, 3, 32).amax(-1).repeat_interleave(32, -1)).max()
    assert rel < 0.07  # e4m3 keeps 3 mantissa bits, scaled per token and layer


def test_parse_sglang_capture_aligns_logprobs_to_positions():
    hidden = [[float(t)] * 6 for t in range(3)]
    top = lambda a, b: [[-0.1, a, None], [-2.5, b, None]]  # noqa: E731
    response = {"meta_info": {"hidden_states": [hidden], "input_top_logprobs": [None, top(7, 8), top(9, 1)], "output_top_logprobs": [top(4, 5)]}}
    parsed = parse_sglang_capture(response, 3, 2)
    assert parsed["aux"].shape == (3, 6)
    # position t's next-token distribution: input_top_logprobs[t+1], then output_top_logprobs[0]
    assert parsed["topk_ids"][:, 0].tolist() == [7, 9, 4]
    with pytest.raises(InputError, match="--disable-radix-cache"):
        parse_sglang_capture(response, 5, 2)
    with pytest.raises(InputError, match="--enable-return-aux-hidden-states"):
        parse_sglang_capture({"meta_info": {}}, 3, 2)


def test_vocab_mapping_pads_and_maps_back():
    counts = torch.zeros(100, dtype=torch.int64)
    counts[torch.tensor([5, 50, 7, 99])] = torch.tensor([10, 3, 8, 1])
    d2t, t2d, stats = build_mapping(counts, 6)
    targets = d2t + torch.arange(6)
    assert targets.tolist() == sorted(targets.tolist())
    assert {5, 7, 50, 99} <= set(targets.tolist())
    assert stats["padded_with_unused"] == 2 and stats["coverage"] == 1.0
    assert t2d.sum() == 6 and t2d[targets].all()
    d2t, t2d, stats = build_mapping(counts, 2)  # the two most frequent only
    assert (d2t + torch.arange(2)).tolist() == [5, 7]
    assert stats["coverage"] == pytest.approx(18 / 22)


def test_shift_and_simulated_acceptance():
    x = torch.arange(6)[None]
    assert shifted(x, 2).tolist() == [[2, 3, 4, 5, 0, 0]]
    assert simulated_acceptance([1.0, 1.0, 1.0]) == 4.0
    assert simulated_acceptance([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert simulated_acceptance([0.9, 0.8, 0.7, 0.6], steps=3) == pytest.approx(1 + 0.9 + 0.72 + 0.504)
