"""The worker process hosting RetirementWorkflow and its activities (``python -m worker``)."""
