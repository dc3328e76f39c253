"""The evolving memory M_t: what the agent has done so far, rendered into every prompt.

AgentFlow's modules never share a growing chat history. Each call is a fresh prompt rebuilt from the
query and the memory, so each planner turn is an independent single-turn sample (which is what lets
Flow-GRPO treat a multi-turn trajectory as T single-turn updates). The memory is the only state that
flows between turns:

    M_1 = {}                     (fresh for every rollout)
    M_{t+1} = M_t + {step t: tool, sub-goal, command, result, verdict}

Simplifications vs. the official code:
- The official memory is rendered as a Python dict repr with no compression and results truncated
  only at 100,000 characters, so prompts reach 18k tokens; it is also not reset between training
  questions, so stale steps leak into later prompts. Here a Memory is created per rollout and renders
  itself within a character budget: long tool results are cut in the middle, oldest steps first, and
  the text says what was cut. A 135M model with a 2k context needs this.
- The planner sees each step as what its tool found (render's `findings`), the verifier and the
  generator the whole step; officially every module reads the whole memory.

Test: python -m pytest -q tests/test_memory.py
"""

from dataclasses import dataclass, field


@dataclass
class Step:
    """One record of the memory: what one turn of the loop did."""

    index: int  # 1-based turn number t
    tool: str  # the tool the planner chose (as parsed; may be an unknown name)
    sub_goal: str  # the planner's sub-goal for this step
    command: str  # what the executor ran (code, query, or prompt)
    result: str  # the tool's output, or "Error: ..." for a failed step
    verdict: str = ""  # the verifier's verdict after this step: "STOP", "CONTINUE" or "" (not run yet)


def cut_middle(text: str, limit: int) -> str:
    """Keep the head and tail of `text` within `limit` characters and say how much was removed.

    >>> cut_middle("0123456789" * 10, 30)
    '0123[... 93 chars cut ...]789'
    """
    if len(text) <= limit:
        return text
    marker_size = len(f"[... {len(text)} chars cut ...]")
    keep = max(limit - marker_size, 0)
    head, tail = keep - keep // 2, keep // 2
    cut = len(text) - head - tail
    return text[:head] + f"[... {cut} chars cut ...]" + (text[len(text) - tail :] if tail else "")


@dataclass
class Memory:
    """The list of steps taken so far in one rollout."""

    steps: list[Step] = field(default_factory=list)

    def add(self, tool: str, sub_goal: str, command: str, result: str) -> Step:
        step = Step(len(self.steps) + 1, tool, sub_goal, command, result)
        self.steps.append(step)
        return step

    def render(self, budget: int = 1200, result_floor: int = 80, findings: bool = False) -> str:
        """Render the steps as prompt text of at most about `budget` characters.

        `findings` renders each step as one line, what its tool found ("Step 1: Fact_Lookup found:
        founder of X: Y"), without its sub-goal and command: the planner's view (modules.planner_prompt),
        in which the result, not an earlier sub-goal, is the text nearest to the sub-goal it writes.

        Results are the bulky part (a search returns passages, a program can print pages), so they are
        what gets cut: first every result is capped so that the whole fits, shortening the OLDEST step
        results first (the newest result is usually what the next decision depends on), never below
        `result_floor` characters; if the text is still too long, the oldest steps are summarised away.
        """
        if not self.steps:
            return "(no steps yet)"
        limits = [len(s.result) for s in self.steps]
        # 1. Shorten results, oldest first, until the rendering fits or each is at the floor.
        for i in range(len(self.steps)):
            excess = len(self._render(limits, findings=findings)) - budget
            if excess <= 0:
                break
            limits[i] = max(result_floor, limits[i] - excess)
        text = self._render(limits, findings=findings)
        # 2. Still too long (many steps): drop whole old steps and say so.
        dropped = 0
        while len(text) > budget and dropped < len(self.steps) - 1:
            dropped += 1
            text = f"[steps 1-{dropped} omitted]\n" + self._render(limits[dropped:], self.steps[dropped:], findings)
        return text

    def _render(self, limits, steps=None, findings=False) -> str:
        lines = []
        for s, limit in zip(steps or self.steps, limits):
            if findings:
                lines.append(f"Step {s.index}: {s.tool} found: {cut_middle(s.result, limit)}")
                continue
            lines.append(f"Step {s.index}: {s.tool} | Sub-goal: {s.sub_goal}")
            lines.append(f"Command: {cut_middle(s.command, 200)}")
            lines.append(f"Result: {cut_middle(s.result, limit)}")
        return "\n".join(lines)
