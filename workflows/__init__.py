"""Temporal workflows: ``RetirementWorkflow`` (one durable retirement per deployment)."""

from workflows.retirement import RetirementWorkflow, initial_search_attributes

__all__ = ["RetirementWorkflow", "initial_search_attributes"]
