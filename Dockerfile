# syntax=docker/dockerfile:1
# The portal's two images, from one build (docs/operations.md, "Container image and compose"):
#   portal (the default target): web, Celery worker and beat, setup (docker/entrypoint.py)
#   ray-node: a Ray head or worker node with the project installed, for the replicas
#             (serving.dataplane.*, serving.engine.*); the portal image builds on it
# Both run as the unprivileged user `portal` (USER 10001:10001, numeric so that Kubernetes'
# runAsNonRoot can verify it), from one virtual environment.
#
# Build arguments: PYTHON_IMAGE / NODE_IMAGE (the bases), TORCH_INDEX_URL (CPU wheels by
# default; a CUDA index such as https://download.pytorch.org/whl/cu128 for GPU nodes),
# PORTAL_EXTRAS (comma-separated pyproject extras: vllm, s3). Wheels dropped in docker/wheels/
# are preferred to the indexes (an offline wheelhouse).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG NODE_IMAGE=node:22-bookworm-slim

# --- front-end packages (htmx, uPlot, CodeMirror): only what the pages load reaches the image ---
FROM ${NODE_IMAGE} AS frontend
WORKDIR /frontend
COPY package.json package-lock.json ./
RUN npm ci --omit=dev --no-audit --no-fund --loglevel=error

# --- what both images share: Python, the user, the writable folders ----------------------
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    PORTAL_DATA_DIR=/var/lib/portal \
    PORTAL_ARTIFACT_CACHE_DIR=/var/cache/portal-artifacts
RUN groupadd --system --gid 10001 portal \
    && useradd --system --uid 10001 --gid portal --create-home --home-dir /home/portal \
        --shell /usr/sbin/nologin portal \
    && install -d -o portal -g portal -m 0750 /var/lib/portal /var/cache/portal-artifacts

# --- the virtual environment: dependencies first (cached across code changes), then the project
FROM base AS build
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PORTAL_EXTRAS=""
RUN python3 -m venv /opt/venv
COPY docker/wheels/ /tmp/wheels/
COPY pyproject.toml docker/requirements.py /tmp/build/
RUN python /tmp/build/requirements.py /tmp/build/pyproject.toml "$PORTAL_EXTRAS" \
        > /tmp/build/requirements.txt \
    && pip install --no-cache-dir --find-links /tmp/wheels --extra-index-url "$TORCH_INDEX_URL" \
        -r /tmp/build/requirements.txt \
    && pip uninstall --yes torchvision torchaudio torchcodec
# (vLLM pulls torchvision, torchaudio and torchcodec builds that do not import against the
# pinned torch; nothing here uses them: docs/operations.md, Engines.)
COPY . /app
# Editable: one copy of the code, at /app (templates and static files beside it), importable
# from anywhere, which Ray's worker processes need.
RUN pip install --no-cache-dir --no-deps --no-build-isolation --editable /app

# --- a Ray node: `ray start --head ...` or `ray start --address=HEAD:6379 ...` -------------
FROM base AS ray-node
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
WORKDIR /app
# Token auth on every node (RAY_AUTH_TOKEN from the environment: a node without it does not
# start); no usage reports; a dead worker's process group (vLLM's engine processes) is killed.
ENV HOME=/home/portal \
    RAY_AUTH_MODE=token \
    RAY_USAGE_STATS_ENABLED=0 \
    RAY_process_group_cleanup_enabled=1
USER 10001:10001
EXPOSE 6379 8265 8000
CMD ["ray", "start", "--address=ray-head:6379", "--block", "--disable-usage-stats"]

# --- the portal: web, worker, beat, setup (docker/entrypoint.py) ---------------------------
FROM ray-node AS portal
COPY --from=frontend /frontend/node_modules/htmx.org/dist /app/node_modules/htmx.org/dist
COPY --from=frontend /frontend/node_modules/uplot/dist /app/node_modules/uplot/dist
COPY --from=frontend /frontend/node_modules/codemirror/lib /app/node_modules/codemirror/lib
COPY --from=frontend /frontend/node_modules/codemirror/mode/yaml /app/node_modules/codemirror/mode/yaml
COPY --from=frontend /frontend/node_modules/codemirror/addon/lint /app/node_modules/codemirror/addon/lint
ENV PORTAL_ENV=production \
    PORT=8000
EXPOSE 8000
ENTRYPOINT ["/opt/venv/bin/python", "/app/docker/entrypoint.py"]
CMD ["web"]
