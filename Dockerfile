# syntax=docker/dockerfile:1
#
# Skirr serving the example FastAPI app under Gunicorn.
#   docker build -t skirr-example .
#   docker run --rm -p 8000:8000 skirr-example
# tests/test_dockerfile.py performs the same steps without a Docker engine.

# ---- build: Rust + maturin -> a wheel
FROM python:3.12-slim-bookworm AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Build-only packages; the runtime stage carries none of them, so they are
# not pinned (the base image's Debian release fixes their versions).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential curl ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs \
    | sh -s -- -y --profile minimal --default-toolchain 1.95.0
ENV PATH=/root/.cargo/bin:$PATH
RUN pip install --no-cache-dir "maturin==1.16.0"
WORKDIR /src
COPY Cargo.toml Cargo.lock pyproject.toml README.md ./
COPY rust/src rust/src
COPY python python
# Workspace members (benchmark helpers) must be present for cargo to resolve.
COPY bench/hyper-hello bench/hyper-hello
COPY bench/loadgen bench/loadgen
RUN maturin build --release --out /dist

# ---- runtime: slim Python, the wheel, a non-root user
FROM python:3.12-slim-bookworm
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY --from=build /dist/*.whl /tmp/wheels/
RUN pip install --no-cache-dir /tmp/wheels/*.whl "gunicorn==27.0.1" "uvloop==0.23.0" "fastapi==0.165.0" "python-multipart==0.0.34" \
    && rm -rf /tmp/wheels \
    && useradd --create-home --uid 10001 app
WORKDIR /app
COPY examples examples
USER 10001
EXPOSE 8000
# Skirr answers the health path itself, without the app (README, "Health path").
ENV SKIRR_HEALTH_PATH=/_health
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/_health', timeout=2).status != 200)"]
# Gunicorn is PID 1 (exec form): SIGTERM from `docker stop` reaches the master,
# which drains its workers within --graceful-timeout.
STOPSIGNAL SIGTERM
ENTRYPOINT ["gunicorn", "-k", "skirr.RustWorker", "--bind", "0.0.0.0:8000", "--graceful-timeout", "20"]
CMD ["--workers", "2", "examples.fastapi_app:app"]
