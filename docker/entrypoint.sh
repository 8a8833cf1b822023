#!/bin/sh
# Start llama-server. Host and port: the arguments' --host/--port, else llama-server's own
# LLAMA_ARG_HOST/LLAMA_ARG_PORT, else LLAMASPEC_HOST/LLAMASPEC_PORT (0.0.0.0:8080). Every
# other LLAMA_ARG_* variable (LLAMA_ARG_MODEL, LLAMA_ARG_CTX_SIZE, ...) reaches llama-server
# unchanged, and arguments are passed on. The port is written where the health check reads
# it, so the check follows the port the server really listens on.
root="${LLAMASPEC_ROOT:-/opt/llamaspec}"
host="${LLAMA_ARG_HOST:-${LLAMASPEC_HOST:-0.0.0.0}}"
port="${LLAMA_ARG_PORT:-${LLAMASPEC_PORT:-8080}}"
prev=""
for arg in "$@"; do
  case "$prev" in
    --port) port="$arg" ;;
    --host) host="$arg" ;;
  esac
  case "$arg" in
    --port=*) port="${arg#--port=}" ;;
    --host=*) host="${arg#--host=}" ;;
  esac
  prev="$arg"
done
echo "$port" > "${LLAMASPEC_PORT_FILE:-/tmp/llamaspec.port}" 2>/dev/null || true
exec "$root/bin/llama-server" --host "$host" --port "$port" "$@"
