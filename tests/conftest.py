import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A test CA and a server certificate for localhost/127.0.0.1 (trustme),
    as PEM files: ``{"ca", "cert", "key"}``. test_tls.py has its own, with
    client certificates."""
    trustme = pytest.importorskip("trustme")
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    paths = {"ca": str(d / "ca.pem"), "cert": str(d / "cert.pem"), "key": str(d / "key.pem")}
    ca.cert_pem.write_to_path(paths["ca"])
    cert.cert_chain_pems[0].write_to_path(paths["cert"])
    for blob in cert.cert_chain_pems[1:]:
        blob.write_to_path(paths["cert"], append=True)
    cert.private_key_pem.write_to_path(paths["key"])
    return paths
