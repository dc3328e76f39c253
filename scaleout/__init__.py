"""Pieces for running at scale, off the reading path.

    remote_engine.py  the engine interface over an OpenAI-compatible server (vLLM, llama.cpp) for the frozen modules
    sizing.py         the per-GPU memory estimate printed before training and by --dry-run
    distributed.py    what FSDP needs around generation and log-prob passes
"""
