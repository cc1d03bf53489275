"""Test harness: the `gpu` marker and `--require-gpu`, and knobs set for one test (`env`).

Without a CUDA device every `gpu` test is skipped with the reason; `--require-gpu` turns those
skips into failures, so a GPU run cannot pass by skipping.
"""

import pytest

from cortiq_drv import knobs


def pytest_addoption(parser):
    parser.addoption("--require-gpu", action="store_true", default=False,
                     help="fail (instead of skip) gpu tests when no CUDA device is usable")


def _device_reason():
    from cortiq_drv.cu.ctx import device_available

    return device_available()


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if it.get_closest_marker("gpu")]
    if not gpu_items:
        return
    ok, reason = _device_reason()
    if ok:
        return
    if config.getoption("--require-gpu"):
        config._cortiq_no_gpu_reason = reason
        for it in gpu_items:
            it.add_marker(pytest.mark.usefixtures("_gpu_required"))
    else:
        skip = pytest.mark.skip(reason=f"no CUDA device: {reason}")
        for it in gpu_items:
            it.add_marker(skip)


@pytest.fixture
def _gpu_required(request):
    pytest.fail(f"--require-gpu: no CUDA device: {request.config._cortiq_no_gpu_reason}")


@pytest.fixture
def env(monkeypatch):
    """Set knobs for one test: env(NAME=value, ...), None unsetting one (knobs re-read then, and
    again after)."""

    def set_(**kv):
        for k, v in kv.items():
            if v is None:
                monkeypatch.delenv(k, raising=False)
            else:
                monkeypatch.setenv(k, str(v))
        knobs.reset()

    yield set_
    monkeypatch.undo()
    knobs.reset()
