"""Run bookkeeping, off the reading path: what a training run writes and how results are read back.

    checkpoint.py  atomic checkpoints, finding the last complete one, the resumable metrics log
    metrics.py     the per-step metrics line, reduced over processes, and a parameter digest
    report.py      Wilson intervals, paired differences, the static HTML trajectory viewer, the --compare table
"""
