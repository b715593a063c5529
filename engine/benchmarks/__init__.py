"""The offline tools: `bench` and its peers (transformers, llama.cpp, llama-server, remote servers, answer checks),
`tune`, `doctor`, and the prompt sets they read (shipped here as package data).

They drive a backend the way the chat does, through `runner`; nothing on the chat path (the session, the backends,
the TUI's app) imports this package.
"""
