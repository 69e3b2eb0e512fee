"""``python -m chaos.replay HISTORY.json...``: replay saved retirement histories against
the workflow code of this checkout and say, per history, whether it replays or where it
stops (a nondeterminism error names the event).  The fault campaign saves the histories
of the retirements it found wedged; this is how to look at them again."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from workflows.retirement import RetirementWorkflow


async def replay(path: Path) -> str:
    """Empty when the history at ``path`` replays; else the replay failure."""
    history = WorkflowHistory.from_json(path.stem, json.loads(path.read_text()))
    replayer = Replayer(workflows=[RetirementWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return "" if result.replay_failure is None else str(result.replay_failure)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.replay", description=__doc__)
    p.add_argument("histories", nargs="+", type=Path)
    a = p.parse_args(argv)
    failed = 0
    for path in a.histories:
        why = asyncio.run(replay(path))
        failed += bool(why)
        print(f"{path}: {'replays' if not why else why[:300]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
