"""CPU speed-ups, off the reading path: drop-in replacements for plain code that give the same results.

    prefill.py        the prompt batch's KV cache without waste (shared prefixes once, no pads), preallocated
    sampler.py        sampling by inverse CDF inside `generate`, recording log-probs as it goes
    generate.py       HFEngine's fast generate_ids, built from the two above
    shared_prompt.py  the update computes a prompt prefix shared by several rows once (a group, a tool list)

Each is turned on by `--speedups` (on in the CPU presets) and tested equal to the plain path it replaces;
where one cannot apply (several processes, gradient checkpointing, a sliding-window cache) the plain
path runs.
"""
