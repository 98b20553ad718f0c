"""Test setup: tests marked `gpu` need an sm_90 GPU and skip with the reason elsewhere; tests that
need the compiled extension skip on machines without CUDA when it is not built (on a GPU machine
a missing extension is an error, not a skip)."""
import pytest

from _util import EXT_SKIP, GPU_SKIP


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an sm_90 (Hopper) CUDA GPU and the built extension")
    config.addinivalue_line("markers", "ext: needs the built extension mxmoe._C (no GPU)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and GPU_SKIP:
            item.add_marker(pytest.mark.skip(reason=GPU_SKIP))
        elif ("gpu" in item.keywords or "ext" in item.keywords) and EXT_SKIP:
            item.add_marker(pytest.mark.skip(reason=EXT_SKIP))


def pytest_report_header(config):
    lines = []
    if GPU_SKIP:
        lines.append(f"mxmoe: GPU tests skipped: {GPU_SKIP}")
    if EXT_SKIP:
        lines.append(f"mxmoe: extension tests skipped: {EXT_SKIP}")
    return lines
