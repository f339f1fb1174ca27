"""What every package's suite shares when run from this repository: one torch thread per pytest-xdist worker."""

import os

import torch


def pytest_configure(config) -> None:
    # Each xdist worker is its own process; with torch's default of a thread per core their thread pools fight over
    # the same cores, and on a 2-core machine the suite ran three times slower than with no workers at all.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)
