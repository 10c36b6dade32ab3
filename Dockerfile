# Build: docker build -t gpuwatch .
# Run:   docker run -d --gpus all --pid=host --hostname "$(hostname)" -p 9842:9842 -v gpuwatch-data:/data gpuwatch
# Try without GPUs: docker run -d -p 9842:9842 gpuwatch serve --demo
# What each flag does: README.md "Docker" and docs/deploy.md.
# NVML (libnvidia-ml.so.1) comes from the host through the NVIDIA Container Toolkit (--gpus all);
# it is never baked into the image.
FROM python:3.11-slim

# GPUWATCH_EXPECT_GPUS: started without GPUs (no --gpus all), /-/health answers 503 degraded, so the
# HEALTHCHECK fails instead of reporting a GPU monitor without GPUs as healthy (--demo is exempt).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    GPUWATCH_DATA_DIR=/data \
    GPUWATCH_HOST=0.0.0.0 \
    GPUWATCH_PORT=9842 \
    GPUWATCH_EXPECT_GPUS=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# glibc: one heap for all threads, up to 16 MB of it kept when freed, so a query reuses warm memory (README, Storage).
ENV MALLOC_ARENA_MAX=1 \
    MALLOC_MMAP_THRESHOLD_=16777216 \
    MALLOC_TRIM_THRESHOLD_=16777216

WORKDIR /src
COPY pyproject.toml README.md CHANGELOG.md ./
COPY gpuwatch ./gpuwatch
COPY templates ./templates
COPY static ./static
# With the tensorboard extra (tensorboardX, protobuf, google-crc32c: ~0.5 MB), so `tensorboard_dirs` and
# `gpuwatch import` read event files. "./[...]": a local path, which hadolint's pin check accepts.
RUN pip install "./[tensorboard]" \
    && groupadd --system --gid 10001 gpuwatch \
    && useradd --system --uid 10001 --gid 10001 --home-dir /data --shell /usr/sbin/nologin gpuwatch \
    && mkdir -p /data && chown 10001:10001 /data \
    && rm -rf /src

WORKDIR /data
# Numeric, so that Kubernetes' runAsNonRoot can check it is not root.
USER 10001:10001
VOLUME ["/data"]
EXPOSE 9842
# /-/health answered within 66 ms under 50 dashboards on 2 cores (queries past query_max_concurrency and
# query_max_queued are answered 503 at once, so it never waits behind them; bench/README.md, Soak). The
# timeout leaves room for a host whose cores are busy with other work; `gpuwatch health` waits 8 s.
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 CMD ["gpuwatch", "health"]
ENTRYPOINT ["gpuwatch"]
CMD ["serve"]
