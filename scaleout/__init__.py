"""Pieces for running at scale, off the reading path.

    remote_engine.py  the engine interface over an OpenAI-compatible server (vLLM, llama.cpp) for the frozen modules
    sizing.py         the per-GPU memory estimate printed before training and by --dry-run
    distributed.py    what FSDP needs: a plain generation model on the gathered weights, the same number of
                      micro-batches on every rank, gradient accumulation without no_sync
"""
