"""The environment the agent acts in: what its tools reach and what its answers are scored against.

    corpus.py   the deterministic fictional world (articles + one- and two-hop questions, data/corpus.jsonl)
    search.py   BM25 over that corpus (Local_Search) and the MediaWiki API client (Wikipedia_Search)
    sandbox.py  where Python_Coder's snippets run: a supervised, isolated subprocess
                (sandbox_output.py: its bounded output and error line; reaping.py: no process survives it;
                isolation.py: the namespaces)
    tasks.py    data sets: the offline generated suites, the official benchmark files, user files
    scoring.py  the verifiable reward: answer extraction and rule-based scoring (and an optional LLM judge)
    game24.py   Game of 24: checking and solving expressions

None of this is Flow-GRPO; the method's files at the top level call into it.
"""
