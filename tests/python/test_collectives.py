"""Every binding of strata.Communicator against numpy references, heap and external arrays,
at world sizes 1, 2 and 4, ranks started by the real launcher (strata run)."""

import pytest

from conftest import launch


@pytest.mark.parametrize("n", [1, 2, 4])
def test_collectives_match_numpy(n):
    launch("collectives.py", n, timeout=240)
