"""``retire``: the operator's command line for retirements (status, abort, retry, start)."""
