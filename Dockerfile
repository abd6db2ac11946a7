# syntax=docker/dockerfile:1
# privrec: multi-stage build; the runtime image runs as a non-root user under tini (PID 1), and
# its entry point is the `privrec` CLI, so the same commands as on a workstation run in containers:
#   docker run IMAGE migrate | api | worker | beat | serve | issue-token ... | budget
# Production needs DATABASE_URL, REDIS_URL and SECRET_KEY in the environment; compose.yaml wires
# PostgreSQL, Redis, migrate, api, worker and beat together (`docker compose up`), and a Dask
# scheduler and workers (`docker compose --profile dask up`: entry point `dask`).

ARG PYTHON_VERSION=3.11
ARG UV_VERSION=0.13.9

# ---------------------------------------------------------------- requirements: exported from uv.lock
# A cheap stage that any pyproject.toml edit re-runs; its only output is the pinned, hashed list
# of the locked runtime dependencies, so the install layer below is keyed on the lock's contents
# alone (README or tool-configuration edits leave it cached).
FROM python:${PYTHON_VERSION}-slim AS requirements
ARG UV_VERSION
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN pip install "uv==${UV_VERSION}"
WORKDIR /src
COPY pyproject.toml uv.lock ./
# with the optional `dask` extra (Dask distributed, pyarrow): the image also runs the cluster's scheduler
# and workers (compose.yaml's `dask` profile); no role imports it unless DASK_SCHEDULER_ADDRESS is set
RUN uv export --frozen --no-dev --extra dask --no-emit-project --format requirements-txt -o /requirements.txt

# ---------------------------------------------------------------- build: the locked wheels in a venv
FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
# The dependency layer: the exact versions and hashes of uv.lock, nothing else resolved.
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN pip install --require-hashes --no-deps -r /tmp/requirements.txt
COPY pyproject.toml README.md openapi.yaml ./
COPY app ./app
COPY workers ./workers
COPY migrations ./migrations
COPY benchmarks ./benchmarks
# Installed in place (same path in the runtime image): Alembic's scripts in /app/migrations are
# found next to the code, exactly as in a checkout.
RUN pip install --no-deps -e .

# ---------------------------------------------------------------- runtime
FROM python:${PYTHON_VERSION}-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH \
    OPENBLAS_NUM_THREADS=1 \
    OMP_NUM_THREADS=1 \
    MKL_NUM_THREADS=1 \
    NUMBA_CACHE_DIR=/home/privrec/.cache/numba \
    API_HOST=0.0.0.0 \
    API_PORT=8000 \
    DATABASE_URL=sqlite:////data/privrec.db \
    ARTIFACT_DIR=/data/artifacts \
    PROMETHEUS_MULTIPROC_DIR=/tmp/privrec-metrics \
    BEAT_SCHEDULE_PATH=/var/lib/privrec/beat/celerybeat-schedule
RUN groupadd --system --gid 10001 privrec \
 && useradd --system --uid 10001 --gid privrec --home-dir /home/privrec --create-home privrec \
 && mkdir -p /data/artifacts /var/lib/privrec/beat /tmp/privrec-metrics \
 && chown -R privrec:privrec /data /var/lib/privrec /tmp/privrec-metrics
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
WORKDIR /app
USER privrec:privrec
VOLUME ["/data"]
EXPOSE 8000
# One check for every role (`privrec healthcheck` reads the role PID 1 runs): api answers /health;
# worker reaches its broker; beat reaches its broker and keeps rewriting its schedule file; one-off
# commands are healthy. Worker and beat are never probed over HTTP.
HEALTHCHECK --interval=30s --timeout=10s --start-period=60s --retries=3 CMD ["privrec", "healthcheck"]
ENTRYPOINT ["/usr/bin/tini", "--", "privrec"]
CMD ["api"]
