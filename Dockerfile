# syntax=docker/dockerfile:1
# privrec: multi-stage build; the runtime image runs as a non-root user and its entry point is
# the `privrec` CLI, so the same commands as on a workstation run in containers:
#   docker run IMAGE migrate | api | worker | beat | serve | issue-token ... | budget
# Production needs DATABASE_URL, REDIS_URL and SECRET_KEY in the environment.

ARG PYTHON_VERSION=3.11

# ---------------------------------------------------------------- build: wheels in a venv
FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
# Dependencies first (a cached layer keyed on pyproject.toml), then the project itself.
COPY pyproject.toml README.md ./
RUN pip install --upgrade pip wheel \
 && python -c "import tomllib; d = tomllib.load(open('pyproject.toml', 'rb')); print('\\n'.join(d['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt
COPY app ./app
COPY workers ./workers
COPY migrations ./migrations
COPY benchmarks ./benchmarks
COPY openapi.yaml ./
# Installed in place (same path in the runtime image): Alembic's scripts in /app/migrations are
# found next to the code, exactly as in a checkout.
RUN pip install --no-deps -e .

# ---------------------------------------------------------------- runtime
FROM python:${PYTHON_VERSION}-slim AS runtime
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
    ARTIFACT_DIR=/data/artifacts
RUN groupadd --system --gid 10001 privrec \
 && useradd --system --uid 10001 --gid privrec --home-dir /home/privrec --create-home privrec \
 && mkdir -p /data/artifacts \
 && chown -R privrec:privrec /data
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
WORKDIR /app
USER privrec:privrec
VOLUME ["/data"]
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s --start-period=20s --retries=3 \
  CMD python -c "import os,urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % os.environ.get('API_PORT','8000'), timeout=2)" || exit 1
ENTRYPOINT ["privrec"]
CMD ["api"]
