#!/bin/sh
# Start llama-server. Host and port: the arguments' --host/--port, else llama-server's own
# LLAMA_ARG_HOST/LLAMA_ARG_PORT, else LLAMASPEC_HOST/LLAMASPEC_PORT (0.0.0.0:8080). Every
# other LLAMA_ARG_* variable (LLAMA_ARG_MODEL, LLAMA_ARG_CTX_SIZE, ...) reaches llama-server
# unchanged, and arguments are passed on. The port is written where the health check reads
# it, so the check follows the port the server really listens on.
#
# Before that, two checks that turn a crash into a sentence: a CPU without an instruction
# set the build needs (cpu-needs.txt: the flags, then why) stops here instead of dying with
# an illegal instruction, and a CUDA image started without the NVIDIA driver says it runs
# on the CPU instead.
#
# The speculation gate (issue 43): where the arguments (or LLAMA_ARG_SPEC_DRAFT_MODEL,
# LLAMA_ARG_SPEC_TYPE) load a draft model or an MTP head, the entrypoint turns the server's
# /metrics on (LLAMA_ARG_ENDPOINT_METRICS=1 unless set) and writes what is loaded, the likely
# cause of a draft that drafts nothing and its fix to the gate file, which the health check
# reads (docker/healthcheck.sh). LLAMASPEC_SPEC_GATE=off leaves both out.
#
# `rpc-server [ARGS]` as the first argument runs the image's rpc-server instead (images with
# the rpc variant): bound to 0.0.0.0 inside the container (publish it to one host address,
# e.g. -p 127.0.0.1:50052:50052), port 50052, unless ARGS give -H/-p; it warns that the RPC
# protocol has no authentication or encryption.
root="${LLAMASPEC_ROOT:-/opt/llamaspec}"
if [ "$1" = "rpc-server" ]; then
  shift
  for name in rpc-server ggml-rpc-server; do
    [ -x "$root/bin/$name" ] && rpc="$root/bin/$name" && break
  done
  if [ -z "$rpc" ]; then
    echo "llamaspec: this image has no rpc-server: it was built without the rpc variant." \
      "Build one with: llamaspec docker build --variants rpc (plus the backend's own)." >&2
    exit 1
  fi
  echo "llamaspec: warning: the RPC protocol has no authentication and no encryption;" \
    "publish this port to loopback or a private address only (docker run -p" \
    "127.0.0.1:50052:50052), and reach it over an SSH tunnel." >&2
  case " $* " in *" -H "*|*" --host "*) ;; *) set -- -H 0.0.0.0 "$@" ;; esac
  case " $* " in *" -p "*|*" --port "*) ;; *) set -- -p 50052 "$@" ;; esac
  exec "$rpc" "$@"
fi
# The image's own variables (declared in llamaspec/env.py), refused with a sentence before
# anything starts: no control character or value over 4096 characters in any, a port, a
# count, an address and the gate's words where those are asked for.
refuse() {
  echo "llamaspec: $1 is '$2', which $3; set it to $4, or leave it unset." >&2
  exit 2
}
for name in LLAMASPEC_HOST LLAMASPEC_PORT LLAMASPEC_PORT_FILE LLAMASPEC_SPEC_GATE \
  LLAMASPEC_GATE_FILE LLAMASPEC_GATE_TOKENS LLAMASPEC_GATE_LOG; do
  eval "value=\${$name:-}"
  case "$value" in *[[:cntrl:]]*) refuse "$name" "$value" "holds a control character" \
    "a value without one" ;; esac
  [ "${#value}" -le 4096 ] || refuse "$name" "(${#value} characters)" "is too long" \
    "a value of 4096 characters at most"
done
case "${LLAMASPEC_PORT:-8080}" in
  [1-9]|[1-9][0-9]|[1-9][0-9][0-9]|[1-9][0-9][0-9][0-9]|[1-9][0-9][0-9][0-9][0-9]) ;;
  *) refuse LLAMASPEC_PORT "$LLAMASPEC_PORT" "is not a port" "a port from 1 to 65535" ;;
esac
[ "${LLAMASPEC_PORT:-8080}" -le 65535 ] \
  || refuse LLAMASPEC_PORT "$LLAMASPEC_PORT" "is not a port" "a port from 1 to 65535"
case "${LLAMASPEC_GATE_TOKENS:-64}" in
  ''|*[!0-9]*|??????????*) refuse LLAMASPEC_GATE_TOKENS "$LLAMASPEC_GATE_TOKENS" \
    "is not a whole number of 0 or more" "a whole number such as 64" ;;
esac
case "${LLAMASPEC_HOST:-0.0.0.0}" in
  *[!A-Za-z0-9.:_[\]-]*) refuse LLAMASPEC_HOST "$LLAMASPEC_HOST" "is not an address" \
    "an address to listen on (0.0.0.0)" ;;
esac
case "${LLAMASPEC_SPEC_GATE:-warn}" in
  off|warn|fail|OFF|WARN|FAIL|Off|Warn|Fail) ;;
  *) refuse LLAMASPEC_SPEC_GATE "$LLAMASPEC_SPEC_GATE" "is not one of off, warn, fail" \
    "off, warn or fail" ;;
