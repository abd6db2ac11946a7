"""A cluster run over mutual TLS (issue 28, item 3): real certificates, a real ``LocalCluster``.

The scheduler and both workers run with Dask's ``Security`` (TLS only, encryption required, peers
verified against the deployment's CA). The service, given ``DASK_TLS_*`` files signed by that CA,
trains and publishes, charged once; a client whose certificate another CA signed is refused at the
handshake, before the private read (refunded). Needs the optional ``dask`` extra and ``openssl``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from app.services.training import runner
from tests.integration.platform_helpers import make_settings
from tests.integration.test_dask_training import _kinds, _published, _run, _start, seeded  # noqa: F401 - a fixture

distributed = pytest.importorskip("distributed", reason="the optional 'dask' extra is not installed")

pytestmark = pytest.mark.integration


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _authority(directory: Path, name: str) -> dict[str, Path]:
    """A CA and one certificate it signed (the files of a deployment's mutual TLS)."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make the test's certificates")
    directory.mkdir()
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
             "-subj", f"/CN={name}-ca", cwd=directory)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out", "node.csr", "-subj",
             f"/CN={name}-node", cwd=directory)
    _openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
             "node.pem", "-days", "2", cwd=directory)
    return {"ca": directory / "ca.pem", "cert": directory / "node.pem", "key": directory / "node.key"}


@pytest.fixture(scope="module")
def authorities(tmp_path_factory):
    root = tmp_path_factory.mktemp("tls")
    return _authority(root / "deployment", "privrec"), _authority(root / "other", "other")


@pytest.fixture
def tls_cluster(authorities):
    files = authorities[0]
    security = distributed.Security(
        tls_ca_file=str(files["ca"]), tls_scheduler_cert=str(files["cert"]), tls_scheduler_key=str(files["key"]),
        tls_worker_cert=str(files["cert"]), tls_worker_key=str(files["key"]), tls_client_cert=str(files["cert"]),
        tls_client_key=str(files["key"]), require_encryption=True)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  protocol="tls://", host="127.0.0.1", security=security) as local:
        yield local


def _settings(tmp_path, url: str, address: str, files: dict[str, Path]):
    return make_settings(tmp_path, url, dask_scheduler_address=address, dask_tls_ca_file=files["ca"],
                         dask_tls_cert_file=files["cert"], dask_tls_key_file=files["key"], dask_connect_timeout_s=5.0)


def test_a_run_over_mutual_tls_publishes_charged_once(seeded, tls_cluster, authorities, tmp_path):  # noqa: F811
    assert tls_cluster.scheduler_address.startswith("tls://")
    run_id = _start(seeded)
    settings = _settings(tmp_path, seeded, tls_cluster.scheduler_address, authorities[0])
    assert runner.run_training(run_id, url=seeded, settings=settings) == "succeeded"
    assert _published(seeded, run_id) is not None and _kinds(seeded, run_id) == ["reservation", "commit"]
    assert "read_task" in tls_cluster.scheduler.task_prefixes  # the workers read the partitions


def test_a_client_another_authority_signed_is_refused_before_the_read(seeded, tls_cluster, authorities,  # noqa: F811
                                                                      tmp_path):
    run_id = _start(seeded)
    settings = _settings(tmp_path, seeded, tls_cluster.scheduler_address, authorities[1])
    assert runner.run_training(run_id, url=seeded, settings=settings) == "failed"
    run = _run(seeded, run_id)
    assert not run.private_data_read and run.refunded
    assert _kinds(seeded, run_id) == ["reservation", "refund"]
