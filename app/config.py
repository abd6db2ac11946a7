"""Service settings: one validated object read from the environment (and an optional ``.env``).

Embedded mode (no ``REDIS_URL``) runs the API with an in-process training worker on SQLite.
Production mode (``REDIS_URL`` set) uses Celery workers and beat; there the default secret
key is refused at start-up.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings", "reset_settings_cache", "DEFAULT_SECRET_KEY"]

DEFAULT_SECRET_KEY = "privrec-embedded-insecure-default-secret-change-me"


class Settings(BaseSettings):
    """All runtime settings. Environment variable = field name in upper case."""

    model_config = SettingsConfigDict(env_file=".env", env_file_encoding="utf-8", extra="ignore")

    # --- storage and queue
    database_url: str = "sqlite:///./var/privrec.db"
    redis_url: str | None = None
    artifact_dir: Path = Path("./var/artifacts")
    db_pool_size: int = Field(10, ge=1, le=200)
    db_echo: bool = False
    sqlite_busy_timeout_ms: int = Field(30_000, ge=0)

    # --- auth
    secret_key: str = DEFAULT_SECRET_KEY
    jwt_algorithm: Literal["HS256", "HS384", "HS512"] = "HS256"
    access_token_ttl_s: int = Field(3600, gt=0, le=30 * 24 * 3600)
    # the longest lifetime (exp - iat) a token may have: refused at issue and at verification
    max_token_ttl_s: int = Field(30 * 24 * 3600, gt=0, le=365 * 24 * 3600)

    # --- API limits
    max_batch_size: int = Field(10_000, ge=1, le=10_000)

    # --- data set / budget defaults (used when the default data set is created)
    default_dataset: str = "default"
    default_rating_min: float = 0.5
    default_rating_max: float = 5.0
    default_epsilon_cap: float = Field(10.0, gt=0)
    # the period of a privacy block (a user's cohort: the UTC period of her creation): "month" or
    # "day"; written to the database's block calendar at the first bootstrap and fixed from then on
    privacy_block_period: Literal["month", "day"] = "month"
    default_delta: float = Field(1e-6, gt=0, lt=1)

    # --- training and scheduling
    retrain_interval_s: int = Field(24 * 3600, ge=1)
    retrain_epsilon: float = Field(1.0, gt=0)
    retrain_enabled: bool = True
    # scheduled retraining warns (WARNING log, /metrics privrec_payable_blocks) once fewer privacy
    # blocks than this could pay one more retrain
    retrain_min_payable_blocks: int = Field(2, ge=1)
    # whether scheduled runs read the still-open current block (users still join it)
    retrain_read_current_block: bool = True
    # how often beat (and the embedded worker) looks for data sets whose retrain interval has
    # elapsed; the tick is the smaller of this and RETRAIN_INTERVAL_S
    retrain_tick_s: int = Field(3600, ge=1)
    run_heartbeat_s: float = Field(10.0, gt=0)
    run_stale_after_s: float = Field(120.0, gt=0)
    embedded_worker: bool = True
    embedded_poll_s: float = Field(2.0, gt=0)
    # --- distributed training (issue 28; needs the optional 'dask' extra): set, DPALS and DP-CMF runs
    # train on this Dask scheduler (e.g. tls://scheduler:8786) through app.core.mf.distributed;
    # unset, in process. The three TLS files (PEM) turn on Dask's Security: TLS with mutual
    # authentication, required in production (the seed and partial statistics cross the network)
    dask_scheduler_address: str | None = None
    dask_tls_ca_file: Path | None = None
    dask_tls_cert_file: Path | None = None
    dask_tls_key_file: Path | None = None
    # user partitions of a run (None: one per worker thread of the cluster)
    dask_partitions: int | None = Field(None, ge=1, le=4096)
    dask_connect_timeout_s: float = Field(30.0, gt=0)
    # the longest a run waits for one reduced statistic from the cluster (e.g. left without workers)
    # before it fails, charged and unpublished
    dask_result_timeout_s: float = Field(3600.0, gt=0)
    # Celery beat's schedule file (when each periodic task last ran); unset: one file per database in the temp dir
    beat_schedule_path: Path | None = None
    seed_demo: bool = True

    # --- serving
    api_host: str = "127.0.0.1"
    api_port: int = Field(8000, ge=1, le=65535)
    log_level: str = "INFO"
    log_format: Literal["json", "text"] = "json"
    # Server-Timing response header (time spent in the app): a timing side channel, off by default.
    server_timing: bool = False

    @property
    def embedded(self) -> bool:
        """True when no Redis is configured: in-process worker, no Celery."""
        return not self.redis_url

    @property
    def beat_schedule_file(self) -> Path:
        """``BEAT_SCHEDULE_PATH``, else a temp-dir file named after the database, so that two
        deployments on one host never share a schedule."""
        if self.beat_schedule_path is not None:
            return self.beat_schedule_path
        digest = hashlib.sha256(self.database_url.encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"privrec-celerybeat-{digest}"

    @property
    def retrain_tick(self) -> int:
        """Seconds between the scheduler's looks at the data sets' retrain policies."""
        return min(self.retrain_tick_s, self.retrain_interval_s)

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if not self.embedded and self.secret_key == DEFAULT_SECRET_KEY:
            raise ValueError(
                "SECRET_KEY must be set to a private value outside the embedded mode (REDIS_URL is set)"
            )
        if len(self.secret_key) < 16:
            raise ValueError("SECRET_KEY must be at least 16 characters long")
        if not (math.isfinite(self.default_rating_min) and math.isfinite(self.default_rating_max)):
            raise ValueError("the default rating range must be finite")
        if self.default_rating_min >= self.default_rating_max:
            raise ValueError("DEFAULT_RATING_MIN must be below DEFAULT_RATING_MAX")
        if self.run_stale_after_s <= self.run_heartbeat_s:
            raise ValueError("RUN_STALE_AFTER_S must exceed RUN_HEARTBEAT_S")
        if self.access_token_ttl_s > self.max_token_ttl_s:
            raise ValueError("ACCESS_TOKEN_TTL_S must not exceed MAX_TOKEN_TTL_S")
        if self.redis_url is not None and self.redis_url.strip() == "":
            self.redis_url = None
        self._check_dask()
        return self

    def _check_dask(self) -> None:
        if self.dask_scheduler_address is not None and self.dask_scheduler_address.strip() == "":
            self.dask_scheduler_address = None
        tls = (self.dask_tls_ca_file, self.dask_tls_cert_file, self.dask_tls_key_file)
        if any(tls) and not all(tls):
            raise ValueError("DASK_TLS_CA_FILE, DASK_TLS_CERT_FILE and DASK_TLS_KEY_FILE go together (mutual TLS)")
        if self.dask_scheduler_address is None:
            return
        if self.is_sqlite:
            raise ValueError("DASK_SCHEDULER_ADDRESS needs PostgreSQL: cluster training refuses the embedded "
                             "SQLite database (unset DASK_SCHEDULER_ADDRESS or set DATABASE_URL to PostgreSQL)")
        if all(tls) and not self.dask_scheduler_address.startswith("tls://"):
            raise ValueError("with the Dask TLS files set, DASK_SCHEDULER_ADDRESS must be a tls:// address")

    @property
    def dask_tls(self) -> bool:
        """Whether the cluster is reached over TLS with mutual authentication (Dask's Security)."""
        return self.dask_tls_ca_file is not None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings (validated once; call :func:`reset_settings_cache` in tests)."""
    return Settings()


def reset_settings_cache() -> None:
    """Forget the cached settings so the next :func:`get_settings` re-reads the environment."""
    get_settings.cache_clear()