esac
if [ -s "$root/cpu-needs.txt" ] && [ -r /proc/cpuinfo ]; then
  have=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  missing=""
  for flag in $(head -n1 "$root/cpu-needs.txt"); do
    case "$have" in *" $flag "*) ;; *) missing="$missing $flag" ;; esac
  done
  if [ -n "$missing" ]; then
    why="$(sed -n 2p "$root/cpu-needs.txt")"
    engine="$(sed -n 's/^engine=//p' "$root/labels.txt" 2>/dev/null)"
    backend="$(sed -n 's/^backend=//p' "$root/labels.txt" 2>/dev/null)"
    build="llamaspec docker build --engine ${engine:-ENGINE} --backend ${backend:-BACKEND}"
    case "$why" in
      GGML_NATIVE=ON*)  # built for the CPU of the machine that built it, whatever the engine
        fix="This image was built for that machine's CPU only. Build one for any x86-64 CPU"
        fix="$fix (the engine's portable profile): $build; or pull the published one:"
        fix="$fix llamaspec docker pull --engine ${engine:-ENGINE}." ;;
      *)
        if [ "$engine" = "llama.cpp" ]; then  # upstream's baseline, raised by defines
          fix="Build an image without the defines that raise its instruction-set baseline:"
          fix="$fix $build."
        else  # a fixed baseline; upstream picks its CPU code at run time
          fix="Pull the upstream (llama.cpp) image, which picks its CPU code at run time"
          fix="$fix (llamaspec docker pull --engine llama.cpp), or build ${engine:-the engine}"
          fix="$fix for this CPU here (llamaspec build --engine ${engine:-ENGINE}) and put"
          fix="$fix that build in an image: llamaspec docker build --from-artifact ID"
          fix="$fix --allow-native."
        fi ;;
    esac
    echo "llamaspec: this CPU lacks${missing}, which this image's llama-server needs" \
      "(${why}), so it would stop with an illegal instruction. $fix" >&2
    exit 1
  fi
fi
if grep -qx 'backend=cuda' "$root/labels.txt" 2>/dev/null \
  && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1'; then
  echo "llamaspec: no CUDA device: the NVIDIA driver (libcuda.so.1) is not in this container." \
    "Start it with docker run --gpus all on a host with the NVIDIA driver and the NVIDIA" \
    "Container Toolkit. llama-server runs on the CPU now." >&2
fi
host="${LLAMA_ARG_HOST:-${LLAMASPEC_HOST:-0.0.0.0}}"
port="${LLAMA_ARG_PORT:-${LLAMASPEC_PORT:-8080}}"
draft="${LLAMA_ARG_SPEC_DRAFT_MODEL:-}"
how="LLAMA_ARG_SPEC_DRAFT_MODEL"
types="${LLAMA_ARG_SPEC_TYPE:-}"
mtp=""
prev=""
for arg in "$@"; do
  case "$prev" in
    --port) port="$arg" ;;
    --host) host="$arg" ;;
    -md|--model-draft|--spec-draft-model) draft="$arg"; how="$prev" ;;
    --spec-type) types="$types,$arg" ;;
  esac
  case "$arg" in
    --port=*) port="${arg#--port=}" ;;
    --host=*) host="${arg#--host=}" ;;
    --model-draft=*|--spec-draft-model=*) draft="${arg#*=}"; how="${arg%%=*}" ;;
    --spec-type=*) types="$types,${arg#--spec-type=}" ;;
    -mtp|--multi-token-prediction) mtp="$arg" ;;
    -no-mtp|--no-multi-token-prediction) mtp="" ;;
  esac
  prev="$arg"
done
echo "$port" > "${LLAMASPEC_PORT_FILE:-/tmp/llamaspec.port}" 2>/dev/null || true
gate="${LLAMASPEC_GATE_FILE:-/tmp/llamaspec.gate}"
rm -f "$gate" "$gate.said" 2>/dev/null
case ",$types," in *,draft-mtp[,:]*|*,mtp[,:]*) mtp="--spec-type ${types#,}" ;; esac
if [ "${LLAMASPEC_SPEC_GATE:-warn}" != off ] && { [ -n "$draft" ] || [ -n "$mtp" ]; }; then
  case ",$types," in
    *,draft-simple[,:]*|*,draft-eagle3[,:]*|*,draft-dflash[,:]*|*,draft-dspark[,:]*|*,draft[,:]*)
      typed=1 ;;
    *) typed="" ;;
  esac
  if [ -n "$draft" ]; then
    loaded="draft model $draft ($how)"
  else
    loaded="the target's MTP head ($mtp)"
  fi
  if [ -n "$draft" ] && [ -z "$typed" ]; then
    cause="a draft model without a draft spec type: since upstream llama.cpp PR #23988, $how"
    cause="$cause loads the draft and never drafts with it unless --spec-type names a draft"
    cause="$cause type (upstream issue #25345)"
    fix="add --spec-type draft-simple to the arguments (draft-eagle3, draft-dflash or"
    fix="$fix draft-dspark for those drafters; with other types, comma-separated)"
  elif [ -n "$mtp" ] && [ -z "$draft" ]; then
    cause="the target has no MTP head this build can use (no nextn layers in the GGUF)"
    fix="use a target GGUF converted with its MTP layers, or a draft model instead"
  else
    cause="not clear from the command line"
    fix="read the server log's speculative lines (draft loading, acceptance)"
  fi
  printf '%s\n%s\n%s\n' "$loaded" "$cause" "$fix" > "$gate" 2>/dev/null || true
  export LLAMA_ARG_ENDPOINT_METRICS="${LLAMA_ARG_ENDPOINT_METRICS:-1}"
fi
exec "$root/bin/llama-server" --host "$host" --port "$port" "$@"
