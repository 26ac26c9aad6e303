"""The numeric libraries' thread pools, sized by `--compute-threads`."""

from __future__ import annotations

from collections.abc import Iterator

import faiss  # noqa: F401  (loads faiss's OpenMP and BLAS, as the server does)
import numpy  # noqa: F401  (loads numpy's BLAS)
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from providers.compute import limit_compute_threads


@pytest.fixture
def restored() -> Iterator[None]:
    with threadpool_limits(limits=None):  # puts every pool back as it was afterwards
        yield


def test_every_loaded_pool_is_sized(restored: None) -> None:
    sizes = limit_compute_threads(1)
    apis = {pool["internal_api"] for pool in threadpool_info()}
    assert "openblas" in apis and "openmp" in apis  # numpy's and faiss's pools are reached
    assert sizes and set(sizes.values()) == {1}
    assert {pool["num_threads"] for pool in threadpool_info()} == {1}


def test_zero_threads_is_refused(restored: None) -> None:
    before = {pool["filepath"]: pool["num_threads"] for pool in threadpool_info()}
    with pytest.raises(ValueError, match="at least 1"):
        limit_compute_threads(0)
    assert {pool["filepath"]: pool["num_threads"] for pool in threadpool_info()} == before
