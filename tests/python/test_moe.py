"""strata.moe (MoeBuffer / MoeDispatch bindings) on 2 ranks started by strata run (R = 1 and the full matrix: tests/moe)."""

import pytest

from conftest import launch


@pytest.mark.parametrize("n", [2])
def test_moe_dispatch_combine(n):
    launch("moe.py", n, timeout=120)
