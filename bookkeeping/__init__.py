"""Run bookkeeping, off the reading path: what a training run writes and how results are read back.

    checkpoint.py  atomic checkpoints, finding the last complete one, the resumable metrics log
    cli.py         the scripts' command lines: one flag per config field, --sizes, --sandbox
    metrics.py     the per-step metrics line, reduced over processes, a parameter digest, an evaluation's counts
    models.py      loading a model: the embedded SmolLM2 (its GGUF file converted once) or any Hugging Face one
    report.py      Wilson intervals, the static HTML trajectory viewer, a trajectory as text, the --compare table
    tool_choice.py P(the planner names each tool) per question kind and tool order: routing or position
"""
