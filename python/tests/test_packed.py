"""The expert-packed dispatch layout through the idiomatic API (docs/ARCHITECTURE.md, "Expert-major layouts"): host-side config checks, and
GPU runs at W = 1 and 2 (ranks share GPUs as rank % device_count) in both alignments, fused, split,
with m on the device, and inside a CUDA graph replayed for changing m.

Packed outputs: expert_x [R, H]; expert e's rows are expert_x[offsets[e]:offsets[e] + counts[e]],
offsets[0] = 0, offsets[e + 1] = offsets[e] + align_up(tokens of e, packed_row_align) (clamped to R).
"""

import pytest

pytest.importorskip("torch", reason="epkit's Python tests need torch")
epkit = pytest.importorskip("epkit", reason="epkit is not installed: pip install --no-build-isolation --no-deps .",
                            exc_type=ImportError)
import dataclasses  # noqa: E402


def _config(*args, **kw):
    from _packed_cases import config
    return config(*args, **kw)


def test_packed_config_host_side():
    cfg = _config(2, 1, "fp8", 1)
    cfg.validate()
    assert cfg.packed
    # M * (W / D) * min(K, L) = 24 * 2 * 3 rows can arrive; with 16-row alignment each of the 8
    # local experts may pad its block.
    assert cfg.effective_packed_rows == 24 * 2 * 3
    aligned = _config(2, 1, "fp8", 16)
    assert aligned.effective_packed_rows == aligned.to_cpp().packed_row_bound()
    assert aligned.effective_packed_rows % 16 == 0
    assert _config(2, 1, "fp8", 1, packed_rows=60).effective_packed_rows == 60
    with pytest.raises(epkit.EpkitError, match="capacity = 8 applies to layout = masked only"):
        _config(2, 1, "fp8", 1, capacity=8).validate()
    with pytest.raises(epkit.EpkitError, match="must be a multiple of packed_row_align = 16"):
        _config(2, 1, "fp8", 16, packed_rows=40).validate()
    with pytest.raises(epkit.EpkitError, match="layout"):
        dataclasses.replace(cfg, layout="ragged").to_cpp()
    masked = epkit.AllToAllConfig(num_experts=8, topk=2, hidden=256, max_tokens_per_rank=4,
                                  world_size=2, rank=0)
    assert not masked.packed and masked.to_cpp().layout == epkit.ExpertLayout.masked
    with pytest.raises(epkit.EpkitError, match="apply to layout = packed only"):
        epkit.AllToAllConfig(num_experts=8, topk=2, hidden=256, max_tokens_per_rank=4, world_size=2,
                             rank=0, packed_rows=8).validate()


# GPU: bodies in _packed_cases.py (spawned ranks import them from there).


@pytest.mark.gpu
@pytest.mark.parametrize("world_size,dp_size", [(1, 1), (2, 1), (2, 2)])
def test_packed_dispatch_combine(world_size, dp_size):
    from _harness import run_ranks
    from _packed_cases import packed_rounds
    run_ranks(packed_rounds, world_size, dp_size, ["fp8", "bf16"], [1, 128])


@pytest.mark.gpu
@pytest.mark.parametrize("world_size,dp_size", [(1, 1), (2, 2)])
def test_packed_cuda_graph(world_size, dp_size):
    from _harness import run_ranks
    from _packed_cases import packed_graph
    run_ranks(packed_graph, world_size, dp_size)
