"""Answers beside speed: a task set asked of every configuration's server after its passes, graded,
and the answers compared across configurations and across a patch's flag.

- :mod:`llmtrial.answers.tasks`: the task set (generated from a seed, or a JSONL file).
- :mod:`llmtrial.answers.grading`: the graders (exact, number, contains, regex).
- :mod:`llmtrial.answers.ask`: asking a running server, greedy, one answer per task.
- :mod:`llmtrial.answers.agreement`: identical answers per pair, the first differing token.
"""

__all__ = ["agreement", "ask", "grading", "tasks"]
