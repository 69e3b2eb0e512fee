"""The pure decision core of a retirement: no I/O, deterministic, workflow-sandbox safe.

Phases and verdicts (``phases``), budgets (``budgets``), role shapes and member selection
(``shape``), drain reads (``readings``) and the drain rule (``drain``), retry tokens
(``retry``), removal intents (``intents``), and the pydantic models of every workflow and
activity input and output (``models``).
"""
