import pytest

from rstar2.reward import VerifierPool


@pytest.fixture(scope="session")
def verifier():
    """Two checking processes shared by the reward tests (the CAS under a 10 s time box:
    generous because this 2-core CI machine is shared; the time box itself is tested apart)."""
    with VerifierPool(2, timeout_s=10.0) as pool:
        yield pool
