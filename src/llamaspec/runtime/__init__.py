"""Runtime stage: start, talk to and stop llama-server and rpc-server processes.

client (the one llama-server client: start on loopback, /health, /completion, chat,
tokenize, logprobs), rpc (rpc-server argv, the HELLO probe, a local rpc-server, host checks),
serve (a recipe rendered for an artifact or an engine's default pin; `serve` runs it),
supervise (`serve --restart`: the server as a child, restarted when it dies),
metrics (the `/metrics` reader), specgate (the speculation gate's verdict).
Nothing here judges the output: proof/ does, perf/ times it.

May import: the base modules, llamaspec.engine and llamaspec.models.
"""
