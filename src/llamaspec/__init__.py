"""llamaspec: build, patch, test and ship llama-server with speculative decoding."""

__version__ = "0.1.0"
