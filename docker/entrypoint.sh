#!/bin/sh
# Start llama-server on LLAMASPEC_HOST:LLAMASPEC_PORT (0.0.0.0:8080); arguments are passed on.
exec /opt/llamaspec/bin/llama-server --host "${LLAMASPEC_HOST:-0.0.0.0}" \
  --port "${LLAMASPEC_PORT:-8080}" "$@"
