"""Where Spark's checkpoint of an ``az://`` job directory goes (``abfss://`` on the
account's DFS host) and the ABFS settings derived from the Azure storage options: Azure
itself, an emulator over TLS and over plain HTTP. No request is made and no Spark runs
(the real run against Azurite is tests/spark/test_abfs_checkpoint.py)."""

from __future__ import annotations

import pytest

from statehold.errors import InvalidArgumentError
from statehold.spark import abfs_conf
from statehold.spark.session import spark_checkpoint_location
from statehold.storage import open_storage

KEY = "a2V5"  # base64 of "key"
FS = "spark.hadoop.fs.azure."


@pytest.fixture(autouse=True)
def no_azure_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AZURE_STORAGE_ENDPOINT", "AZURE_ENDPOINT", "AZURE_STORAGE_ACCOUNT_NAME",
                 "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_ALLOW_HTTP"):
        monkeypatch.delenv(name, raising=False)


def test_azure_account_gets_abfss_on_its_dfs_host() -> None:
    root = open_storage("az://cont/jobs", account_name="acct", account_key=KEY)
    job = root.child("totals")  # the job directory StatefulJob opens below the root
    assert spark_checkpoint_location(job) == "abfss://cont@acct.dfs.core.windows.net/jobs/totals/_spark"
    top = open_storage("abfss://cont@acct.dfs.core.windows.net", account_key=KEY)
    assert spark_checkpoint_location(top) == "abfss://cont@acct.dfs.core.windows.net/_spark"
    china = open_storage("az://cont/x", account_name="acct",
                         endpoint="https://acct.blob.core.chinacloudapi.cn")
    assert spark_checkpoint_location(china) == "abfss://cont@acct.dfs.core.chinacloudapi.cn/x/_spark"
    assert abfs_conf({"account_name": "acct", "account_key": KEY}) == {
        FS + "account.auth.type.acct.dfs.core.windows.net": "SharedKey",
        FS + "account.key.acct.dfs.core.windows.net": KEY,
    }


def test_emulator_over_tls_is_reached_through_the_blob_endpoint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    endpoint = "https://127.0.0.1:10443/devstoreaccount1"
    job = open_storage("az://cont/p/job", endpoint=endpoint, account_name="devstoreaccount1",
                       account_key=KEY)
    assert spark_checkpoint_location(job) == (
        "abfss://cont@devstoreaccount1.dfs.core.windows.net/p/job/_spark")
    expected = {
        FS + "abfs.endpoint": "127.0.0.1:10443",
        FS + "fns.account.service.type": "BLOB",
        FS + "account.hns.enabled": "false",
        FS + "account.auth.type.devstoreaccount1.dfs.core.windows.net": "SharedKey",
        FS + "account.key.devstoreaccount1.dfs.core.windows.net": KEY,
    }
    assert abfs_conf({"endpoint": endpoint, "account_key": KEY}) == expected
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", endpoint)  # the same from the environment
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", KEY)
    assert abfs_conf() == expected


def test_emulator_over_http_gets_abfs_without_tls() -> None:
    endpoint = "http://127.0.0.1:10000/devstoreaccount1"
    job = open_storage("az://cont", endpoint=endpoint, account_name="devstoreaccount1",
                       account_key=KEY, allow_http=True)
    assert spark_checkpoint_location(job) == "abfs://cont@devstoreaccount1.dfs.core.windows.net/_spark"
    conf = abfs_conf({"endpoint": endpoint})
    assert conf[FS + "always.use.https"] == "false"
    assert conf[FS + "networking.library"] == "JDK_HTTP_URL_CONNECTION"
    assert conf[FS + "abfs.endpoint"] == "127.0.0.1:10000"
    assert not [k for k in conf if ".key." in k]  # no key given: none set


def test_no_account_is_one_clear_error() -> None:
    with pytest.raises(InvalidArgumentError, match="no Azure account name"):
        abfs_conf({"account_key": KEY})
