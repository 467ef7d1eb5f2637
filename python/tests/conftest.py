"""Skips loudly where the suite cannot run: each test module skips itself without torch, and the GPU
tests skip without a CUDA device."""

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; runs ranks through torch.multiprocessing.spawn")
    config.addinivalue_line("markers", "stress: longer runs left to `make stress` (make test runs -m 'not stress')")
    # pytest-xdist's own mark, registered here too for runs without it.
    config.addinivalue_line("markers", "xdist_group(name): tests that run in one xdist worker (--dist loadgroup)")


def pytest_collection_modifyitems(config, items):
    try:
        import torch
        have_gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    except ImportError:
        return  # the modules have skipped themselves
    if have_gpu:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible to torch: the epkit GPU tests need at least one "
                                   "(ranks share GPUs as rank % device_count)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
