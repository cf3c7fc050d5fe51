# dockflow: one image for every process; its command picks the part:
#   docker run IMAGE serve      edge, API and webhook worker in one process (small sites)
#   docker run IMAGE api        HTTP API (REST, GraphQL, dashboard)
#   docker run IMAGE edge       gRPC edge for the dock cameras
#   docker run IMAGE webhooks   webhook delivery worker
# deploy/compose.yaml runs them against a MongoDB replica set; docs/deploy.md explains it.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: the locked dependencies (exact versions, hashes) and dockflow, in a venv ---------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
RUN python -m venv /opt/dockflow
WORKDIR /src
COPY requirements.txt ./
RUN /opt/dockflow/bin/pip install --require-hashes --no-deps -r requirements.txt
COPY pyproject.toml README.md ./
COPY core ./core
COPY edge ./edge
COPY public_api ./public_api
COPY webhooks ./webhooks
COPY dockflow ./dockflow
COPY bench ./bench
COPY protos ./protos
# --no-deps: everything it needs came from the lock above; pip check proves nothing is missing.
# (The build backend, setuptools, is fetched for this one build and is not in the image.)
RUN /opt/dockflow/bin/pip install --no-deps . \
    && /opt/dockflow/bin/pip check

# --- run: the venv only, as an unprivileged user --------------------------------------------
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 dockflow \
    && useradd --system --uid 10001 --gid dockflow --home-dir /var/lib/dockflow \
       --shell /usr/sbin/nologin dockflow \
    && install -d -o dockflow -g dockflow -m 0700 /var/lib/dockflow
COPY --from=build /opt/dockflow /opt/dockflow
ENV PATH=/opt/dockflow/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DOCKFLOW_DATA_DIR=/var/lib/dockflow \
    DOCKFLOW_LOG_FORMAT=json
USER 10001:10001
WORKDIR /var/lib/dockflow
VOLUME ["/var/lib/dockflow"]
EXPOSE 8080 50051 9090
ENTRYPOINT ["dockflow"]
CMD ["serve"]
