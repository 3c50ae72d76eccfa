"""An S3 protocol server's coordinates (the moto server of conftest's `s3_server`
fixture): options for `open_storage`, and the same settings as AWS_* variables for
subprocesses."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str
    access_key_id: str = "testing"
    secret_access_key: str = "testing"
    region: str = "us-east-1"

    @property
    def options(self) -> dict[str, object]:
        """Keyword options for `open_storage` on this server."""
        return {
            "endpoint": self.endpoint,
            "region": self.region,
            "access_key_id": self.access_key_id,
            "secret_access_key": self.secret_access_key,
            "allow_http": True,
        }

    @property
    def env(self) -> dict[str, str]:
        """The same settings as AWS_* environment variables, for subprocesses."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
            "AWS_ALLOW_HTTP": "true",
        }
