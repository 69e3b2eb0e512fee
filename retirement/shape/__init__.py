"""A role's shape, read from its command line, and which members answer for it.

By concern: ``members`` (which members answer for a replica: the member-selection rule),
``rules`` (a replica's shape from its engine, role kind, size and wiring), ``wiring`` (what
a declared or a running command line and its environment wire), ``flags`` (an argument list
read as the engine's own parser reads it), ``engines`` (the engines' option tables) and
``load`` (whether a member counts its requests exactly).  Everything is re-exported here.
"""

from retirement.shape.engines import _TABLES, _Flag, _Kind
from retirement.shape.flags import FlagReading, parse_flags, read_flags
from retirement.shape.load import LOAD_TRACKING_SINCE, exact_load, vllm_api_servers
from retirement.shape.members import (
    MemberPod,
    Selection,
    answers,
    member_index,
    select_members,
    select_surplus,
)
from retirement.shape.rules import GROUP_SHAPES, Shape, ShapeReading, read_shape, shape_of
from retirement.shape.wiring import (
    REPLICA_SIZE_ENV,
    Wiring,
    declared_wiring,
    disagreement,
    expand,
    read_wiring,
    rendered_wiring,
)

__all__ = [
    "GROUP_SHAPES",
    "LOAD_TRACKING_SINCE",
    "REPLICA_SIZE_ENV",
    "_TABLES",
    "FlagReading",
    "MemberPod",
    "Selection",
    "Shape",
    "ShapeReading",
    "Wiring",
    "_Flag",
    "_Kind",
    "answers",
    "declared_wiring",
    "disagreement",
    "exact_load",
    "expand",
    "member_index",
    "parse_flags",
    "read_flags",
    "read_shape",
    "read_wiring",
    "rendered_wiring",
    "select_members",
    "select_surplus",
    "shape_of",
    "vllm_api_servers",
]
