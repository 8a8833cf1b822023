#!/bin/bash
# Healthy when llama-server answers GET /health with 200 (bash's /dev/tcp: no curl needed),
# on the port the entrypoint started it on (its port file), else LLAMASPEC_PORT (8080).
#
# The speculation gate (issue 43): where the entrypoint wrote its gate file (a draft model or
# MTP head is loaded), the check also reads /metrics; once the server has generated
# LLAMASPEC_GATE_TOKENS tokens (64) and its llamacpp:spec_decode_num_draft_tokens_total is
# still 0, it prints the gate's paragraph (docker inspect's health log) and writes it once to
# the server's stderr (docker logs). The status stays healthy: the server answers, correctly,
# and a restart cannot fix a command line; LLAMASPEC_SPEC_GATE=fail makes it unhealthy, =off
# skips the gate. A server without speculation counters (ik_llama.cpp) is not judged.
port=$(cat "${LLAMASPEC_PORT_FILE:-/tmp/llamaspec.port}" 2>/dev/null)
port="${port:-${LLAMASPEC_PORT:-8080}}"
exec 3<>"/dev/tcp/127.0.0.1/$port" || exit 1
printf 'GET /health HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3
IFS= read -r -t 5 status <&3 || exit 1
case "$status" in
  "HTTP/1."?" 200"*) ;;
  *) exit 1 ;;
esac
exec 3<&-
mode="${LLAMASPEC_SPEC_GATE:-warn}"
gate="${LLAMASPEC_GATE_FILE:-/tmp/llamaspec.gate}"
[ "$mode" != off ] && [ -s "$gate" ] || exit 0
exec 4<>"/dev/tcp/127.0.0.1/$port" || exit 0
printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&4
predicted="" drafted="" drafts=""
while IFS= read -r -t 5 line <&4; do
  line="${line%$'\r'}"
  case "$line" in
    "llamacpp:tokens_predicted_total "*) predicted="${line##* }" ;;
    "llamacpp:spec_decode_num_draft_tokens_total "*) drafted="${line##* }" ;;
    "llamacpp:spec_decode_num_drafts_total "*) drafts="${line##* }" ;;
  esac
done
exec 4<&-
[ -n "$drafted" ] || exit 0  # no speculation counters: /metrics off, or ik_llama.cpp
# at least $2: the server prints integers, and 6 digits in e-notation from 1e6 on
at_least() {
  case "$1" in *e+*) return 0 ;; esac
  [ "${1%%.*}" -ge "$2" ] 2>/dev/null
}
if [ "$drafted" = 0 ] && at_least "${predicted:-0}" "${LLAMASPEC_GATE_TOKENS:-64}"; then
  { IFS= read -r loaded; IFS= read -r cause; IFS= read -r fix; } < "$gate"
  said="llamaspec: SPECULATION GATE: llama-server loads $loaded, but nothing was drafted:"
  said="$said over $predicted generated tokens /metrics (llamacpp:spec_decode_*) counted"
  said="$said ${drafts:-0} drafts and 0 draft tokens. Every token was decoded by the target"
  said="$said alone: the draft costs memory and load time and buys no speed. Likely cause:"
  said="$said $cause. Fix: $fix."
  echo "$said"
  if [ ! -e "$gate.said" ]; then
    : > "$gate.said" 2>/dev/null
    echo "$said" >> "${LLAMASPEC_GATE_LOG:-/proc/1/fd/2}" 2>/dev/null || true
  fi
  [ "$mode" = fail ] && exit 1
fi
exit 0
