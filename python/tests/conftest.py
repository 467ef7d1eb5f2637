"""Skips the suite loudly where it cannot run: no torch, or (for GPU tests) no CUDA device."""

import pytest

torch = pytest.importorskip("torch", reason="epkit's Python tests need torch (pip install torch)")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible to torch: the epkit GPU tests need at least one "
                                   "(ranks share GPUs as rank % device_count)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; runs ranks through torch.multiprocessing.spawn")
