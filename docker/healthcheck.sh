#!/bin/bash
# Healthy when llama-server answers GET /health with 200 (bash's /dev/tcp: no curl needed),
# on the port the entrypoint started it on (its port file), else LLAMASPEC_PORT (8080).
port=$(cat "${LLAMASPEC_PORT_FILE:-/tmp/llamaspec.port}" 2>/dev/null)
exec 3<>"/dev/tcp/127.0.0.1/${port:-${LLAMASPEC_PORT:-8080}}" || exit 1
printf 'GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
IFS= read -r -t 5 status <&3 || exit 1
case "$status" in
  "HTTP/1."?" 200"*) exit 0 ;;
  *) exit 1 ;;
esac
