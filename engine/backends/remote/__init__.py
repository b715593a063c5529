"""An OpenAI-compatible server (llama-server, vLLM, TabbyAPI) that drafts and verifies itself: `--backend remote`.
Re-exports only."""

from engine.backends.remote.backend import RemoteBackend

__all__ = ["RemoteBackend"]
