from __future__ import annotations

import shutil

import pytest

from tests.security.certs import Certs, make_certs
from tests.support import real_components_required


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    if shutil.which("openssl") is None:
        if real_components_required():
            pytest.fail("openssl required under CI (Makefile DEBS)")
        pytest.skip("openssl not installed")
    return make_certs(tmp_path_factory.mktemp("certs"))
