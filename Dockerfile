# tritium: llama-server compatible inference server (Triton kernels on NVIDIA GPUs).
#
#   docker build -t tritium .
#   docker run --gpus all -p 8080:8080 -v /path/to/models:/models:ro tritium \
#       -m /models/model.gguf -np 4 -c 8192
#
# Arguments after the image name replace CMD and are passed to tritium-server after
# "--host 0.0.0.0 --port 8080". Keep the port at 8080: EXPOSE and HEALTHCHECK use it.
#
# torch comes from PyTorch's CUDA wheel index (it bundles the CUDA runtime libraries and pulls
# the matching triton); the base image supplies the CUDA userspace layout the NVIDIA container
# toolkit expects. Triton compiles small C launchers at run time, hence gcc and python3-dev.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-base-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128
ARG TORCH_SPEC="torch>=2.4,<=2.14.1"

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv

# The big layer first, so source changes do not re-download torch. The CUDA torch wheel
# depends on the exact triton release it was built with, which pip takes from the same index.
# The version range is pinned through TORCH_SPEC (same bounds as pyproject.toml).
# hadolint ignore=DL3013
RUN pip install --index-url "${TORCH_INDEX_URL}" "${TORCH_SPEC}"

WORKDIR /opt/tritium
COPY . .
# torch/triton are already satisfied; the rest of the dependencies come from PyPI.
RUN pip install . \
    && python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"

RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin tritium \
    && mkdir -p /models \
    && chown tritium:tritium /models
USER 10001
ENV HOME=/home/tritium \
    TRITON_CACHE_DIR=/home/tritium/.triton/cache
WORKDIR /home/tritium

VOLUME ["/models"]
EXPOSE 8080

# /health answers 503 while the model loads (and kernels compile); start-period covers that.
# urlopen raises on any non-2xx status, and an uncaught exception exits 1 (= unhealthy).
HEALTHCHECK --interval=15s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4)"]

ENTRYPOINT ["tritium-server", "--host", "0.0.0.0", "--port", "8080"]
CMD ["-m", "/models/model.gguf"]
